"""``RoundSender`` (``pipeline/rounds/sender.py``): a round's rows sent as
``DeliverKeyVersions`` frames while the batch is still projected, then each node's
``DeliverAndStabilise`` and the timekeeper's check (a stand-in that publishes what it is
asked). Over real TCP to the two-indexer harness of ``test_index_delivery.py``, with the
oracle: the round is
exact; its first frames carry the round's drop (rows a previous job queued above the start on
another branch do not survive); an indexer restarted between the early frames and the
stabilise refuses it (STALE_DELIVERY) and applies nothing, and a retry of the whole round is
exact; a node that got only early frames is stabilised too."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from shardex.api.delivery import Delivered, DeliverKeyVersions, Stabilised
from shardex.api.timekeeper import AdvanceStability, StabilityAdvanced
from shardex.client.loop_thread import LoopThread
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.net import ConnectionPool, TcpTransport
from shardex.pipeline.rounds.machine import DeliveryReport, RoundEnds
from shardex.pipeline.rounds.sender import RoundSender, run_round
from shardex.testing.index import FakeKeyspace, random_workload
from tests.integration.index.test_index_delivery import (  # noqa: F401
    KS,
    NODES,
    SECRET,
    Pipe,
    incarnations,
    pipe,
)


class _Router:
    def __init__(self, harness: Pipe) -> None:
        self.pipe = harness
        self.pool = ConnectionPool(TcpTransport(), SECRET, name="sender")
        self.request_timeout = 10.0

    async def address(self, node: str) -> str:
        return self.pipe.nodes[node].address  # current: a restarted node has a new port


class _Timekeeper:
    """The timekeeper as the round's connection to it: publishes every index it is asked
    for, and keeps what it was asked."""

    def __init__(self) -> None:
        self.asked: list[AdvanceStability] = []

    async def request(self, msg: AdvanceStability, timeout: float, expect: Any) -> Any:
        self.asked.append(msg)
        return StabilityAdvanced(
            keyspace=msg.keyspace, ts=msg.ts, published=list(msg.index_ids), items_count={}
        )


class _Client:
    """What the pipeline's round uses of a ``Client`` (its ``rpc``): the loop, ``run``, the
    router's pool (here straight to the harness's indexers) and the connection to the
    timekeeper (a stand-in)."""

    def __init__(self, harness: Pipe) -> None:
        self._io = LoopThread("sender-test")
        self.loop = self._io.loop
        self.router = _Router(harness)
        self.rpc = self
        self.timekeeper = _Timekeeper()

    async def connection(self) -> _Timekeeper:
        return self.timekeeper

    def replies(self) -> dict[str, Stabilised]:
        """The indexers' replies the last round brought the timekeeper."""
        return dict(self.timekeeper.asked[-1].stabilised or {})

    def run(self, coro: Any) -> Any:
        return self._io.run(coro)

    def close(self) -> None:
        self._io.run(self.router.pool.close())
        self._io.stop()


@pytest.fixture
def client(pipe: Pipe) -> Iterator[_Client]:  # noqa: F811
    c = _Client(pipe)
    try:
        yield c
    finally:
        c.close()


def _plan(harness: Pipe) -> dict[str, list[str]]:
    return {n: list(harness.ids) for n in NODES}


def _end(harness: Pipe, ts: Timestamp, by_node: Mapping[str, list[Any]]) -> RoundEnds:
    return RoundEnds(ts=ts, by_node=by_node, plan=_plan(harness), index_ids=list(harness.ids))


def _parts(by_node: Mapping[str, list[Any]], k: int) -> list[dict[str, list[Any]]]:
    """``by_node`` cut into ``k`` consecutive pieces per node (the batch's groups)."""
    out: list[dict[str, list[Any]]] = [{} for _ in range(k)]
    for node, rows in by_node.items():
        step = -(-len(rows) // k)
        for i in range(k):
            out[i][node] = rows[i * step : (i + 1) * step]
    return out


async def _round(
    pipe: Pipe,  # noqa: F811
    client: _Client,
    by_node: Mapping[str, list[Any]],
    ts: Timestamp,
    k: int,
    drop: dict[int, int] | None = None,
) -> tuple[DeliveryReport, dict[str, Stabilised]]:
    """Send all pieces but the last early (from a thread, as the batch does), then finish."""
    pipe.batch += 1
    sender = RoundSender(client, KS, pipe.batch, drop_above=drop)  # type: ignore[arg-type]
    parts = _parts(by_node, k)
    for part in parts[:-1]:
        await asyncio.to_thread(sender.send, part)
    done = await asyncio.to_thread(sender.finish, _end(pipe, ts, parts[-1]))
    assert done.published == list(pipe.ids) and done.ts == ts
    return done.report, client.replies()


async def test_early_frames_then_the_stabilise_are_exact(pipe: Pipe, client: _Client) -> None:  # noqa: F811
    rng = random.Random(21)
    ks = FakeKeyspace(num_partitions=8)
    done: Timestamp | None = None
    for k in (1, 2, 4):
        random_workload(ks, rng, rng.randint(60, 120))
        ts = ks.ts()
        sent = pipe.by_node(ks.changes(done, ts))
        report, replies = await _round(pipe, client, sent, ts, k)
        assert set(replies) == set(NODES)
        assert report.accepted == sum(len(v) for v in sent.values()) and report.unknown == 0
        for node, reply in replies.items():
            assert reply.incarnation == pipe.nodes[node].service.incarnation
            assert all(a.applied == ts.to_wire() for a in reply.acks)
        pipe.check(ts, ks.documents_at(ts))
        done = ts


async def _first_round(
    pipe: Pipe,  # noqa: F811
    client: _Client,
    rng: random.Random,
    n: int,
) -> tuple[FakeKeyspace, Timestamp]:
    """A keyspace of ``n`` random mutations, stabilised by one round: (it, its TS)."""
    ks = FakeKeyspace(num_partitions=8)
    random_workload(ks, rng, n)
    ts = ks.ts()
    await _round(pipe, client, pipe.by_node(ks.changes(None, ts)), ts, 1)
    return ks, ts


async def test_the_first_frame_drops_what_was_queued_above_the_start(
    pipe: Pipe,  # noqa: F811
    client: _Client,
) -> None:
    ks, ts1 = await _first_round(pipe, client, random.Random(22), 80)
    # A previous job queued rows of another history with the seqnos this round will send
    # (a branch a rollback cut off): kept, they would win over this round's (same seqnos).
    other = FakeKeyspace(num_partitions=8, log={p: list(v) for p, v in ks.log.items()})
    other.docs = dict(ks.docs)
    random_workload(ks, random.Random(23), 80)
    random_workload(other, random.Random(24), 80)
    ts2 = ks.ts()
    for node, rows in pipe.by_node(other.changes(ts1, other.ts())).items():
        msg = DeliverKeyVersions(keyspace=KS, batch_id=-1, rows=rows)
        await pipe.ask(node, msg, Delivered)
    drop = {p: ts1.seqno(p) for p in range(8)}
    await _round(pipe, client, pipe.by_node(ks.changes(ts1, ts2)), ts2, 3, drop=drop)
    pipe.check(ts2, ks.documents_at(ts2))


async def test_an_indexer_restarted_after_early_frames_refuses_the_stabilise(
    pipe: Pipe,  # noqa: F811
    client: _Client,
) -> None:
    rng = random.Random(25)
    ks, ts1 = await _first_round(pipe, client, rng, 60)
    random_workload(ks, rng, 100)
    ts2 = ks.ts()
    rows = pipe.by_node(ks.changes(ts1, ts2))
    first, last = _parts(rows, 2)
    pipe.batch += 1
    sender = RoundSender(client, KS, pipe.batch)  # type: ignore[arg-type]
    await asyncio.to_thread(sender.send, first)
    old = dict(incarnations(pipe))
    # The early frames reached the first incarnation before the restart.
    await asyncio.to_thread(lambda: client.run(_acked(sender)))
    n1 = pipe.nodes["n1"]
    await n1.stop()
    await n1.start()
    with pytest.raises(ShardexError) as err:
        await asyncio.to_thread(sender.finish, _end(pipe, ts2, last))
    assert err.value.code == ErrorCode.STALE_DELIVERY
    listed = await pipe.list("n1")
    assert all(s.queued == 0 and s.applied == ts1.to_wire() for s in listed)  # nothing taken
    assert incarnations(pipe)["n1"] != old["n1"]
    # The batch's retry: every row again, with a new sender.
    await asyncio.to_thread(run_round, client, KS, pipe.batch, _end(pipe, ts2, rows))  # type: ignore[arg-type]
    pipe.check(ts2, ks.documents_at(ts2))


async def _acked(sender: RoundSender) -> None:
    await asyncio.gather(*sender._tasks)  # the frames sent so far, answered


async def test_a_round_whose_rows_all_went_early_stabilises_after_them(
    pipe: Pipe,  # noqa: F811
    client: _Client,
) -> None:
    rng = random.Random(26)
    ks = FakeKeyspace(num_partitions=8)
    random_workload(ks, rng, 100)
    ts = ks.ts()
    rows = pipe.by_node(ks.changes(None, ts))
    pipe.batch += 1
    sender = RoundSender(client, KS, pipe.batch)  # type: ignore[arg-type]
    for part in _parts(rows, 3):
        await asyncio.to_thread(sender.send, part)
    # Nothing left for the last message: each node's stabilise still follows its frames.
    done = await asyncio.to_thread(sender.finish, _end(pipe, ts, {}))
    report, replies = done.report, client.replies()
    assert set(replies) == set(NODES)
    assert report.accepted == sum(len(v) for v in rows.values())
    pipe.check(ts, ks.documents_at(ts))
