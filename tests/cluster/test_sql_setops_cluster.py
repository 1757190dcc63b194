"""Set operations, WITH and window functions on a real 3-node cluster: each SELECT branch
runs as a query of its own (key lookups small enough to run inline and large enough to need
fragments, FROM expressions) and the initiator combines them; results equal
``LocalEngine``'s, EXPLAIN shows the branches' plans, and the initiator's operators are held
to the statement's memory budget; a WITH term runs once, before the query, its value read by
the query's fragments as a parameter (also a key lookup's keys); window functions run where
the rows meet. Key lookups and FROM expressions need no index, so no Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster
from data_helpers import running_cluster

from shardex.client import Client, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.memory import MIN_QUERY_MEMORY
from shardex.sql.exec.rows import encode_row
from shardex.sql.local import LocalEngine

pytestmark = pytest.mark.cluster

KS = "things"
DOCS = {f"t{i:03}": {"n": i, "g": i % 7, "c": ["red", "blue", None][i % 3]} for i in range(200)}
FEW = [f"t{i:03}" for i in range(0, 40, 3)]  # a key lookup run inline (<= 64 keys)
MANY = [f"t{i:03}" for i in range(20, 200)]  # more: the root fragment reads them

QUERIES: list[tuple[str, list[Any] | None]] = [
    (
        f"SELECT g FROM {KS} USE KEYS $1 UNION SELECT g FROM {KS} USE KEYS $2 ORDER BY g",
        [FEW, MANY],
    ),
    (
        f"SELECT RAW n FROM {KS} USE KEYS $1 UNION ALL SELECT RAW n FROM {KS} USE KEYS $2 "
        "ORDER BY SELF DESC LIMIT 7 OFFSET 3",
        [FEW, MANY],
    ),
    (
        f"SELECT RAW g FROM {KS} USE KEYS $2 INTERSECT ALL SELECT RAW g FROM {KS} USE KEYS $1",
        [FEW, MANY],
    ),
    (
        f"SELECT c, g FROM {KS} USE KEYS $2 EXCEPT SELECT c, g FROM {KS} USE KEYS $1 ORDER BY g, c",
        [FEW, MANY],
    ),
    (
        f"SELECT RAW v FROM (ARRAY_RANGE(0, 30)) AS v EXCEPT ALL "
        f"(SELECT RAW n FROM {KS} USE KEYS $1 UNION SELECT RAW 29) ORDER BY SELF",
        [FEW],
    ),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("sql-setops")) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster):
    with connect_local(Path(cluster.path)) as c:
        c.create_keyspace(KS, 16)
        c.keyspace(KS).upsert_many(DOCS.items())
        yield c


@pytest.fixture(scope="module")
def reference() -> LocalEngine:
    eng = LocalEngine()
    eng.create_keyspace(KS)
    eng.keyspaces[KS].update(DOCS)
    return eng


def test_set_operations_equal_the_reference(client: Client, reference: LocalEngine) -> None:
    for sql, params in QUERIES:
        rows = client.query(sql, params)
        got = list(rows)
        want = reference.query(sql, params)
        assert want, sql
        if "ORDER BY" in sql:
            assert got == want, sql
        else:
            assert sorted(map(encode_row, got)) == sorted(map(encode_row, want)), sql


def test_explain_shows_each_branch_and_the_initiators_operators(client: Client) -> None:
    sql = f"EXPLAIN SELECT RAW n FROM {KS} USE KEYS $1 INTERSECT SELECT RAW 3 ORDER BY SELF"
    [plan] = list(client.query(sql, [FEW]))
    first, second = plan["branches"]
    assert first["distributed"]["source"] == "keys"
    assert second["distributed"]["source"] == "none"
    assert plan["distributed"]["mode"] == "set_operation"
    assert plan["distributed"]["does"] == ["Intersect", "Order"]


def test_the_initiators_operators_keep_to_the_memory_budget(client: Client) -> None:
    sql = (
        "SELECT RAW v FROM (ARRAY_RANGE(0, 100)) AS v "
        "INTERSECT ALL SELECT RAW v FROM (ARRAY_RANGE(0, 20000)) AS v"
    )
    with pytest.raises(ShardexError) as err:
        list(client.query(sql, memory_quota=MIN_QUERY_MEMORY, spill=False))
    assert err.value.code is ErrorCode.QUERY_MEMORY_LIMIT
    assert err.value.details["operator"] == "INTERSECT/EXCEPT"
    assert list(client.query(sql)) == list(range(100))  # the default budget holds it


WITH_QUERIES: list[tuple[str, list[Any] | None]] = [
    # A term used twice, in FROM and in an expression, over a key lookup run in fragments.
    (
        f"WITH picked AS (SELECT RAW META().id FROM {KS} USE KEYS $1 WHERE g = 3), "
        f"n AS (ARRAY_LENGTH(picked)) SELECT t.n AS num, n AS total FROM {KS} AS t "
        "USE KEYS picked ORDER BY t.n",
        [MANY],
    ),
    (
        f"WITH gs AS (SELECT DISTINCT RAW g FROM {KS} USE KEYS $1) "
        "SELECT RAW v FROM gs AS v ORDER BY v",
        [FEW],
    ),
    (
        f"WITH few AS (SELECT RAW n FROM {KS} USE KEYS $1) SELECT RAW n FROM {KS} USE KEYS $2 "
        "WHERE n IN few UNION SELECT RAW f + 1000 FROM few AS f ORDER BY SELF LIMIT 20",
        [FEW, MANY],
    ),
    (
        f"WITH c AS (SELECT g, COUNT(*) AS k FROM {KS} USE KEYS $1 GROUP BY g) "
        f"SELECT x.g, x.k, (SELECT RAW MAX(y.k) FROM c AS y)[0] AS most FROM c AS x ORDER BY x.g",
        [MANY],
    ),
]


def test_with_equals_the_reference(client: Client, reference: LocalEngine) -> None:
    for sql, params in WITH_QUERIES:
        want = reference.query(sql, params)
        assert want, sql
        rows = client.query(sql, params)
        assert list(rows) == want, sql


def test_explain_with_shows_its_terms_and_the_querys_plan(client: Client) -> None:
    sql = f"EXPLAIN WITH ids AS (SELECT RAW META().id FROM {KS} USE KEYS $1) SELECT 1"
    [plan] = list(client.query(sql, [FEW]))
    assert plan["with"][0]["name"] == "ids"
    assert plan["distributed_with"]["terms"] == ["ids"]
    assert plan["distributed"]["source"] == "none"


def test_a_with_value_is_held_within_the_memory_budget(client: Client) -> None:
    sql = "WITH big AS (ARRAY_RANGE(0, 20000)) SELECT RAW ARRAY_LENGTH(big)"
    with pytest.raises(ShardexError) as err:
        list(client.query(sql, memory_quota=MIN_QUERY_MEMORY, spill=False))
    assert err.value.code is ErrorCode.QUERY_MEMORY_LIMIT
    assert err.value.details["operator"] == "WITH"
    assert list(client.query(sql)) == [20000]


WINDOW_QUERIES: list[tuple[str, list[Any] | None]] = [
    (
        f"SELECT n, g, ROW_NUMBER() OVER (PARTITION BY g ORDER BY n DESC) AS rn, "
        f"SUM(n) OVER (PARTITION BY g ORDER BY n ROWS 2 PRECEDING) AS s, "
        f"LAG(c) OVER (ORDER BY n) AS before FROM {KS} USE KEYS $1 ORDER BY n",
        [MANY],
    ),
    (
        f"SELECT c, COUNT(*) AS k, RANK() OVER (ORDER BY COUNT(*) DESC) AS r, "
        f"CUME_DIST() OVER (ORDER BY c) AS cd FROM {KS} USE KEYS $1 GROUP BY c ORDER BY c",
        [MANY],
    ),
]


def test_window_functions_equal_the_reference(client: Client, reference: LocalEngine) -> None:
    for sql, params in WINDOW_QUERIES:
        want = reference.query(sql, params)
        assert want, sql
        assert list(client.query(sql, params)) == want, sql


def test_prepare_and_execute_on_the_node(client: Client, reference: LocalEngine) -> None:
    sql = f"SELECT RAW n FROM {KS} USE KEYS $1 WHERE g = $2 ORDER BY n"
    [row] = list(client.query(f"PREPARE picked FROM {sql}"))
    assert row == {"name": "picked", "text": sql}
    want = reference.query(sql, [MANY, 3])
    assert want and list(client.query("EXECUTE picked", [MANY, 3])) == want
    using = list(client.query(f"EXECUTE picked USING [{FEW!r}, 0]".replace("'", '"')))
    assert using == reference.query(sql, [FEW, 0])
    with pytest.raises(ShardexError) as err:
        list(client.query("EXECUTE unknown_name"))
    assert err.value.code is ErrorCode.BAD_REQUEST


def test_insert_and_upsert_select_write_the_querys_rows(client: Client) -> None:
    client.create_keyspace("copies", 8)
    sql = (
        "INSERT INTO copies (KEY 'c_' || id, VALUE {'n': n, 'g': g}) "
        f"SELECT META().id AS id, n, g FROM {KS} USE KEYS $1 WHERE g = 2"
    )
    rows = client.query(sql, [MANY])
    assert list(rows) == []
    expected = {
        f"c_{k}": {"n": d["n"], "g": 2} for k, d in DOCS.items() if k in MANY and d["g"] == 2
    }
    assert rows.metrics.mutation_count == len(expected) > 0
    got = client.query("SELECT RAW [META().id, c] FROM copies AS c USE KEYS $1", [list(expected)])
    assert {k: v for k, v in got} == expected
    with pytest.raises(ShardexError) as err:  # the same keys again: nothing written
        list(client.query(sql, [MANY]))
    assert err.value.code is ErrorCode.DOC_EXISTS
    up = client.query(
        "UPSERT INTO copies (KEY 'g_' || TOSTRING(g)) "
        f"SELECT g, COUNT(*) AS k FROM {KS} USE KEYS $1 GROUP BY g",
        [MANY],
    )
    list(up)
    assert up.metrics.mutation_count == 7
