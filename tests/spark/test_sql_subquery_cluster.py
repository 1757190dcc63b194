"""Subqueries over whole keyspaces and with joins on a real 3-node cluster (the shared one,
with the Spark pipeline maintaining the indexes), every result compared with ``LocalEngine``
over the same documents; their inputs read at the statement's scan consistency; and the
initiator's INTERSECT / EXCEPT and window operators spilling within a tiny memory budget
to the result the default budget gives, their spill directories gone afterwards."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from shardex.client import Client
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.memory import MIN_QUERY_MEMORY, SPILL_DIR
from shardex.sql.local import LocalEngine

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster

ORDERS, CUSTOMERS = "sq_orders", "sq_customers"
INDEXES = [
    f"CREATE PRIMARY INDEX ON {ORDERS}",
    f"CREATE PRIMARY INDEX ON {CUSTOMERS}",
    f"CREATE INDEX by_cid ON {ORDERS}(cid) PARTITION BY HASH(META().id)"
    ' WITH {"num_partition": 3}',
]


@dataclass
class Env:
    path: Path
    client: Client
    ref: LocalEngine

    def check(self, sql: str, params: Any = None, **kw: Any) -> list[Any]:
        got = list(self.client.query(sql, params, **kw))
        want = self.ref.query(sql, params)
        assert want, sql  # an empty result would prove little
        if "ORDER BY" in sql:
            assert got == want, sql
        else:
            assert sorted(map(_canon, got)) == sorted(map(_canon, want)), sql
        return got


def _canon(v: Any) -> bytes:
    return msgspec.json.encode(v, order="sorted")


@pytest.fixture(scope="module")
def env(shared_cluster: SharedCluster) -> Iterator[Env]:
    rng = random.Random(5)
    customers = {
        f"c{i:03d}": {"id": i, "name": f"n{i % 17}", "vip": i % 4 == 0, "city": f"x{i % 5}"}
        for i in range(60)
    }
    orders = {
        f"o{i:04d}": {
            "n": i,
            "cid": rng.randrange(70),
            "qty": rng.randrange(6),
            "tags": [f"n{rng.randrange(20)}" for _ in range(2)],
        }
        for i in range(300)
    }
    ref = LocalEngine()
    client = shared_cluster.client
    with shared_cluster.keyspace(ORDERS), shared_cluster.keyspace(CUSTOMERS):
        for ks, docs in ((ORDERS, orders), (CUSTOMERS, customers)):
            ref.create_keyspace(ks)
            ref.keyspaces[ks].update(docs)
            for docid, doc in docs.items():
                client.keyspace(ks).upsert(docid, doc)
        for ddl in INDEXES:
            list(client.query(ddl))
            ref.execute(ddl)
        for ks, name in ((ORDERS, "#primary"), (CUSTOMERS, "#primary"), (ORDERS, "by_cid")):
            client.wait_for_index(ks, name, timeout=240)
        yield Env(shared_cluster.path, client, ref)


QUERIES: list[tuple[str, Any]] = [
    # Uncorrelated, valued once at the initiator.
    (
        f"SELECT o.n FROM {ORDERS} o WHERE o.cid IN "
        f"(SELECT RAW c.id FROM {CUSTOMERS} c WHERE c.vip) ORDER BY o.n",
        None,
    ),
    (
        f"SELECT RAW COUNT(*) FROM {ORDERS} o WHERE o.cid IN (SELECT RAW c.id FROM {CUSTOMERS} "
        f"c JOIN {ORDERS} x ON x.cid = c.id WHERE x.qty = $1)",
        [5],
    ),
    # Correlated: over the documents the side statements gathered.
    (
        f"SELECT o.n, (SELECT RAW c.name FROM {CUSTOMERS} c WHERE c.id = o.cid) AS name "
        f"FROM {ORDERS} o WHERE o.qty > 3 ORDER BY o.n",
        None,
    ),
    (
        f"SELECT o.n, (SELECT c.city, COUNT(*) AS k FROM {CUSTOMERS} c JOIN {ORDERS} x ON "
        f"x.cid = c.id AND x.qty = 0 WHERE c.id = o.cid GROUP BY c.city) AS per "
        f"FROM {ORDERS} o WHERE o.n < 60 ORDER BY o.n",
        None,
    ),
    (
        f"SELECT RAW o.n FROM {ORDERS} o WHERE EXISTS (SELECT 1 FROM {CUSTOMERS} c "
        "WHERE c.id = o.cid AND c.name IN o.tags) ORDER BY o.n",
        None,
    ),
]


def _spill_dirs(path: Path) -> list[Path]:
    return [d for d in path.rglob(SPILL_DIR) if d.is_dir() and any(d.iterdir())]


@pytest.mark.timeout(600)
def test_intersect_except_and_windows_spill_at_the_initiator(env: Env) -> None:
    tiny = {"memory_quota": MIN_QUERY_MEMORY}
    cases = [
        "SELECT RAW v FROM (ARRAY_RANGE(0, 3000)) AS v INTERSECT ALL "
        "SELECT RAW v * 2 FROM (ARRAY_RANGE(0, 20000)) AS v",
        "SELECT RAW {'v': v, 'pad': REPEAT('p', 20)} FROM (ARRAY_RANGE(0, 4000)) AS v EXCEPT "
        "SELECT RAW {'v': v * 3, 'pad': REPEAT('p', 20)} FROM (ARRAY_RANGE(0, 9000)) AS v",
        f"SELECT o.n, ROW_NUMBER() OVER (PARTITION BY o.cid ORDER BY o.qty) AS r, "
        f"SUM(o.qty) OVER (PARTITION BY o.n % 7 ORDER BY o.n) AS s FROM {ORDERS} o",
    ]
    for sql in cases:
        want = list(env.client.query(sql))
        assert want
        assert list(env.client.query(sql, **tiny)) == want, sql
        with pytest.raises(ShardexError) as err:
            list(env.client.query(sql, spill=False, **tiny))
        assert err.value.code is ErrorCode.QUERY_MEMORY_LIMIT
    assert _spill_dirs(env.path) == []  # every query's spill directory was removed


@pytest.mark.timeout(600)
def test_a_subquery_input_past_the_budget_is_a_clear_error(env: Env) -> None:
    sql = (
        f"SELECT o.n, (SELECT RAW x FROM {ORDERS} x WHERE x.cid = o.cid) AS same "
        f"FROM {ORDERS} o WHERE o.n < 5"  # every order gathered: ~100 KB over 64 KiB
    )
    with pytest.raises(ShardexError) as err:
        list(env.client.query(sql, memory_quota=MIN_QUERY_MEMORY, spill=False))
    assert err.value.code is ErrorCode.QUERY_MEMORY_LIMIT
    assert err.value.details["operator"] == "subquery inputs"
    env.check(sql + " ORDER BY o.n")  # the default budget holds it


@pytest.mark.timeout(600)
def test_subqueries_over_keyspaces_and_joins_equal_the_reference(env: Env) -> None:
    for sql, params in QUERIES:
        env.check(sql, params)
    # A set operation over them, and a WITH whose body reads one.
    env.check(
        f"SELECT RAW c.id FROM {CUSTOMERS} c WHERE c.vip EXCEPT SELECT RAW o.cid FROM {ORDERS} "
        f"o WHERE o.cid IN (SELECT RAW c2.id FROM {CUSTOMERS} c2 WHERE c2.city = 'x1')"
    )
    env.check(
        f"WITH lim AS (3) SELECT o.n FROM {ORDERS} o WHERE o.qty > lim AND o.cid IN "
        f"(SELECT RAW c.id FROM {CUSTOMERS} c WHERE c.vip AND c.id > lim) ORDER BY o.n"
    )
    # A WITH expression term reading a keyspace through its subquery.
    env.check(
        f"WITH top AS (ARRAY_MAX((SELECT RAW c.id FROM {CUSTOMERS} c WHERE c.vip))) "
        f"SELECT RAW o.n FROM {ORDERS} o WHERE o.cid >= top - 5 ORDER BY o.n"
    )


@pytest.mark.timeout(600)
def test_dml_with_a_keyspace_subquery_and_request_plus_inputs(env: Env) -> None:
    """The inputs read at the statement's consistency: a customer written just before a
    request_plus statement is in its subquery's input."""
    sql = (
        f"UPDATE {ORDERS} SET vip = TRUE "
        f"WHERE cid IN (SELECT RAW c.id FROM {CUSTOMERS} c WHERE c.vip)"
    )
    list(env.client.query(sql))
    env.ref.execute(sql)
    env.check(f"SELECT RAW META(o).id FROM {ORDERS} o WHERE o.vip ORDER BY META(o).id")
    for i in range(3):
        doc = {"id": 1000 + i, "name": "late", "vip": True, "city": "x9"}
        env.client.keyspace(CUSTOMERS).upsert(f"late{i}", doc)
        env.ref.keyspaces[CUSTOMERS][f"late{i}"] = doc
        got = list(
            env.client.query(
                f"SELECT RAW (SELECT RAW COUNT(*) FROM {CUSTOMERS} c WHERE c.name = 'late')[0]",
                consistency="request_plus",
            )
        )
        assert got == [i + 1]
