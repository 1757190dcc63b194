"""Joins between fragments (decision 0135) on a real cluster: the session's shared 3 nodes
(``shared_cluster``) with ``lj`` and ``rj`` behind primary indexes partitioned over the
nodes, so each side's leaves run on several nodes and hash-partition their rows to the join
fragments. The generated join queries of ``tests/sql_reference`` run through ``c.query``
against DuckDB (every INNER / LEFT hash join among them between fragments, the others at
the initiator, as the reply's ``join`` says), and the exchanges stay within their window."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from tests.sql_reference.compare import compare
from tests.sql_reference.join_queries import (
    LEFT,
    RIGHT,
    join_connection,
    join_queries,
    make_join_documents,
)

from shardex.client import Client
from shardex.meta import cluster_dir as cdir

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster

SMALL_WINDOW = 8192


@dataclass
class Env:
    client: Client
    nodes: list[str]
    left: dict[str, Any]
    right: dict[str, Any]


@pytest.fixture(scope="module")
def env(shared_cluster: SharedCluster) -> Iterator[Env]:
    left, right = make_join_documents(1, 150, 120)
    client = shared_cluster.client
    with shared_cluster.keyspace(LEFT), shared_cluster.keyspace(RIGHT):
        for name, docs in ((LEFT, left), (RIGHT, right)):
            client.keyspace(name).upsert_many(docs.items())
            list(
                client.query(
                    f"CREATE PRIMARY INDEX ON {name} PARTITION BY HASH(META().id) "
                    'WITH {"num_partition": 3}'
                )
            )
        for name in (LEFT, RIGHT):
            client.wait_for_index(name, "#primary", timeout=240)
        nodes = [n.name for n in cdir.load(shared_cluster.path).nodes]
        yield Env(client, nodes, left, right)


def _run(env: Env, ran: Counter[str], **kw: Any) -> Any:
    def run(sql: str) -> list[Any]:
        res = env.client.query(sql, **kw)
        rows = list(res)
        assert res.metrics is not None
        ran[res.metrics.details.get("join", "none")] += 1
        return rows

    return run


@pytest.mark.timeout(900)
def test_generated_joins_through_the_cluster_equal_duckdb(env: Env) -> None:
    con = join_connection(env.left, env.right)
    qs = join_queries(31, 80)
    ran: Counter[str] = Counter()
    mismatches = [m for q in qs if (m := compare(_run(env, ran), con, q)) is not None]
    # The initiator's path for the same statements: the same rows.
    off: Counter[str] = Counter()
    initiator = _run(env, off, tuning={"join_exchange": False})
    hashed = [q for q in qs if "RIGHT" not in q.sqlpp and " NEST " not in q.sqlpp][:15]
    mismatches += [m for q in hashed if (m := compare(initiator, con, q)) is not None]
    con.close()
    assert not mismatches, "\n\n".join(map(str, mismatches[:10]))
    assert ran["hash"] >= 15 and ran["initiator"] >= 15, ran
    assert off["hash"] == 0, off


@pytest.mark.timeout(600)
def test_explain_and_the_exchanges_of_a_join_between_fragments(env: Env) -> None:
    from shardex.api.sql_exec import ExchangeStats, ExchangeStatsReply

    sql = (
        f"SELECT l.g AS g, COUNT(*) AS n, SUM(r.a) AS s FROM {LEFT} AS l "
        f"LEFT JOIN {RIGHT} AS r ON l.b = r.b GROUP BY l.g"
    )
    (plan,) = env.client.query("EXPLAIN " + sql)
    where = plan["distributed"]["join"]
    assert where["exchange"] == "hash" and where["partition_by"] == ["l.b", "r.b"]
    res = env.client.query(sql, window=SMALL_WINDOW)
    rows = list(res)
    assert rows and res.metrics is not None and res.metrics.details["join"] == "hash"
    qid = res.metrics.details["query_id"]
    streams = []
    rpc = env.client.rpc
    for node in env.nodes:
        reply = rpc.run(rpc.router.to_node(node, ExchangeStats(query_id=qid), ExchangeStatsReply))
        streams += [s for s in reply.streams if s.sent]
    edges = Counter(s.edge for s in streams)
    # Both sides' leaves on several nodes, each sending to every join fragment.
    assert edges[2] >= 4 and edges[3] >= 4 and edges[1] >= 2, edges
    assert all(s.max_sender_bound <= SMALL_WINDOW for s in streams), streams

    # Streamed rows (no ORDER BY, no aggregate) far beyond the small window on every edge:
    # the root takes them as they come from any join fragment, and all arrive.
    con = join_connection(env.left, env.right)
    ((want,),) = con.execute(
        f"SELECT COUNT(*) FROM {LEFT} l JOIN {RIGHT} r ON l.b = r.b"
    ).fetchall()
    con.close()
    streamed = f"SELECT l.id AS lid, r.s AS s FROM {LEFT} AS l JOIN {RIGHT} AS r ON l.b = r.b"
    res = env.client.query(streamed, window=SMALL_WINDOW, timeout=60)
    assert sum(1 for _ in res) == want > 1000
    assert res.metrics is not None and res.metrics.details["join"] == "hash"


@pytest.mark.timeout(600)
def test_meta_cas_and_expiration_of_joined_keyspaces(env: Env) -> None:
    """``META(r).cas`` / ``.expiration`` in a join are the documents' own, as a read by key
    gives them, between fragments, at the initiator and through a lookup join."""
    direct = {
        row["id"]: row
        for row in env.client.query(
            f"SELECT META(r).id AS id, META(r).cas AS cas, META(r).expiration AS e "
            f"FROM {RIGHT} AS r USE KEYS $1",
            [sorted(env.right)],
        )
    }
    meta = "META(r).id AS r, META(r).cas AS cas, META(r).expiration AS e"
    for sql, tuning in (
        (f"SELECT {meta} FROM {LEFT} AS l JOIN {RIGHT} AS r ON l.b = r.b WHERE l.a < 5", None),
        (
            f"SELECT {meta} FROM {LEFT} AS l JOIN {RIGHT} AS r ON l.b = r.b WHERE l.a < 5",
            {"join_exchange": False},
        ),
        (f"SELECT {meta} FROM {LEFT} AS l JOIN {RIGHT} AS r ON KEYS l.k", None),
    ):
        rows = list(env.client.query(sql, tuning=tuning))
        assert rows, sql
        for row in rows:
            want = direct[row["r"]]
            assert row["cas"] == want["cas"] and row["cas"] > 0, (sql, row, want)
            assert row["e"] == want["e"], (sql, row, want)
