"""Hostile SQL on a real 3-node cluster leaves every node serving and up: a regular
expression that backtracks for minutes in a backtracking engine (it held the GIL, so the
node's loop missed its heartbeats and peers marked it down) answers through RE2, and bad
patterns, huge literals and over-long statements get clear errors. Key lookups and FROM
expressions need no index, so no Spark."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_helpers import LocalCluster
from data_helpers import running_cluster

from shardex.client import Client, connect, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.statement_checks import MAX_STATEMENT_BYTES
from shardex.sql.exec.statements import PLAN_ON_LOOP_CHARS

pytestmark = pytest.mark.cluster

KS = "texts"
BOMB = "a" * 30 + "!"  # against ^(a+)+$: 2**30 backtracking steps
DOCS = {"bomb": {"s": BOMB}, "fine": {"s": "a" * 30}}
NODES = (1, 2, 3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("sql-guards")) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster):
    with connect_local(Path(cluster.path)) as c:
        c.create_keyspace(KS, 8)
        c.keyspace(KS).upsert_many(DOCS.items())
        yield c


def _views(cluster: LocalCluster) -> list[tuple[str, int, dict[str, str]]]:
    """Each node's membership view: (observer, version, member -> state)."""
    out = []
    for i in NODES:
        with connect(cluster.address(i), secret=cluster.secret()) as c:
            st = c.cluster_status()
            out.append((st.observer, st.version, {m.name: m.state for m in st.members}))
    return out


def test_backtracking_regexp_answers_and_no_node_is_marked_down(
    cluster: LocalCluster, client: Client
) -> None:
    before = _views(cluster)
    assert all(set(states.values()) == {"up"} for _, _, states in before), before
    pattern = "^(a+)+$"
    # On every node as the initiator: a FROM expression, an inline key lookup (on the
    # loop) and the same lookup as fragments.
    for i in NODES:
        with connect(cluster.address(i), secret=cluster.secret()) as c:
            expr = 'SELECT RAW REGEXP_CONTAINS(REPEAT("a", 30) || "!", $1)'
            assert list(c.query(expr, [pattern], timeout=120)) == [False]
            sql = f"SELECT META().id AS id, REGEXP_LIKE(s, $1) AS m FROM {KS} USE KEYS $2"
            for tuning in (None, {"inline": False}):
                rows = c.query(sql, [pattern, sorted(DOCS)], timeout=120, tuning=tuning)
                assert sorted(rows, key=lambda r: r["id"]) == [
                    {"id": "bomb", "m": False},
                    {"id": "fine", "m": True},
                ]
    after = _views(cluster)
    # Every node sees every member up, with the same membership version (a member a peer
    # had marked down would have refuted with a new incarnation, raising it) ...
    assert after == before
    # ... and no manager logged a member down in the meantime.
    for log in Path(cluster.path).glob("node*/node.log"):
        assert " is DOWN " not in log.read_text(), log


def test_a_pattern_re2_cannot_compile_is_a_clear_error(client: Client) -> None:
    with pytest.raises(ShardexError) as info:
        list(
            client.query(f"SELECT RAW REGEXP_CONTAINS(s, $1) FROM {KS} USE KEYS 'bomb'", ["(a)\\1"])
        )
    e = info.value
    assert e.code is ErrorCode.EXPRESSION_EVAL
    assert "(a)\\\\1" in e.message and "RE2 syntax" in e.details["hint"]


def test_a_statement_over_the_limit_is_bad_request(client: Client) -> None:
    sql = 'SELECT RAW LENGTH("' + "x" * MAX_STATEMENT_BYTES + '")'
    with pytest.raises(ShardexError) as info:
        list(client.query(sql))
    e = info.value
    assert e.code is ErrorCode.BAD_REQUEST
    assert e.details["size"] == len(sql) and e.details["limit"] == MAX_STATEMENT_BYTES
    assert f"over the limit of {MAX_STATEMENT_BYTES} bytes" in e.message


def test_a_long_statement_is_planned_off_the_loop_with_the_same_result(client: Client) -> None:
    ids = [f"nope{i}" for i in range(PLAN_ON_LOOP_CHARS // 8)] + ["fine"]
    listed = ", ".join(f"'{d}'" for d in ids)
    sql = f"SELECT RAW META().id FROM {KS} USE KEYS [{listed}]"
    assert len(sql) > PLAN_ON_LOOP_CHARS
    assert list(client.query(sql)) == ["fine"]
    explain = f"EXPLAIN SELECT RAW META().id FROM {KS} WHERE META().id IN [{listed}]"
    (plan,) = client.query(explain)
    assert plan["distributed"]["source"] == "keys"  # planned in the worker thread as ever


def test_now_is_one_time_per_statement_and_params_keep_their_checks(client: Client) -> None:
    # The receiving node stamps the statement time into the params: the key lookups on every
    # owner and the FROM expression see one value, and $1 still reads the caller's list.
    sql = (
        f"SELECT META().id AS id, NOW_MILLIS() AS n, NOW_STR() AS s, $1 AS p FROM {KS} "
        "USE KEYS ['bomb', 'fine']"
    )
    for _ in range(3):
        rows = list(client.query(sql, ["x"], timeout=60))
        assert sorted(r["id"] for r in rows) == ["bomb", "fine"]
        assert len({(r["n"], r["s"]) for r in rows}) == 1 and {r["p"] for r in rows} == {"x"}
    with pytest.raises(ShardexError) as info:
        list(client.query(sql, ["x", "y"], timeout=60))
    assert info.value.code is ErrorCode.BAD_REQUEST and "count mismatch" in info.value.message
