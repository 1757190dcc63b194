"""Leaf calls on a real 3-node cluster (``sql/exec/leaf_calls.py``): statements over several
leaves whose results are small ask each leaf by one request and get its rows in the reply
(``details["calls"]``), with the rows the execution protocol gives (``leaf_calls`` off) and
the reference engine's; a result past a reply's bound is streamed instead, whole, and its
text keeps the stream on that node."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from shardex.client import Client, connect
from shardex.meta import cluster_dir as cdir
from shardex.sql.exec.leaf_calls import CALL_MAX_BYTES
from shardex.sql.local import LocalEngine

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster

KS = "called"
N_DOCS = 300
PAD = 6000  # bytes of padding per row of the large statement
OFF = {"leaf_calls": False}

SMALL = [
    (f"SELECT META().id AS id, age FROM {KS} WHERE age BETWEEN $1 AND $2", [30, 34]),
    (f"SELECT META().id AS id, name, city FROM {KS} WHERE age BETWEEN $1 AND $2", [40, 42]),
    (f"SELECT META().id AS id, name FROM {KS} WHERE age >= $1 ORDER BY age, META().id LIMIT 7",
     [25]),
    (f"SELECT META().id AS id, age FROM {KS} WHERE age >= $1 ORDER BY age DESC, META().id "
     "LIMIT 5 OFFSET 3", [20]),
    (f"SELECT city, age FROM {KS} WHERE age > $1 LIMIT 4", [60]),
    (f"SELECT META().id AS id FROM {KS} WHERE age = $1", [999]),  # no row at all
]  # fmt: skip


@pytest.fixture(scope="module")
def env(shared_cluster: SharedCluster) -> Iterator[tuple[Client, LocalEngine]]:
    rng = random.Random(11)
    docs = {
        f"c{i:04d}": {
            "name": rng.choice(["ann", "bob", "cy", "dee"]),
            "city": rng.choice(["rome", "oslo", "lima"]),
            "age": rng.randrange(18, 70),
        }
        for i in range(N_DOCS)
    }
    ref = LocalEngine()
    ref.create_keyspace(KS)
    ref.keyspaces[KS].update(docs)
    spec = cdir.load(shared_cluster.path)
    password = cdir.read_admin_password(shared_cluster.path, spec)
    with shared_cluster.keyspace(KS):
        ks = shared_cluster.client.keyspace(KS)
        for docid, doc in docs.items():
            ks.upsert(docid, doc)
        ddl = (
            f"CREATE INDEX by_age ON {KS}(age) PARTITION BY HASH(META().id)"
            ' WITH {"num_partition": 4}'
        )
        list(shared_cluster.client.query(ddl))
        ref.execute(ddl)
        shared_cluster.client.wait_for_index(KS, "by_age", timeout=240)
        # One node's connection: the statements below have several leaves, so no routing
        # hint moves them, and what a node remembers of a text is seen on the next run.
        with connect(spec.nodes[0].address, username=cdir.ADMIN_USER, password=password) as c:
            yield c, ref


def _canon(rows: Any) -> list[bytes]:
    return [msgspec.json.encode(r, order="sorted") for r in rows]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("consistency", ["request_plus", "not_bounded"])
def test_small_results_call_their_leaves_with_the_protocols_rows(
    env: tuple[Client, LocalEngine], consistency: str
) -> None:
    c, ref = env
    for sql, params in SMALL:
        called = c.query(sql, params, consistency)
        got = list(called)
        streamed = c.query(sql, params, consistency, tuning=OFF)
        plain = list(streamed)
        want = ref.query(sql, params)
        if "ORDER BY" in sql:
            assert got == plain == want, sql
        elif "LIMIT" in sql:  # any 4 of the matching rows
            assert len(got) == len(plain) == len(want), sql
            assert set(_canon(got)) <= set(_canon(ref.query(sql.split(" LIMIT")[0], params)))
        else:
            assert sorted(_canon(got)) == sorted(_canon(plain)) == sorted(_canon(want)), sql
        d, off = called.metrics.details, streamed.metrics.details
        assert d["leaves"] > 1 and d["calls"] and not off["calls"], (sql, d, off)


@pytest.mark.timeout(600)
def test_a_result_past_a_reply_is_streamed_whole_and_its_text_keeps_the_stream(
    env: tuple[Client, LocalEngine],
) -> None:
    c, ref = env
    sql = f"SELECT META().id AS id, REPEAT('x', {PAD}) AS pad FROM {KS} WHERE age >= $1"
    assert N_DOCS * PAD / 4 > CALL_MAX_BYTES  # one partition's rows outgrow a reply
    want = sorted(_canon(ref.query(sql, [0])))
    first = c.query(sql, [0])
    assert sorted(_canon(first)) == want
    assert first.metrics.details["calls"]  # tried: the leaves answered "too large"
    again = c.query(sql, [0])
    assert sorted(_canon(again)) == want
    assert not again.metrics.details["calls"]  # the text streams now
    # A small statement on the same node still calls its leaves.
    small, params = SMALL[0]
    rows = c.query(small, params)
    list(rows)
    assert rows.metrics.details["calls"]
