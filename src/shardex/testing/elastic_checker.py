"""The invariant of paginated scans under elasticity, checked once for every test.

"A complete paginated scan returns every expected row exactly once (and, for an ordered
scan, in key order across pages), whatever migrated while it ran." Callers pass the pages
as returned and the rows a complete scan must return.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from shardex.scan.paging_wire import PageRow


def check_paginated_scan(
    pages: Sequence[Sequence[PageRow]],
    expected: Iterable[tuple[bytes, int, Any]],
    *,
    ordered: bool,
    context: str = "",
) -> None:
    rows = [r for page in pages for r in page]
    got = Counter((r.key, r.partition) for r in rows)
    want = Counter((k, p) for k, p, _ in expected)
    where = f" ({context})" if context else ""
    doubled = sorted(k for k, n in got.items() if n > 1)
    lost = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    problems = []
    if lost:
        problems.append(f"{len(lost)} row(s) lost, first {_show(lost[:5])}")
    if doubled:
        problems.append(f"{len(doubled)} row(s) duplicated, first {_show(doubled[:5])}")
    if extra:
        problems.append(f"{len(extra)} row(s) not expected, first {_show(extra[:5])}")
    if ordered:
        for i in range(1, len(rows)):
            if rows[i].key <= rows[i - 1].key:
                problems.append(
                    f"ordered scan out of order at row {i}: {rows[i - 1].key!r} then "
                    f"{rows[i].key!r}"
                )
                break
    if problems:
        raise AssertionError(f"paginated scan is not exact{where}: " + "; ".join(problems))


def _show(items: list[tuple[bytes, int]]) -> str:
    return ", ".join(f"{k.hex()}@P{p}" for k, p in items)
