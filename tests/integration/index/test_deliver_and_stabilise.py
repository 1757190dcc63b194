"""``DeliverAndStabilise``: the maintenance stream's one round trip per indexer and batch
(queue the rows, then stabilise, in one engine call), over real TCP with the oracle at every
TS; re-runs change nothing; a batch whose earlier frames went to a previous incarnation is
refused before anything is queued. Reuses the two-indexer harness of
``test_index_delivery.py``."""

from __future__ import annotations

import random

import pytest

from shardex.api.delivery import (
    DeliverAndStabilise,
    Delivered,
    DeliverKeyVersions,
    Stabilised,
)
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.testing.index import FakeKeyspace, random_workload
from tests.integration.index.test_index_delivery import KS, NODES, Pipe, incarnations, pipe  # noqa: F401


async def _round(
    p: Pipe,
    by_node: dict[str, list],
    ts: Timestamp,
    earlier: dict[str, str] | None = None,
    drop: dict[int, int] | None = None,
) -> dict[str, Stabilised]:
    """One ``DeliverAndStabilise`` per node; ``earlier``: node -> the incarnation the
    batch's earlier (or early) rows went to; ``drop``: the round's ``drop_above``."""
    p.batch += 1
    out = {}
    for node in NODES:
        msg = DeliverAndStabilise(
            keyspace=KS,
            batch_id=p.batch,
            rows=by_node.get(node, []),
            ts=dict(ts.to_wire()),
            index_ids=p.ids,
            incarnation=(earlier or {}).get(node, ""),
            drop_above=drop,
        )
        out[node] = await p.ask(node, msg, Stabilised)
    return out


async def test_one_round_trip_delivers_and_stabilises_exactly(pipe: Pipe) -> None:  # noqa: F811
    rng = random.Random(11)
    ks = FakeKeyspace(num_partitions=8)
    done: Timestamp | None = None
    for _ in range(4):
        random_workload(ks, rng, rng.randint(20, 60))
        ts = ks.ts()
        changes = ks.changes(done, ts)
        sent = pipe.by_node(changes)
        replies = await _round(pipe, sent, ts)
        for node, reply in replies.items():
            assert reply.incarnation == pipe.nodes[node].service.incarnation
            assert reply.accepted == len(sent.get(node, [])) and reply.unknown == 0
            assert all(a.state == "active" and a.applied == ts.to_wire() for a in reply.acks)
        pipe.check(ts, ks.documents_at(ts))
        # The batch again (Spark re-ran it): every row dropped, the stabilise a no-op.
        before = {n: pipe.nodes[n].engine.entries("w_name") for n in NODES}
        again = await _round(pipe, sent, ts)
        assert all(r.accepted == 0 and r.dropped == len(sent.get(n, [])) for n, r in again.items())
        assert {n: pipe.nodes[n].engine.entries("w_name") for n in NODES} == before
        pipe.check(ts, ks.documents_at(ts))
        done = ts


async def test_earlier_frames_of_a_restarted_indexer_are_refused(pipe: Pipe) -> None:  # noqa: F811
    rng = random.Random(12)
    ks = FakeKeyspace(num_partitions=8)
    random_workload(ks, rng, 40)
    ts1 = ks.ts()
    await _round(pipe, pipe.by_node(ks.changes(None, ts1)), ts1)
    random_workload(ks, rng, 40)
    ts2 = ks.ts()
    rows = pipe.by_node(ks.changes(ts1, ts2))["n1"]
    half = len(rows) // 2
    # A big batch: the first frame goes ahead alone, then the indexer restarts.
    first = DeliverKeyVersions(keyspace=KS, batch_id=99, rows=rows[:half])
    old = (await pipe.ask("n1", first, Delivered)).incarnation
    n1 = pipe.nodes["n1"]
    await n1.stop()
    await n1.start()
    last = DeliverAndStabilise(
        keyspace=KS,
        batch_id=99,
        rows=rows[half:],
        ts=dict(ts2.to_wire()),
        index_ids=pipe.ids,
        incarnation=old,
    )
    with pytest.raises(ShardexError) as err:
        await pipe.ask("n1", last, Stabilised)
    assert err.value.code == ErrorCode.STALE_DELIVERY and err.value.details["expected"] == old
    listed = await pipe.list("n1")
    assert all(s.queued == 0 and s.applied == ts1.to_wire() for s in listed)  # nothing taken
    # The pipeline's retry delivers the whole batch to the new incarnation: exact.
    await _round(pipe, pipe.by_node(ks.changes(ts1, ts2)), ts2)
    pipe.check(ts2, ks.documents_at(ts2))
    assert incarnations(pipe)["n1"] != old
