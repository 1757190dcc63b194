"""Small SQL queries on a real 3-node cluster skip the machinery sized for large ones (the
``inline`` switch): a key lookup runs on the initiator without fragments, and the reply
carries the first block of rows (every row when they fit). Results, errors and EXPLAIN are
checked against the switch off. Key lookups and FROM expressions need no index, so no Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster
from data_helpers import running_cluster

from shardex.client import Client, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.memory import MIN_QUERY_MEMORY
from shardex.sql.exec.plan import INLINE_KEYS
from shardex.sql.exec.reply import BLOCK_ROWS
from shardex.sql.local import LocalEngine

pytestmark = pytest.mark.cluster

KS = "people"
DOCS = {f"p{i:03}": {"name": f"n{i}", "age": i % 50, "tags": [i % 3]} for i in range(150)}
OFF = {"inline": False}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("sql-inline")) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster):
    with connect_local(Path(cluster.path)) as c:
        c.create_keyspace(KS, 16)
        c.keyspace(KS).upsert_many(DOCS.items())
        yield c


def both(c: Client, sql: str, params: Any = None, **kw: Any) -> tuple[Any, Any]:
    """The statement with the switch on and off: (rows, started) of each."""
    on = c.query(sql, params, **kw)
    on_rows = list(on)
    off = c.query(sql, params, tuning=OFF, **kw)
    off_rows = list(off)
    assert on_rows == off_rows
    assert off.started.rows is None and not off.started.done  # every row came on the stream
    return on_rows, on


def test_a_point_lookup_is_answered_by_the_reply_alone(client: Client) -> None:
    rows, q = both(client, f"SELECT name, age FROM {KS} WHERE META().id = $1", ["p007"])
    assert rows == [{"name": "n7", "age": 7}]
    assert q.started.done and q.started.details["inline"] is True
    assert q.metrics is not None and q.metrics.result_count == 1
    missing, q = both(client, f"SELECT name FROM {KS} USE KEYS 'nope'")
    assert missing == [] and q.started.done


def test_key_lookups_keep_order_repeats_filters_and_limits(client: Client) -> None:
    keys = ["p003", "p001", "p003", "zz", "p010"]
    rows, q = both(client, f"SELECT RAW META().id FROM {KS} USE KEYS $1", [keys])
    assert rows == ["p003", "p001", "p003", "p010"] and q.started.details["inline"]
    sql = (
        f"SELECT META().id AS id FROM {KS} WHERE META().id IN $1 AND age > 5 "
        "ORDER BY age DESC LIMIT 2"
    )
    rows, _ = both(client, sql, [[f"p{i:03}" for i in range(20)]])
    assert rows == [{"id": "p019"}, {"id": "p018"}]


def test_an_inline_lookup_has_a_query_id_like_other_queries(client: Client) -> None:
    sql = f"SELECT name FROM {KS} USE KEYS 'p004'"
    ids = []
    for tuning in (None, None, OFF):
        q = client.query(sql, tuning=tuning)
        assert list(q) == [{"name": "n4"}] and q.metrics is not None
        assert q.started.details["inline"] is (tuning is None)
        assert q.metrics.details["query_id"] == q.started.details["query_id"]
        ids.append(q.started.details["query_id"])
    # "<initiator member>/<local id>", from the one factory the fragment path uses: each
    # query its own id.
    assert all(isinstance(i, str) and i.count("/") == 1 for i in ids)
    assert len(set(ids)) == 3


def test_more_keys_than_the_inline_bound_run_as_a_fragment(client: Client) -> None:
    keys = sorted(DOCS)[: INLINE_KEYS + 1]
    rows, q = both(client, f"SELECT RAW META().id FROM {KS} USE KEYS $1", [keys])
    assert rows == keys and q.started.details["inline"] is False and q.started.done


def test_a_result_past_one_block_starts_in_the_reply_and_streams_the_rest(
    client: Client,
) -> None:
    n = 3 * BLOCK_ROWS + 7
    rows, q = both(client, "SELECT RAW x FROM ($1) AS x", [list(range(n))])
    assert rows == list(range(n))
    assert not q.started.done and len(q.started.rows) == BLOCK_ROWS
    # Stopping early after the reply's rows cancels the stream and leaves the node serving.
    with client.query("SELECT RAW x FROM ($1) AS x", [list(range(n))]) as early:
        it = iter(early)
        assert [next(it) for _ in range(3)] == [0, 1, 2]
    assert list(client.query(f"SELECT RAW name FROM {KS} USE KEYS 'p001'")) == ["n1"]


def test_an_error_within_the_first_block_ends_the_rows_not_the_call(client: Client) -> None:
    sql = "SELECT RAW x FROM ($1) AS x ORDER BY x DESC"
    for tuning in (None, OFF):  # 2000 sorted rows hold over 64 KiB
        quota = MIN_QUERY_MEMORY
        q = client.query(sql, [list(range(2000))], memory_quota=quota, spill=False, tuning=tuning)
        with pytest.raises(ShardexError) as info:
            list(q)
        assert info.value.code is ErrorCode.QUERY_MEMORY_LIMIT


def test_explain_names_the_inline_key_lookup(client: Client) -> None:
    (plan,) = client.query(f"EXPLAIN SELECT name FROM {KS} WHERE META().id = $1", ["p001"])
    fast = plan["distributed"]["fast_path"]
    assert fast["kind"] == "InlineKeyLookup" and fast["on"] == "initiator"
    assert fast["max_keys"] == INLINE_KEYS
    (off,) = client.query(f"EXPLAIN SELECT name FROM {KS} USE KEYS 'p001'", tuning=OFF)
    assert "fast_path" not in off["distributed"]
    (scan,) = client.query("EXPLAIN SELECT RAW x FROM [1, 2] AS x")
    assert "fast_path" not in scan["distributed"]


def test_dml_rows_and_counts_are_unchanged(client: Client) -> None:
    q = client.query(f"UPDATE {KS} USE KEYS 'p002' SET age = 99 RETURNING META().id AS id, age")
    assert list(q) == [{"id": "p002", "age": 99}] and q.started.mutation_count == 1
    assert q.started.done
    assert list(client.query(f"SELECT RAW age FROM {KS} USE KEYS 'p002'")) == [99]


def test_unnest_and_subqueries_over_named_documents(client: Client) -> None:
    # Every member binds the statement text itself: UNNEST and a correlated subquery reach
    # the initiator's root (key lookups, inline or as a fragment) and give the reference's
    # rows; a subquery over a keyspace is refused before anything runs.
    ref = LocalEngine()
    ref.create_keyspace(KS)
    ref.keyspaces[KS].update(DOCS)
    keys = [f"p{i:03}" for i in range(0, 12)]
    sqls = [
        f"SELECT p.name, t FROM {KS} p USE KEYS $1 UNNEST p.tags t WHERE t > 0 ORDER BY p.name",
        f"SELECT RAW p.name FROM {KS} p USE KEYS $1 LEFT UNNEST p.none x ORDER BY p.name",
        f"SELECT p.name, (SELECT RAW t * 10 FROM p.tags AS t) AS ts FROM {KS} p USE KEYS $1 "
        f"WHERE EXISTS (SELECT 1 FROM p.tags t WHERE t = 2) ORDER BY p.name",
    ]
    for sql in sqls:
        rows, _ = both(client, sql, [keys])
        assert rows == ref.query(sql, [keys]) and rows
    # A USE KEYS subquery reads its documents from their owners (off the loop: no inline).
    sql = (
        f"SELECT p.name, (SELECT RAW q.name FROM {KS} q USE KEYS [me]) AS same "
        f"FROM {KS} p USE KEYS $1 LET me = META(p).id ORDER BY p.name"
    )
    rows = list(client.query(sql, [keys]))
    assert rows == ref.query(sql, [keys]) and all(r["same"] == [r["name"]] for r in rows)
    # A subquery over the whole keyspace runs on the cluster (its input read first): it needs
    # an index as the same SELECT alone does (this keyspace has none) and fails as that does.
    with pytest.raises(ShardexError) as alone:
        list(client.query(f"SELECT RAW COUNT(*) FROM {KS}"))
    with pytest.raises(ShardexError) as e:
        list(client.query(f"SELECT RAW (SELECT RAW COUNT(*) FROM {KS})[0]"))
    assert e.value.code == alone.value.code == ErrorCode.INDEX_NOT_FOUND
    assert KS in e.value.message
