"""The names a statement's WITH clause binds, while the statement is being bound.

A WITH name is evaluated once per statement, before its query runs, and travels with the
statement's parameters (under ``cte_param(name)``: no user parameter has that name), so
every engine and every fragment reads it the way it reads ``$name``. Binding turns a free
reference to the name into that parameter (``reference``): a name the query binds itself
(a FROM alias, LET, UNNEST or comprehension variable) shadows it, as scopes do. A WITH
inside a subquery expression has no statement to be valued once for: its terms are inlined
where they are read (``inlined``), as any subquery there is evaluated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar

from shardex.core.expr import Expr, Param

__all__ = ["cte_param", "inlined", "inlining", "is_cte_param", "reference", "visible"]

_PREFIX = "\x00with."
_VISIBLE: ContextVar[dict[str, Expr]] = ContextVar("cte_names", default={})  # noqa: B039


def cte_param(name: str) -> str:
    return _PREFIX + name


def is_cte_param(name: str) -> bool:
    return name.startswith(_PREFIX)


def reference(name: str) -> Expr | None:
    """The parameter a free ``name`` reads, when a WITH clause being bound names it."""
    return _VISIBLE.get().get(name)


def inlining() -> bool:
    """Whether a WITH of a subquery expression is being bound: its names are inlined, so a
    query text read here does not stand on its own (``BoundSubquery.standalone``)."""
    return any(not isinstance(e, Param) for e in _VISIBLE.get().values())


def visible(names: Iterable[str]) -> contextlib.AbstractContextManager[None]:
    """Binding within: ``names`` are WITH names (added to any already visible)."""
    return inlined({n: Param(cte_param(n)) for n in names})


@contextlib.contextmanager
def inlined(exprs: Mapping[str, Expr]) -> Iterator[None]:
    """Binding within: each name of ``exprs`` (a WITH inside a subquery) stands for its
    bound expression, evaluated where the name is read."""
    token = _VISIBLE.set({**_VISIBLE.get(), **exprs})
    try:
        yield
    finally:
        _VISIBLE.reset(token)
