"""A module never imports its own package: ``from . import x`` (or ``from shardex.pkg import``
inside ``shardex.pkg``) is an import of the package's ``__init__``, which imports its
modules, so the two form a cycle. import-linter's acyclic contract (``make lint``) checks
cycles between siblings, not this one; this test does."""

from __future__ import annotations

import ast
from pathlib import Path

import shardex

SRC = Path(shardex.__file__).parent


def _own_package_imports(path: Path) -> list[str]:
    package = ".".join(("shardex", *path.relative_to(SRC).parent.parts))
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if (node.level == 1 and node.module is None) or (
            node.level == 0 and node.module == package
        ):
            found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_no_module_imports_its_own_package() -> None:
    offenders = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "__init__.py"
        for hit in _own_package_imports(path)
    ]
    assert not offenders, "import the sibling module directly instead: " + ", ".join(offenders)


def test_the_check_sees_the_forms_it_names(tmp_path: Path) -> None:
    pkg = SRC / "core" / "expr"
    probe = pkg / "_probe_for_test.py"
    probe.write_text("from . import ops\nfrom shardex.core.expr import parse_expression\n")
    try:
        assert len(_own_package_imports(probe)) == 2
    finally:
        probe.unlink()
