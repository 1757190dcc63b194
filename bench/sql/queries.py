"""The query mix of ``bench.sql``: the SQL++ statements, their PostgreSQL twins, the concrete
parameters each client cycles through, and how the two systems' answers are compared. Pure
logic (no cluster, no server): unit-tested in ``tests/bench/test_bench_sql.py``.

Cases (shardex indexes: ``#primary``, ``by_email`` on (email), ``by_city_age`` on
(address.city, age) partitioned by hash(META().id); PostgreSQL: the primary key on ``id`` and
the twin expression indexes):

* ``point key``: ``META().id = $1`` (a key lookup at the owner, no index);
* ``point email``: ``email = $1`` over ``by_email``, an email held by exactly one user;
* ``range order limit``: ``address.city = $1 AND age >= $2 ORDER BY age, META().id LIMIT 20``
  (non-covering: name is fetched), starts with at least 20 rows;
* ``group by city``: ``COUNT(*)`` and ``AVG(age)`` per city over every document;
* ``covering``: ``META().id`` and ``age`` for ``address.city = $1 AND age BETWEEN $2 AND $3``,
  ranges holding about 100 rows, answered from ``by_city_age`` alone.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.scan.queries import limit_starts, natural_ranges

KEYSPACE = "people"
RANGE_LIMIT = 20
COVERING_ROWS = 100
AVG_REL_TOL = 1e-9

POINT_KEY = "point key"
POINT_EMAIL = "point email"
RANGE = "range order limit"
GROUP = "group by city"
COVERING = "covering"
CASES = (POINT_KEY, POINT_EMAIL, RANGE, GROUP, COVERING)

# The large range of the exchange measurement: every user of one city, unordered.
LARGE_RANGE = "large range"

# Index DDL, all deferred and then built together by one BUILD INDEX.
SHARDEX_DDL = (
    f'CREATE PRIMARY INDEX ON {KEYSPACE} WITH {{"defer_build": true}}',
    f'CREATE INDEX by_email ON {KEYSPACE}(email) WITH {{"defer_build": true}}',
    f"CREATE INDEX by_city_age ON {KEYSPACE}(address.city, age) PARTITION BY HASH(META().id) "
    '   WITH {"defer_build": true, "num_partition": 4}',
)
SHARDEX_INDEXES = ("#primary", "by_email", "by_city_age")
PG_DDL = (
    "CREATE INDEX pg_email ON docs ((body->'email'))",
    "CREATE INDEX pg_city_age ON docs ((body->'address'->'city'), (body->'age'))",
)

SX_SQL: dict[str, str] = {
    POINT_KEY: f"SELECT name, email, age FROM {KEYSPACE} WHERE META().id = $1",
    POINT_EMAIL: f"SELECT META().id AS id, name, age FROM {KEYSPACE} WHERE email = $1",
    RANGE: (
        f"SELECT META().id AS id, name, age FROM {KEYSPACE} WHERE address.city = $1 "
        f"AND age >= $2 ORDER BY age, META().id LIMIT {RANGE_LIMIT}"
    ),
    GROUP: (
        f"SELECT address.city AS city, COUNT(*) AS n, AVG(age) AS avg_age FROM {KEYSPACE} "
        "WHERE address.city IS NOT MISSING GROUP BY address.city"
    ),
    COVERING: (
        f"SELECT META().id AS id, age FROM {KEYSPACE} WHERE address.city = $1 "
        "AND age BETWEEN $2 AND $3"
    ),
    LARGE_RANGE: (
        f"SELECT META().id AS id, name, age FROM {KEYSPACE} WHERE address.city = $1 AND age >= $2"
    ),
}
# The twins use exactly the indexed expressions, so PostgreSQL can use its indexes.
PG_SQL: dict[str, str] = {
    POINT_KEY: "SELECT body->'name', body->'email', body->'age' FROM docs WHERE id = %s",
    POINT_EMAIL: "SELECT id, body->'name', body->'age' FROM docs WHERE body->'email' = %s",
    RANGE: (
        "SELECT id, body->'name', body->'age' FROM docs WHERE body->'address'->'city' = %s "
        f"AND body->'age' >= %s ORDER BY body->'age', id LIMIT {RANGE_LIMIT}"
    ),
    GROUP: (
        "SELECT body->'address'->>'city', count(*), avg((body->>'age')::numeric)::float8 "
        "FROM docs GROUP BY 1"
    ),
    COVERING: (
        "SELECT id, body->'age' FROM docs WHERE body->'address'->'city' = %s "
        "AND body->'age' >= %s AND body->'age' <= %s"
    ),
}
# Which PostgreSQL parameters are jsonb values (wrapped in ``Jsonb`` by the client).
PG_JSONB: dict[str, tuple[bool, ...]] = {
    POINT_KEY: (False,),
    POINT_EMAIL: (True,),
    RANGE: (True, True),
    GROUP: (),
    COVERING: (True, True, True),
}
# The result columns of each case, in the order PostgreSQL returns them.
COLUMNS: dict[str, tuple[str, ...]] = {
    POINT_KEY: ("name", "email", "age"),
    POINT_EMAIL: ("id", "name", "age"),
    RANGE: ("id", "name", "age"),
    GROUP: ("city", "n", "avg_age"),
    COVERING: ("id", "age"),
}
ORDERED = {RANGE}  # cases whose row order is part of the answer


@dataclass(frozen=True)
class Query:
    """One concrete query of a case: its parameters (JSON values, the same for both systems)
    and the rows it must return."""

    case: str
    params: tuple[Any, ...]
    expected_rows: int


@dataclass
class DocStats:
    """What the parameter choice and the expected answers need from the documents."""

    docids: list[str]
    city_age: Counter[tuple[str, int]]
    emails: Counter[str]
    city_sum_age: Counter[str]

    @classmethod
    def of(cls, docs: Iterable[Mapping[str, Any]]) -> DocStats:
        docids: list[str] = []
        counts: Counter[tuple[str, int]] = Counter()
        emails: Counter[str] = Counter()
        sums: Counter[str] = Counter()
        for d in docs:
            docids.append(d["id"])
            city = d["address"]["city"]
            counts[(city, d["age"])] += 1
            emails[d["email"]] += 1
            sums[city] += d["age"]
        return cls(docids, counts, emails, sums)

    def groups(self) -> dict[str, tuple[int, float]]:
        """The exact GROUP BY answer: city -> (count, average age)."""
        n: Counter[str] = Counter()
        for (city, _), k in self.city_age.items():
            n[city] += k
        return {c: (n[c], self.city_sum_age[c] / n[c]) for c in n}

    def city_rows(self, city: str, lo: int) -> int:
        return sum(k for (c, a), k in self.city_age.items() if c == city and a >= lo)

    def largest_city(self) -> str:
        n: Counter[str] = Counter()
        for (city, _), k in self.city_age.items():
            n[city] += k
        return max(sorted(n), key=lambda c: n[c])


def unique_emails(emails: Mapping[str, int], k: int, seed: int = 3) -> list[str]:
    """Up to ``k`` emails held by exactly one document (a seeded sample, sorted)."""
    once = sorted(e for e, n in emails.items() if n == 1)
    rng = random.Random(seed)
    return sorted(rng.sample(once, min(k, len(once))))


def build_queries(stats: DocStats, k: int = 32, seed: int = 5) -> dict[str, list[Query]]:
    """Every case's concrete queries (at most ``k`` each; one for the GROUP BY)."""
    rng = random.Random(seed)
    keys = sorted(rng.sample(stats.docids, min(k, len(stats.docids))))
    groups = stats.groups()
    return {
        POINT_KEY: [Query(POINT_KEY, (d,), 1) for d in keys],
        POINT_EMAIL: [Query(POINT_EMAIL, (e,), 1) for e in unique_emails(stats.emails, k)],
        RANGE: [
            Query(RANGE, (c, lo), RANGE_LIMIT)
            for c, lo in limit_starts(stats.city_age, limit=RANGE_LIMIT, k=k)
        ],
        GROUP: [Query(GROUP, (), len(groups))],
        COVERING: [
            Query(COVERING, (c, lo, hi), n)
            for c, lo, hi, n in natural_ranges(stats.city_age, target=COVERING_ROWS, k=k)
        ],
    }


def large_range_query(stats: DocStats) -> Query:
    city = stats.largest_city()
    return Query(LARGE_RANGE, (city, 0), stats.city_rows(city, 0))


# --- answers ---------------------------------------------------------------------------------


def shardex_rows(
    case: str,
    rows: Sequence[Mapping[str, Any]],
    columns: Mapping[str, tuple[str, ...]] = COLUMNS,
) -> list[tuple[Any, ...]]:
    """shardex result dicts as tuples in the case's column order (a MISSING field: None)."""
    cols = columns[case]
    return [tuple(r.get(c) for c in cols) for r in rows]


def canonical(case: str, rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """An answer in comparable form: tuples, sorted unless the case's order is its answer;
    GROUP BY averages as floats."""
    out = [tuple(r) for r in rows]
    if case == GROUP:
        out = [(c, int(n), float(avg)) for c, n, avg in out]
    if case not in ORDERED:
        out.sort(key=repr)
    return out


def differences(
    case: str, a: Sequence[tuple[Any, ...]], b: Sequence[tuple[Any, ...]]
) -> str | None:
    """None when two canonical answers agree (averages within ``AVG_REL_TOL``), else what
    differs first."""
    if len(a) != len(b):
        return f"{len(a)} rows vs {len(b)} rows"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if case == GROUP:
            same = x[:2] == y[:2] and abs(x[2] - y[2]) <= AVG_REL_TOL * max(1.0, abs(y[2]))
        else:
            same = x == y
        if not same:
            return f"row {i}: {x!r} vs {y!r}"
    return None


def expected_group_rows(stats: DocStats) -> list[tuple[Any, ...]]:
    return canonical(GROUP, [(c, n, avg) for c, (n, avg) in stats.groups().items()])
