"""The 100-row queries of ``bench.scan``: which spans return 100 rows, as shardex scans and as
the PostgreSQL twin queries. Pure logic (no cluster, no server): unit-tested in
``tests/bench/test_bench_scan.py``.

Three cases, each a list of concrete queries a client cycles through (different spans on
every call, so neither system answers one hot range from a cache line):

* ``range ~100`` on ``by_city_age``: ``city = C AND age BETWEEN lo AND hi``, a range that
  naturally holds about 100 rows (the (city, age) windows whose counts come closest to 100);
* ``limit 100`` on ``by_city_age``: ``city = C AND age >= lo``, ordered, ``LIMIT 100``, over
  cities/ages with at least 100 rows from ``lo`` on: exactly 100 rows;
* ``limit 100, 1 slice`` on ``by_email`` (unpartitioned, WHERE status = 'active'):
  ``email >= E`` ordered ``LIMIT 100``: exactly 100 rows, no scatter-gather.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TARGET_ROWS = 100

CITY_AGE = "by_city_age"
EMAIL = "by_email"

RANGE = "range ~100"
LIMIT = "limit 100"
LIMIT_ONE_SLICE = "limit 100, 1 slice"
CASES = (RANGE, LIMIT, LIMIT_ONE_SLICE)

# The PostgreSQL twins: expression indexes on the jsonb column (``bench.common.dataset.INDEXES``);
# the WHERE clauses use exactly the indexed expressions so the planner can use the index.
PG_CITY_AGE_COLS = "id, body->'address'->'city', body->'age'"
PG_SQL = {
    RANGE: (
        f"SELECT {PG_CITY_AGE_COLS} FROM docs WHERE body->'address'->'city' = %s "
        "AND body->'age' >= %s AND body->'age' <= %s "
        "ORDER BY body->'address'->'city', body->'age'"
    ),
    LIMIT: (
        f"SELECT {PG_CITY_AGE_COLS} FROM docs WHERE body->'address'->'city' = %s "
        "AND body->'age' >= %s ORDER BY body->'address'->'city', body->'age' LIMIT 100"
    ),
    LIMIT_ONE_SLICE: (
        "SELECT id, body->'email' FROM docs WHERE body->>'status' = 'active' "
        "AND body->'email' >= %s ORDER BY body->'email' LIMIT 100"
    ),
}


# Session settings per case, so PostgreSQL runs its best plan. For ``email >= E ... LIMIT
# 100`` that is an index scan in index order (stopped after 100 rows), but its estimate of
# the jsonb range (7 rows) made the planner pick a bitmap scan of the whole range plus a
# top-N sort: 32 ms instead of 4.5 ms at 20k documents. The (city, age) cases keep the
# planner's own choice (a bitmap scan of ~100 rows, then a sort of those).
PG_SETTINGS: dict[str, tuple[str, ...]] = {
    RANGE: (),
    LIMIT: (),
    LIMIT_ONE_SLICE: ("SET enable_bitmapscan = off",),
}


@dataclass(frozen=True)
class Query:
    """One concrete query: shardex ``scan`` arguments, PostgreSQL parameters (as JSON values,
    wrapped in ``Jsonb`` by the client) and the rows it must return."""

    case: str
    index: str
    spans: list[dict[str, Any]]
    limit: int | None
    pg_params: tuple[Any, ...]
    expected_rows: int


@dataclass
class KeyStats:
    """What the span choice needs from the documents: (city, age) counts and the sorted
    emails of active users."""

    city_age: Counter[tuple[str, int]]
    active_emails: list[str]

    @classmethod
    def of(cls, docs: Iterable[Mapping[str, Any]]) -> KeyStats:
        counts: Counter[tuple[str, int]] = Counter()
        emails: list[str] = []
        for d in docs:
            counts[(d["address"]["city"], d["age"])] += 1
            if d.get("status") == "active":
                emails.append(d["email"])
        emails.sort()
        return cls(counts, emails)


def natural_ranges(
    counts: Mapping[tuple[str, int], int], target: int = TARGET_ROWS, k: int = 32
) -> list[tuple[str, int, int, int]]:
    """Up to ``k`` (city, lo, hi, rows) with ``rows`` = documents with that city and
    ``lo <= age <= hi``: per start age the window closest to ``target``, best first (ties:
    city, lo). Every window is contiguous in the ages present, so ``rows`` is exact."""
    by_city: dict[str, list[tuple[int, int]]] = {}
    for (city, age), n in counts.items():
        by_city.setdefault(city, []).append((age, n))
    found: dict[tuple[str, int], tuple[int, int]] = {}
    for city, ages in by_city.items():
        ages.sort()
        for i in range(len(ages)):
            total = 0
            for j in range(i, len(ages)):
                before = total
                total += ages[j][1]
                if total >= target:
                    # Either stop just before crossing the target or just after.
                    if j > i and target - before < total - target:
                        found[(city, ages[i][0])] = (ages[j - 1][0], before)
                    else:
                        found[(city, ages[i][0])] = (ages[j][0], total)
                    break
            else:
                found[(city, ages[i][0])] = (ages[-1][0], total)
    ranked = sorted(
        ((city, lo, hi, n) for (city, lo), (hi, n) in found.items()),
        key=lambda r: (abs(r[3] - target), r[0], r[1]),
    )
    return ranked[:k]


def limit_starts(
    counts: Mapping[tuple[str, int], int], limit: int = TARGET_ROWS, k: int = 32, seed: int = 1
) -> list[tuple[str, int]]:
    """Up to ``k`` (city, lo) with at least ``limit`` documents of that city aged ``>= lo``
    (so ``LIMIT limit`` returns exactly ``limit`` rows), a seeded sample of all of them."""
    by_city: dict[str, list[tuple[int, int]]] = {}
    for (city, age), n in counts.items():
        by_city.setdefault(city, []).append((age, n))
    ok: list[tuple[str, int]] = []
    for city, ages in sorted(by_city.items()):
        ages.sort()
        remaining = sum(n for _, n in ages)
        for age, n in ages:
            if remaining >= limit:
                ok.append((city, age))
            remaining -= n
    rng = random.Random(seed)
    return sorted(rng.sample(ok, min(k, len(ok))))


def email_starts(
    emails: Sequence[str], limit: int = TARGET_ROWS, k: int = 32, seed: int = 2
) -> list[str]:
    """Up to ``k`` emails E with at least ``limit`` sorted emails ``>= E``. Duplicates are
    fine: ``>= E`` starts at E's first copy (``bisect_left``)."""
    if len(emails) < limit:
        return []
    rng = random.Random(seed)
    picks = {emails[rng.randrange(len(emails) - limit + 1)] for _ in range(k)}
    return sorted(e for e in picks if len(emails) - bisect.bisect_left(emails, e) >= limit)


def build_queries(stats: KeyStats, k: int = 32) -> dict[str, list[Query]]:
    """The three cases' queries (``k`` each at most)."""
    ranges = [
        Query(
            RANGE,
            CITY_AGE,
            [{"low": [c, lo], "high": [c, hi], "inclusion": "both"}],
            None,
            (c, lo, hi),
            n,
        )
        for c, lo, hi, n in natural_ranges(stats.city_age, k=k)
    ]
    limits = [
        Query(
            LIMIT,
            CITY_AGE,
            [{"low": [c, lo], "high": [c], "inclusion": "both"}],
            TARGET_ROWS,
            (c, lo),
            TARGET_ROWS,
        )
        for c, lo in limit_starts(stats.city_age, k=k)
    ]
    emails = [
        Query(LIMIT_ONE_SLICE, EMAIL, [{"low": [e]}], TARGET_ROWS, (e,), TARGET_ROWS)
        for e in email_starts(stats.active_emails, k=k)
    ]
    return {RANGE: ranges, LIMIT: limits, LIMIT_ONE_SLICE: emails}


def ratio(shardex: float | None, postgres: float | None) -> float | None:
    """shardex / PostgreSQL, rounded; None when either is missing or PostgreSQL is 0."""
    if shardex is None or postgres is None or postgres == 0:
        return None
    return round(shardex / postgres, 2)
