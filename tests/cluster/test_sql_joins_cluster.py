"""JOIN and NEST on a real 3-node cluster: the join runs at the initiator over side
statements (decision 0123), each an ordinary SELECT of one keyspace. Without Spark no index
is built, so every side here reads by key: a FROM with USE KEYS, lookup joins, ANSI joins
on the inner documents' ids (probed by key), and gathered sides narrowed to keys by a
pushed ``META(x).id IN`` conjunct. Every result equals ``LocalEngine``'s over the same
documents; EXPLAIN names the join's method and its side statements."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster
from data_helpers import running_cluster

from shardex.client import Client, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.local import LocalEngine

pytestmark = pytest.mark.cluster

CUSTOMERS = {f"c{i:02}": {"name": f"n{i}", "grp": i % 4, "tier": i % 3} for i in range(20)}
ORDERS = {
    f"o{i:02}": {"cid": f"c{(i * 7) % 23:02}", "grp": i % 5, "amt": i, "items": [f"c{i % 6:02}"]}
    for i in range(40)
}
ORDER_IDS = sorted(ORDERS)
CUSTOMER_IDS = sorted(CUSTOMERS)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("sql-joins")) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster):
    with connect_local(Path(cluster.path)) as c:
        c.create_keyspace("orders", 16)
        c.create_keyspace("customers", 16)
        c.keyspace("orders").upsert_many(ORDERS.items())
        c.keyspace("customers").upsert_many(CUSTOMERS.items())
        yield c


@pytest.fixture(scope="module")
def ref() -> LocalEngine:
    e = LocalEngine()
    for name, docs in (("orders", ORDERS), ("customers", CUSTOMERS)):
        e.create_keyspace(name)
        e.keyspaces[name].update(docs)
    return e


def _same(client: Client, ref: LocalEngine, sql: str, params: Any = None) -> list[Any]:
    got = list(client.query(sql, params))
    want = ref.query(sql, params)
    if "ORDER BY" in sql:
        assert got == want
    else:
        assert sorted(map(repr, got)) == sorted(map(repr, want))
    return got


def test_lookup_joins_and_nests(client: Client, ref: LocalEngine) -> None:
    base = "FROM orders o USE KEYS $1"
    rows = _same(
        client,
        ref,
        f"SELECT META(o).id AS o, c.name {base} JOIN customers c ON KEYS o.cid ORDER BY o",
        [ORDER_IDS],
    )
    assert 0 < len(rows) < len(ORDERS)  # c20..c22 name no customer
    left = _same(
        client,
        ref,
        f"SELECT META(o).id AS o, c {base} LEFT JOIN customers c ON KEYS o.cid",
        [ORDER_IDS],
    )
    assert len(left) == len(ORDERS)
    nest = _same(
        client,
        ref,
        f"SELECT META(o).id AS o, c {base} LEFT NEST customers c ON KEYS o.items",
        [ORDER_IDS],
    )
    assert all(isinstance(r["c"], list) for r in nest)
    _same(
        client,
        ref,
        "SELECT x, c.name FROM ['c01', 'zz', 'c02'] AS x LEFT JOIN customers c ON KEYS x",
    )


def test_ansi_joins_by_key_hash_and_right(client: Client, ref: LocalEngine) -> None:
    by_key = (
        "SELECT META(o).id AS o, c.name, o.amt + c.tier AS v FROM orders o USE KEYS $1 "
        "JOIN customers c ON META(c).id = o.cid WHERE c.tier > 0"
    )
    _same(client, ref, by_key, [ORDER_IDS])
    (plan,) = client.query("EXPLAIN " + by_key, [ORDER_IDS])
    join = next(op for op in plan["plan"] if op["operator"] == "JOIN")
    assert (join["method"], join["index"]) == ("index_nl", "(document keys)")
    inputs = plan["distributed"]["inputs"]
    assert inputs[0]["side"] == "FROM" and "USE KEYS" in inputs[0]["statement"]
    assert "IN $shardex_join_keys" in inputs[1]["statement"]
    hashed = (
        "SELECT META(o).id AS o, META(c).id AS c FROM orders o USE KEYS $1 "
        "LEFT JOIN customers c USE HASH(PROBE) ON c.grp = o.grp AND META(c).id IN $2"
    )
    _same(client, ref, hashed, [ORDER_IDS, CUSTOMER_IDS[:9]])
    (plan,) = client.query("EXPLAIN " + hashed, [ORDER_IDS, CUSTOMER_IDS[:9]])
    join = next(op for op in plan["plan"] if op["operator"] == "LEFT JOIN")
    assert (join["method"], join["build"]) == ("hash", "outer")
    right = (
        "SELECT META(c).id AS c, META(o).id AS o FROM customers c USE KEYS $2 "
        "RIGHT JOIN orders o ON META(c).id = o.cid WHERE META(o).id IN $1"
    )
    _same(client, ref, right, [ORDER_IDS[:25], CUSTOMER_IDS[:10]])
    grouped = (
        "SELECT c.grp, COUNT(*) AS n, SUM(o.amt) AS s FROM orders o USE KEYS $1 "
        "JOIN customers c ON KEYS o.cid GROUP BY c.grp ORDER BY c.grp"
    )
    _same(client, ref, grouped, [ORDER_IDS])


def test_join_errors_are_clear(client: Client) -> None:
    with pytest.raises(ShardexError) as e:
        list(client.query("SELECT * FROM orders o USE KEYS 'o01' JOIN nope ON KEYS o.cid"))
    assert e.value.code is ErrorCode.KEYSPACE_NOT_FOUND and e.value.details["keyspace"] == "nope"
    with pytest.raises(ShardexError) as e:
        list(client.query("SELECT * FROM orders o JOIN customers c"))
    assert e.value.code is ErrorCode.SQL_SYNTAX
    # A gathered side needs an index of its keyspace like any SELECT: none is built here.
    with pytest.raises(ShardexError) as e:
        sql = "SELECT * FROM orders o USE KEYS 'o01' JOIN customers c ON c.grp = o.grp"
        list(client.query(sql))
    assert e.value.code is ErrorCode.INDEX_NOT_FOUND and e.value.details["keyspace"] == "customers"
