"""Deliver ahead, the indexers' side, over real TCP with the oracle (``index/delivery.py``):
rows queued ahead of their batch (some beyond its end) plus the rest in the batch's
``DeliverAndStabilise`` give exactly the state at the batch's end, the rows beyond it applied
only by a later stabilise; an indexer restarted after an early delivery refuses the round and
the fallback (drop what is queued above the start, deliver all) is exact; rows of a branch the
batch is not on, queued early, are dropped by the fallback and would win over the batch's own
rows without it. Reuses the harness of ``test_index_delivery.py``."""

from __future__ import annotations

import asyncio
import copy
import random

import pytest

from shardex.api.delivery import (
    Delivered,
    DeliverKeyVersions,
)
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.testing.index import FakeKeyspace, random_workload
from tests.integration.index.test_deliver_and_stabilise import _round
from tests.integration.index.test_index_delivery import KS, NODES, Pipe, incarnations, pipe  # noqa: F401


async def _early(p: Pipe, by_node: dict[str, list], inc: dict[str, str]) -> None:
    for node in NODES:
        msg = DeliverKeyVersions(
            keyspace=KS, batch_id=-1, rows=by_node.get(node, []), incarnation=inc[node]
        )
        assert (await p.ask(node, msg, Delivered)).incarnation == inc[node]


async def _start(pipe: Pipe, rng: random.Random) -> tuple[FakeKeyspace, Timestamp]:  # noqa: F811
    ks = FakeKeyspace(num_partitions=8)
    random_workload(ks, rng, 50)
    t1 = ks.ts()
    await _round(pipe, pipe.by_node(ks.changes(None, t1)), t1)
    pipe.check(t1, ks.documents_at(t1))
    return ks, t1


def _mid(a: Timestamp, b: Timestamp) -> Timestamp:
    """Halfway between ``a`` and ``b`` in every partition: a batch end inside early rows."""
    return Timestamp({p: ((a.seqno(p) + e.seqno) // 2, e.uuid) for p, e in b.items()})


async def test_early_rows_plus_the_rest_are_the_batch_and_beyond_waits(pipe: Pipe) -> None:  # noqa: F811
    rng = random.Random(21)
    ks, t1 = await _start(pipe, rng)
    random_workload(ks, rng, 60)
    t3 = ks.ts()
    t2 = _mid(t1, t3)
    random_workload(ks, rng, 30)
    t4 = ks.ts()
    inc = incarnations(pipe)
    # Read ahead to t3 and delivered early; the batch ends at t2 (below t3) and the next at
    # t4: each round sends only what was not delivered early.
    await _early(pipe, pipe.by_node(ks.changes(t1, t3)), inc)
    await _round(pipe, {}, t2, earlier=inc)
    pipe.check(t2, ks.documents_at(t2))  # rows in (t2, t3] stayed queued
    queued = [s.queued for n in NODES for s in await pipe.list(n)]
    assert sum(queued) > 0
    await _round(pipe, pipe.by_node(ks.changes(t3, t4)), t4, earlier=inc)
    pipe.check(t4, ks.documents_at(t4))


async def test_restart_after_the_early_delivery_falls_back_exactly(pipe: Pipe) -> None:  # noqa: F811
    rng = random.Random(22)
    ks, t1 = await _start(pipe, rng)
    random_workload(ks, rng, 60)
    t2 = ks.ts()
    inc = incarnations(pipe)
    await _early(pipe, pipe.by_node(ks.changes(t1, t2)), inc)
    n1 = pipe.nodes["n1"]
    await n1.stop()
    await n1.start()  # a new incarnation: the early rows are gone
    with pytest.raises(ShardexError) as err:
        await _round(pipe, {}, t2, earlier=inc)
    assert err.value.code == ErrorCode.STALE_DELIVERY
    # An early delivery naming the old process is refused too, before queueing anything.
    stale = DeliverKeyVersions(
        keyspace=KS, batch_id=-1, rows=pipe.by_node(ks.changes(t1, t2))["n1"], incarnation=inc["n1"]
    )
    with pytest.raises(ShardexError) as err:
        await pipe.ask("n1", stale, Delivered)
    assert err.value.code == ErrorCode.STALE_DELIVERY
    assert all(s.queued == 0 for s in await pipe.list("n1"))
    # The retry: drop above the start everywhere, deliver the whole batch.
    drop = {p: t1.seqno(p) for p in t2}
    await _round(pipe, pipe.by_node(ks.changes(t1, t2)), t2, drop=drop)
    pipe.check(t2, ks.documents_at(t2))


async def _lost_branch(pipe: Pipe, *, drop: bool) -> None:  # noqa: F811
    rng = random.Random(23)
    ks, t1 = await _start(pipe, rng)
    lost = copy.deepcopy(ks)
    random_workload(lost, random.Random(1), 60)  # read ahead, then lost (a rollback to t1)
    await _early(pipe, pipe.by_node(lost.changes(t1, lost.ts())), incarnations(pipe))
    ks.uuid += 1  # the surviving branch: other records at the same seqnos
    random_workload(ks, random.Random(2), 60)
    t2 = ks.ts()
    await _round(
        pipe,
        pipe.by_node(ks.changes(t1, t2)),
        t2,
        drop={p: t1.seqno(p) for p in t2} if drop else None,
    )
    pipe.check(t2, ks.documents_at(t2))


async def test_early_rows_of_a_lost_branch_are_dropped_by_the_fallback(pipe: Pipe) -> None:  # noqa: F811
    await _lost_branch(pipe, drop=True)


async def test_without_the_drop_the_lost_branch_would_win(pipe: Pipe) -> None:  # noqa: F811
    # Why the fallback drops: the batch's rows at seqnos already queued are re-deliveries
    # to the slices, so the lost branch's versions would be applied instead.
    with pytest.raises(AssertionError):
        await _lost_branch(pipe, drop=False)


async def test_an_early_delivery_is_decided_after_its_reply(pipe: Pipe) -> None:  # noqa: F811
    """The indexer acknowledges early rows, then decides them on its I/O thread
    (``index/slice_decisions.py``): by the round, the slices hold a decision for every queued docid
    and the round's stabilise only writes them; the result is the oracle's."""
    rng = random.Random(5)
    ks, t1 = await _start(pipe, rng)
    random_workload(ks, rng, 40)
    t2 = ks.ts()
    inc = incarnations(pipe)
    await _early(pipe, pipe.by_node(ks.changes(t1, t2)), inc)
    queued = decided = 0
    deadline = asyncio.get_running_loop().time() + 10
    while asyncio.get_running_loop().time() < deadline:
        engines = [ix.svc.engine for ix in pipe.nodes.values() if ix.svc is not None]
        slices = [s for e in engines for s in e.slices()]
        queued = sum(
            len({r[4] for q in s._queue.by_partition.values() for r in q.values()}) for s in slices
        )
        decided = sum(len(s._decided or ()) for s in slices)
        if queued and decided == queued:
            break
        await asyncio.sleep(0.01)
    assert queued and decided == queued, (queued, decided)
    await _round(pipe, {}, t2, earlier=inc)
    pipe.check(t2, ks.documents_at(t2))
