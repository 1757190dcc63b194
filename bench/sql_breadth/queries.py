"""The cases of ``bench.sql_breadth``: the SQL++ statements, their PostgreSQL twins, the
concrete parameters and the rows each must return, and how answers are compared. Pure logic:
unit-tested in ``tests/bench/test_bench_sql_breadth.py``.

shardex's indexes: ``orders(customer_id)``, ``orders(status, date)``, ``orders(DISTINCT
ARRAY l.sku FOR l IN lines END)`` and ``customers(region)``; the two that serve the scans of
many rows partitioned by ``HASH(META().id)`` in 4 (as ``bench.sql``'s range index), so
their leaves run on several nodes and stream over exchanges. PostgreSQL's twins: the
``jsonb`` tables ``orders`` and ``customers`` (primary key on the id) with expression indexes
on the same fields and a GIN index (``jsonb_path_ops``) on ``body->'lines'`` serving the
array cases through containment (``lines @> '[{"sku": ...}]'``): the same document model on
both sides, no normalised lines table.

* ``nl join``: the orders of the customers of one region, an ANSI join ``ON o.customer_id =
  META(c).id`` (an index nested loop: region index outside, ``orders(customer_id)`` probed);
* ``index join``: the same rows as an index join ``ON KEY o.customer_id FOR c``;
* ``hash join``: orders of one status since a date (a tenth of them) joined with every
  customer ``USE HASH(BUILD)``, orders and their total per region, ORDER BY region;
* ``unnest``: the lines of one SKU, ``orders UNNEST lines WHERE l.sku = $1``;
* ``any satisfies``: the orders holding one SKU, ``ANY l IN lines SATISFIES l.sku = $1 END``;
* ``correlated subquery``: each customer of a region with how many of its orders have a
  status, ``(SELECT RAW COUNT(*) FROM orders o USE KEYS c.order_ids WHERE ...)[0]``
  (PostgreSQL: a correlated subquery over ``orders(customer_id)``);
* ``window``: ``ROW_NUMBER() OVER (PARTITION BY customer_id ORDER BY date, id)`` over the
  orders of one status in a date window.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from bench.sql.queries import Query
from bench.sql_breadth.data import DAYS, FIRST_DAY, STATUSES, Stats

NL_JOIN = "nl join"
INDEX_JOIN = "index join"
HASH_JOIN = "hash join"
UNNEST = "unnest"
ANY = "any satisfies"
SUBQUERY = "correlated subquery"
WINDOW = "window"
CASES = (NL_JOIN, INDEX_JOIN, HASH_JOIN, UNNEST, ANY, SUBQUERY, WINDOW)
ORDERED = {HASH_JOIN}  # cases whose row order is part of the answer
WINDOW_ROWS = 400  # about this many orders in a window case's date range
HASH_SINCE_DAY = DAYS // 2  # the hash join's orders: one status in the second half

SHARDEX_DDL = (
    'CREATE INDEX by_customer ON orders(customer_id) WITH {"defer_build": true}',
    "CREATE INDEX by_status_date ON orders(status, date) PARTITION BY HASH(META().id) "
    'WITH {"defer_build": true, "num_partition": 4}',
    "CREATE INDEX by_sku ON orders(DISTINCT ARRAY l.sku FOR l IN lines END) "
    'PARTITION BY HASH(META().id) WITH {"defer_build": true, "num_partition": 4}',
    'CREATE INDEX by_region ON customers(region) WITH {"defer_build": true}',
)
PG_DDL = {
    "orders": (
        "CREATE INDEX pg_customer ON orders ((body->>'customer_id'))",
        "CREATE INDEX pg_status_date ON orders ((body->'status'), (body->'date'))",
        "CREATE INDEX pg_lines ON orders USING GIN ((body->'lines') jsonb_path_ops)",
    ),
    "customers": ("CREATE INDEX pg_region ON customers ((body->'region'))",),
}

_REGION_ORDERS = "META(c).id AS cid, META(o).id AS oid, o.total AS total FROM customers c JOIN"
SX_SQL: dict[str, str] = {
    NL_JOIN: f"SELECT {_REGION_ORDERS} orders o ON o.customer_id = META(c).id WHERE c.region = $1",
    INDEX_JOIN: f"SELECT {_REGION_ORDERS} orders o ON KEY o.customer_id FOR c WHERE c.region = $1",
    HASH_JOIN: (
        "SELECT c.region AS region, COUNT(*) AS n, SUM(o.total) AS total FROM orders o "
        "JOIN customers c USE HASH(BUILD) ON META(c).id = o.customer_id "
        "WHERE o.status = $1 AND o.date >= $2 AND c.region IS NOT MISSING "
        "GROUP BY c.region ORDER BY c.region"
    ),
    UNNEST: (
        "SELECT META(o).id AS oid, l.qty AS qty, l.price AS price FROM orders o "
        "UNNEST o.lines AS l WHERE l.sku = $1"
    ),
    ANY: (
        "SELECT META(o).id AS oid, o.customer_id AS cid FROM orders o "
        "WHERE ANY l IN o.lines SATISFIES l.sku = $1 END"
    ),
    SUBQUERY: (
        "SELECT META(c).id AS cid, (SELECT RAW COUNT(*) FROM orders o USE KEYS c.order_ids "
        "WHERE o.status = $2)[0] AS n FROM customers c WHERE c.region = $1"
    ),
    WINDOW: (
        "SELECT META(o).id AS oid, o.customer_id AS cid, ROW_NUMBER() OVER "
        "(PARTITION BY o.customer_id ORDER BY o.date, META(o).id) AS rn FROM orders o "
        "WHERE o.status = $1 AND o.date BETWEEN $2 AND $3"
    ),
}
_PG_REGION_ORDERS = (
    "SELECT c.id, o.id, o.body->'total' FROM customers c "
    "JOIN orders o ON o.body->>'customer_id' = c.id WHERE c.body->'region' = %s"
)
PG_SQL: dict[str, str] = {
    NL_JOIN: _PG_REGION_ORDERS,
    INDEX_JOIN: _PG_REGION_ORDERS,
    HASH_JOIN: (
        "SELECT c.body->>'region', count(*), sum((o.body->>'total')::bigint)::bigint "
        "FROM orders o JOIN customers c ON c.id = o.body->>'customer_id' "
        "WHERE o.body->'status' = %s AND o.body->'date' >= %s GROUP BY 1 ORDER BY 1"
    ),
    UNNEST: (
        "SELECT o.id, l->'qty', l->'price' FROM orders o "
        "CROSS JOIN LATERAL jsonb_array_elements(o.body->'lines') AS l "
        "WHERE o.body->'lines' @> %s AND l->>'sku' = %s"
    ),
    ANY: "SELECT id, body->>'customer_id' FROM orders WHERE body->'lines' @> %s",
    SUBQUERY: (
        "SELECT c.id, (SELECT count(*) FROM orders o WHERE o.body->>'customer_id' = c.id "
        "AND o.body->'status' = %s) FROM customers c WHERE c.body->'region' = %s"
    ),
    WINDOW: (
        "SELECT id, body->>'customer_id', row_number() OVER (PARTITION BY "
        "body->>'customer_id' ORDER BY body->>'date', id) FROM orders "
        "WHERE body->'status' = %s AND body->'date' >= %s AND body->'date' <= %s"
    ),
}
COLUMNS: dict[str, tuple[str, ...]] = {
    NL_JOIN: ("cid", "oid", "total"),
    INDEX_JOIN: ("cid", "oid", "total"),
    HASH_JOIN: ("region", "n", "total"),
    UNNEST: ("oid", "qty", "price"),
    ANY: ("oid", "cid"),
    SUBQUERY: ("cid", "n"),
    WINDOW: ("oid", "cid", "rn"),
}
# The side statements of the hash join as run alone: the exchanges its inputs stream over.
HASH_BUILD_SIDE = "hash join build side"
HASH_PROBE_SIDE = "hash join probe side"
SIDE_SQL: dict[str, str] = {
    HASH_BUILD_SIDE: (
        "SELECT RAW [META(c).id, c] FROM customers AS c WHERE c.region IS NOT MISSING"
    ),
    HASH_PROBE_SIDE: (
        "SELECT RAW [META(o).id, o] FROM orders AS o WHERE o.status = $1 AND o.date >= $2"
    ),
}


def pg_args(case: str, params: Sequence[Any]) -> list[tuple[Any, bool]]:
    """PostgreSQL's parameters of a case from the shardex ones: (value, is jsonb) in the
    twin's order. The array cases match by containment, ``[{"sku": s}]``."""
    if case in (NL_JOIN, INDEX_JOIN):
        return [(params[0], True)]
    if case in (HASH_JOIN, WINDOW):
        return [(p, True) for p in params]
    if case == UNNEST:
        return [([{"sku": params[0]}], True), (params[0], False)]
    if case == ANY:
        return [([{"sku": params[0]}], True)]
    if case == SUBQUERY:
        region, status = params
        return [(status, True), (region, True)]
    raise ValueError(f"unknown case {case!r}")


def _day(k: int) -> str:
    from datetime import timedelta

    return (FIRST_DAY + timedelta(days=k)).isoformat()


def build_queries(stats: Stats, k: int = 16, seed: int = 5) -> dict[str, list[Query]]:
    """Every case's concrete queries (at most ``k`` each), with the rows each returns."""
    rng = random.Random(seed)
    regions = sorted(set(stats.region_of.values()))
    some_regions = sorted(rng.sample(regions, min(k, len(regions))))
    skus = sorted(rng.sample(sorted(stats.sku_lines), min(k, len(stats.sku_lines))))
    n_orders = sum(stats.status_date.values())
    # Days in a window holding about WINDOW_ROWS orders of one status.
    days = max(1, round(WINDOW_ROWS * DAYS * len(STATUSES) / max(1, n_orders)))
    windows = [(rng.choice(STATUSES), rng.randrange(max(1, DAYS - days)), days) for _ in range(k)]
    since = _day(HASH_SINCE_DAY)
    by_region = [stats.region_orders(r) for r in some_regions]
    return {
        NL_JOIN: [Query(NL_JOIN, (r,), n) for r, n in zip(some_regions, by_region, strict=True)],
        INDEX_JOIN: [
            Query(INDEX_JOIN, (r,), n) for r, n in zip(some_regions, by_region, strict=True)
        ],
        HASH_JOIN: [
            Query(HASH_JOIN, (s, since), stats.regions_with_orders(s, since)) for s in STATUSES
        ],
        UNNEST: [Query(UNNEST, (s,), stats.sku_lines[s]) for s in skus],
        ANY: [Query(ANY, (s,), stats.sku_orders[s]) for s in skus],
        SUBQUERY: [
            Query(SUBQUERY, (r, STATUSES[i % len(STATUSES)]), len(stats.customers_in(r)))
            for i, r in enumerate(some_regions)
        ],
        WINDOW: [
            Query(
                WINDOW,
                (s, _day(lo), _day(lo + d - 1)),
                stats.orders_between(s, _day(lo), _day(lo + d - 1)),
            )
            for s, lo, d in windows
        ],
    }


def side_queries(stats: Stats) -> list[Query]:
    """The hash join's two inputs as statements of their own (the first status)."""
    since = _day(HASH_SINCE_DAY)
    status = STATUSES[0]
    probe = sum(n for (s, d), n in stats.status_date.items() if s == status and d >= since)
    return [
        Query(HASH_BUILD_SIDE, (), len(stats.region_of)),
        Query(HASH_PROBE_SIDE, (status, since), probe),
    ]


# --- answers ---------------------------------------------------------------------------------


def _value(v: Any) -> Any:
    """Numbers in one form across the systems: an integral float or Decimal as an int."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    try:
        f = float(v)
    except (TypeError, ValueError):
        return v
    return int(f) if f.is_integer() else f


def canonical(case: str, rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """An answer in comparable form: tuples of normalised values, sorted (a multiset)
    unless the case's order is its answer."""
    out = [tuple(_value(v) for v in r) for r in rows]
    if case not in ORDERED:
        out.sort(key=repr)
    return out
