"""The demo's verdicts, as pure functions of rows: what a scan had to return and what it did.

``scans.py`` (write while scanning) and ``elastic.py`` (paginated scans during a rebalance)
print these verdicts; keeping them free of I/O lets ``tests/unit/demo/test_demo_checks.py`` pin
them down, so a demo that prints "True" means the rows were really compared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

__all__ = ["Comparison", "Visibility", "check_visibility", "compare_rows", "row_key"]

_enc = msgspec.json.Encoder()


def row_key(row: Mapping[str, Any]) -> tuple[bytes, str]:
    """A scan row ``{"docid", "key"}`` as a hashable value (JSON of the key, docid): two rows
    are the same entry exactly when both parts are equal."""
    return _enc.encode(row.get("key")), row["docid"]


@dataclass(frozen=True)
class Comparison:
    """Rows read against rows expected, as multisets: nothing lost, nothing read twice,
    nothing that should not be there."""

    read: int
    expected: int
    lost: list[Any] = field(default_factory=list)
    doubled: list[Any] = field(default_factory=list)
    unexpected: list[Any] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (self.lost or self.doubled or self.unexpected)

    def describe(self, shown: int = 5) -> str:
        text = (
            f"rows read == rows expected: {self.equal} "
            f"({self.read:,} read, {self.expected:,} expected)"
        )
        for name, items in (
            ("lost", self.lost),
            ("doubled", self.doubled),
            ("unexpected", self.unexpected),
        ):
            if items:
                text += f"; {len(items)} {name}, e.g. {items[:shown]}"
        return text


def compare_rows(read: Iterable[Any], expected: Iterable[Any]) -> Comparison:
    """Compare two collections of hashable rows (e.g. ``row_key`` values or docids).
    ``lost``: rows read less often than expected; ``doubled``: more often (a row a scan
    returned twice); ``unexpected``: rows that should not be there at all."""
    got, want = Counter(read), Counter(expected)
    lost = sorted(r for r in want if got[r] < want[r])
    doubled = sorted(r for r in got if r in want and got[r] > want[r])
    unexpected = sorted(r for r in got if r not in want)
    return Comparison(
        read=sum(got.values()),
        expected=sum(want.values()),
        lost=lost,
        doubled=doubled,
        unexpected=unexpected,
    )


@dataclass(frozen=True)
class Visibility:
    """A request_plus (or at_plus) scan against the writes acknowledged before it started.

    ``must_see``: writes acknowledged before the scan (docid -> the key written); each must be
    in the scan with exactly that key. ``in_flight_seen``: rows of writes issued but not yet
    acknowledged when the scan started (allowed, not required)."""

    must_see: int
    seen: int
    in_flight_seen: int
    missing: list[str] = field(default_factory=list)
    wrong_key: list[tuple[str, Any, Any]] = field(default_factory=list)  # docid, want, got
    unexpected: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.wrong_key or self.unexpected or self.doubled)


def check_visibility(
    rows: Iterable[Mapping[str, Any]],
    must_see: Mapping[str, Any],
    may_see: Iterable[str] = (),
) -> Visibility:
    """``rows``: the scan's ``{"docid", "key"}`` rows over a span only the writer's documents
    fall in. Every acknowledged write must be there with its key; a row for a document the
    writer had only issued is allowed; anything else is unexpected."""
    allowed = set(may_see)
    counts: Counter[str] = Counter()
    keys: dict[str, Any] = {}
    for row in rows:
        counts[row["docid"]] += 1
        keys[row["docid"]] = row.get("key")
    missing = sorted(d for d in must_see if d not in counts)
    wrong = sorted(
        (d, must_see[d], keys[d]) for d in must_see if d in keys and keys[d] != must_see[d]
    )
    unexpected = sorted(d for d in counts if d not in must_see and d not in allowed)
    doubled = sorted(d for d, n in counts.items() if n > 1)
    return Visibility(
        must_see=len(must_see),
        seen=sum(1 for d in must_see if d in counts),
        in_flight_seen=sum(1 for d in counts if d not in must_see and d in allowed),
        missing=missing,
        wrong_key=wrong,
        unexpected=unexpected,
        doubled=doubled,
    )
