"""``RoundSender`` (``pipeline/indexers.py``): a round's rows sent as ``DeliverKeyVersions``
frames while the batch is still projected, then each node's ``DeliverAndStabilise``. Over real
TCP to the two-indexer harness of ``test_index_delivery.py``, with the oracle: the round is
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

from shardex.api.delivery import Delivered, DeliverKeyVersions
from shardex.client.loop_thread import LoopThread
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.net import ConnectionPool, TcpTransport
from shardex.pipeline.indexers import RoundSender, deliver_and_stabilise
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


class _Client:
    """What the pipeline's indexer calls use of a ``Client`` (its ``rpc``): the loop, ``run``
    and the router's pool (here straight to the harness's indexers)."""

    def __init__(self, harness: Pipe) -> None:
        self._io = LoopThread("sender-test")
        self.loop = self._io.loop
        self.router = _Router(harness)
        self.rpc = self

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
) -> tuple[Any, dict[str, Any]]:
    """Send all pieces but the last early (from a thread, as the batch does), then finish."""
    pipe.batch += 1
    sender = RoundSender(client, KS, pipe.batch, drop_above=drop)  # type: ignore[arg-type]
    parts = _parts(by_node, k)
    for part in parts[:-1]:
        await asyncio.to_thread(sender.send, part)
    return await asyncio.to_thread(sender.finish, ts, parts[-1], _plan(pipe))


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
        await asyncio.to_thread(sender.finish, ts2, last, _plan(pipe))
    assert err.value.code == ErrorCode.STALE_DELIVERY
    listed = await pipe.list("n1")
    assert all(s.queued == 0 and s.applied == ts1.to_wire() for s in listed)  # nothing taken
    assert incarnations(pipe)["n1"] != old["n1"]
    # The batch's retry: every row again, with a new sender.
    await asyncio.to_thread(deliver_and_stabilise, client, KS, pipe.batch, ts2, rows, _plan(pipe))
    pipe.check(ts2, ks.documents_at(ts2))


async def _acked(sender: RoundSender) -> None:
    for task in list(sender._chains.values()):
        await task


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
    report, replies = await asyncio.to_thread(sender.finish, ts, {}, _plan(pipe))
    assert set(replies) == set(NODES)
    assert report.accepted == sum(len(v) for v in rows.values())
    pipe.check(ts, ks.documents_at(ts))
