"""The pipeline's calls to indexers and the timekeeper, from the driver or a Spark worker.

Every call goes through the process's ``Client``, by its RPC session (``Client.rpc``: its loop
thread and its connection pool to named nodes). Deliveries to several indexers run in parallel;
frames are cut at ``MAX_ROWS_PER_FRAME`` rows so one message stays far below the frame limit. A
maintenance batch makes one round trip per indexer (``deliver_and_stabilise``) and one to the
timekeeper (``advance_stability`` with the replies).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.delivery import (
    MAX_ROWS_PER_FRAME,
    DeliverAndStabilise,
    Delivered,
    DeliverKeyVersions,
    LoadChunk,
    LoadChunkAck,
    LoadFinish,
    LoadFinished,
    Stabilised,
)
from shardex.api.index import ListSlices, SliceInfo, SliceList
from shardex.api.timekeeper import AdvanceStability, StabilityAdvanced
from shardex.client import Client
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.keyversion import KeyVersion
from shardex.meta.state import StateContext
from shardex.net.messages import Message

__all__ = [
    "DeliveryReport",
    "RoundSender",
    "advance_stability",
    "deliver_and_stabilise",
    "index_state",
    "list_slices",
    "load_chunks",
    "load_finish",
]

M = TypeVar("M", bound=Message)

# A stabilise fans out to every indexer and fsyncs: allow for a slow disk under load.
ADVANCE_TIMEOUT = 30.0
# A load's end sorts and writes a whole slice (an SST for big ones).
LOAD_FINISH_TIMEOUT = 600.0


class DeliveryReport:
    """What one batch's delivery did: node -> incarnation it reached, and row counts."""

    __slots__ = ("accepted", "dropped", "incarnations", "unknown")

    def __init__(self) -> None:
        self.incarnations: dict[str, str] = {}
        self.accepted = 0
        self.dropped = 0
        self.unknown = 0

    def add(self, reply: Delivered | Stabilised) -> None:
        seen = self.incarnations.setdefault(reply.node, reply.incarnation)
        if seen != reply.incarnation:
            # The indexer restarted between two frames of this batch: the first ones died
            # with the old process, and a stabilise naming the new one would not notice.
            raise ShardexError(
                f"indexer {reply.node} restarted during the delivery (incarnation {seen}, "
                f"then {reply.incarnation})",
                code=ErrorCode.STALE_DELIVERY,
                details={"node": reply.node, "hint": "deliver the whole batch again"},
            )
        self.accepted += reply.accepted
        self.dropped += reply.dropped
        self.unknown += reply.unknown


async def to_node(
    client: Client, node: str, msg: Message, expect: type[M], timeout: float | None = None
) -> M:
    router = client.rpc.router
    conn = await router.pool.get(await router.address(node), router.request_timeout)
    return await conn.request(msg, timeout or router.request_timeout, expect=expect)


def _frames(rows: Sequence[Any]) -> list[Sequence[Any]]:
    return [rows[i : i + MAX_ROWS_PER_FRAME] for i in range(0, len(rows), MAX_ROWS_PER_FRAME)]


class RoundSender:
    """One round's frames to the indexers. ``send`` (from any thread, without waiting)
    queues rows as ``DeliverKeyVersions`` frames while the round's later rows are still being
    read and projected (``rounds/streamed.py``); ``finish`` sends each node its last rows with
    the stabilise in one ``DeliverAndStabilise`` once its earlier frames were acknowledged.
    A node's frames go one after the other: the first carries the round's ``drop_above``,
    every later one names the incarnation that took the first (a restarted indexer refuses
    it: STALE_DELIVERY, and the round is delivered again as a whole)."""

    def __init__(
        self,
        client: Client,
        keyspace: str,
        batch_id: int,
        *,
        drop_above: Mapping[int, int] | None = None,
    ) -> None:
        self.client = client
        self.keyspace = keyspace
        self.batch_id = batch_id
        self.report = DeliveryReport()
        # node -> the incarnation its next frame names (none: any): the one that took the
        # node's first frame of this round.
        self._incarnation: dict[str, str] = {}
        self._drop = None if drop_above is None else dict(drop_above)
        self._dropped: set[str] = set()  # nodes whose first frame carried the drop
        # node -> the task sending its frames so far (on the client's loop only).
        self._chains: dict[str, asyncio.Task[None]] = {}
        self._loop = client.rpc.loop

    def send(self, by_node: Mapping[str, Sequence[KeyVersion]]) -> None:
        """Queue these rows on their nodes, after what was sent before (returns at once; a
        failure surfaces in ``finish``)."""
        rows = {n: v for n, v in by_node.items() if v}
        if rows:
            self._loop.call_soon_threadsafe(self._schedule, rows)

    def _schedule(self, by_node: Mapping[str, Sequence[KeyVersion]]) -> None:
        for node, rows in by_node.items():
            task = self._loop.create_task(self._chain(node, self._chains.get(node), rows))
            # Retrieved here so an abandoned round logs no "never retrieved"; ``finish``
            # still raises it (awaiting a failed task re-raises).
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._chains[node] = task

    async def _chain(
        self, node: str, before: asyncio.Task[None] | None, rows: Sequence[KeyVersion]
    ) -> None:
        if before is not None:
            await before  # its failure fails every later frame of the node
        for frame in _frames(rows):
            await self._frame(node, frame)

    def _take_drop(self, node: str) -> dict[int, int] | None:
        if self._drop is None or node in self._dropped:
            return None
        self._dropped.add(node)
        return self._drop

    async def _frame(self, node: str, rows: Sequence[KeyVersion]) -> None:
        msg = DeliverKeyVersions(
            keyspace=self.keyspace,
            batch_id=self.batch_id,
            rows=list(rows),
            incarnation=self._incarnation.get(node, ""),
            drop_above=self._take_drop(node),
        )
        got = await to_node(self.client, node, msg, Delivered)
        self.report.add(got)
        self._incarnation[node] = got.incarnation

    def finish(
        self,
        ts: Timestamp,
        by_node: Mapping[str, Sequence[KeyVersion]],
        plan: Mapping[str, Sequence[str]],
        moving: Mapping[str, Mapping[str, list[int]]] | None = None,
        slices: Mapping[str, Mapping[str, list[int]]] | None = None,
    ) -> tuple[DeliveryReport, dict[str, Stabilised]]:
        """The round's last rows and the stabilise at ``ts``: see ``deliver_and_stabilise``.
        Every node that took frames from ``send`` is stabilised too."""
        replies: dict[str, Stabilised] = {}
        wire = dict(ts.to_wire())

        async def one(node: str) -> None:
            before = self._chains.get(node)
            if before is not None:
                await before
            frames = _frames(by_node.get(node, ())) or [[]]
            for frame in frames[:-1]:
                await self._frame(node, frame)
            last = DeliverAndStabilise(
                keyspace=self.keyspace,
                batch_id=self.batch_id,
                rows=list(frames[-1]),
                ts=wire,
                index_ids=list(plan.get(node, ())),
                incarnation=self._incarnation.get(node, ""),
                moving=dict((moving or {}).get(node, {})),
                slices=None if slices is None else dict(slices.get(node, {})),
                drop_above=self._take_drop(node),
            )
            reply = await to_node(self.client, node, last, Stabilised, ADVANCE_TIMEOUT)
            self.report.add(reply)
            if node in plan or node in by_node or node in self._chains:
                replies[node] = reply

        async def all_nodes() -> None:
            nodes = set(plan) | set(by_node) | set(self._chains)
            await asyncio.gather(*(one(n) for n in sorted(nodes)))

        self.client.rpc.run(all_nodes())
        return self.report, replies

    def abandon(self) -> None:
        """The round will not be finished (its batch failed): stop sending its frames."""

        def cancel() -> None:
            for task in self._chains.values():
                task.cancel()

        with contextlib.suppress(RuntimeError):  # the client's loop is closed: nothing runs
            self._loop.call_soon_threadsafe(cancel)


def deliver_and_stabilise(
    client: Client,
    keyspace: str,
    batch_id: int,
    ts: Timestamp,
    by_node: Mapping[str, Sequence[KeyVersion]],
    plan: Mapping[str, Sequence[str]],
    moving: Mapping[str, Mapping[str, list[int]]] | None = None,
    slices: Mapping[str, Mapping[str, list[int]]] | None = None,
    *,
    drop_above: Mapping[int, int] | None = None,
    sender: RoundSender | None = None,
) -> tuple[DeliveryReport, dict[str, Stabilised]]:
    """One round trip per indexer (in parallel): each node of ``plan`` (node -> the index
    ids it hosts) gets its rows and the stabilise at ``ts`` in one ``DeliverAndStabilise``;
    rows beyond one frame go ahead as ``DeliverKeyVersions`` and the last frame names the
    incarnation that took them. ``moving``: node -> index id -> partitions it receives as an
    index move's target. ``slices``: node -> index id -> the partitions its round
    stabilises there, from the topology the rows were routed by (an indexer leaves its other
    slices alone). Returns the delivery counts and each node's reply (for
    ``advance_stability(stabilised=...)``).

    ``drop_above``: every node of the round first forgets its queued versions of these data
    partitions above these seqnos (rows queued by a round this query does not know of:
    ``rounds/cleaned.py``). ``sender``: the round's frames sent so far (``RoundSender.send``),
    which then holds ``drop_above``; ``by_node`` is what they left."""
    if sender is None:
        sender = RoundSender(client, keyspace, batch_id, drop_above=drop_above)
    return sender.finish(ts, by_node, plan, moving, slices)


def advance_stability(
    client: Client,
    keyspace: str,
    ts: Timestamp,
    index_ids: Sequence[str],
    *,
    batch_id: int = -1,
    incarnations: Mapping[str, str] | None = None,
    timekeeper: str = "",
    moving: Mapping[str, Mapping[int, str]] | None = None,
    stabilised: Mapping[str, Stabilised] | None = None,
) -> StabilityAdvanced:
    """Ask the timekeeper on node ``timekeeper`` (the coordinator master, so every batch of a
    keyspace meets the same one; "" = the node the client talks to) to stabilise and
    publish; with ``stabilised`` (``deliver_and_stabilise``'s replies) only to check and
    publish."""
    msg = AdvanceStability(
        keyspace=keyspace,
        ts=dict(ts.to_wire()),
        index_ids=list(index_ids),
        batch_id=batch_id,
        incarnations=dict(incarnations or {}),
        moving={i: dict(m) for i, m in (moving or {}).items()},
        stabilised=None if stabilised is None else dict(stabilised),
    )

    async def go() -> StabilityAdvanced:
        if timekeeper:
            return await to_node(client, timekeeper, msg, StabilityAdvanced, ADVANCE_TIMEOUT)
        conn = await client.rpc.connection()
        return await conn.request(msg, ADVANCE_TIMEOUT, expect=StabilityAdvanced)

    return client.rpc.run(go())


def index_state(client: Client) -> StateContext:
    """The master's committed keyspaces, indexes, index topologies and rebalance record
    (not the data topologies or the dedup table: this runs every few hundred
    milliseconds)."""
    sections = ["keyspaces", "indexes", "index_topologies", "rebalance"]  # index moves too
    msg = StateRequest(sections=sections, fresh=True)
    return client.rpc.call(msg, StateReply).state


def list_slices(client: Client, nodes: Sequence[str], index_id: str | None) -> list[SliceInfo]:
    """Every slice (of one index) on ``nodes``, asked in parallel."""

    async def go() -> list[SliceList]:
        msg = ListSlices(index_id=index_id)
        return await asyncio.gather(*(to_node(client, n, msg, SliceList) for n in nodes))

    out: list[SliceInfo] = []
    for reply in client.rpc.run(go()):
        out.extend(s for s in reply.slices if index_id is None or s.index_id == index_id)
    return out


def load_chunks(
    client: Client,
    ts0: Timestamp,
    chunks: Mapping[tuple[str, int, str], Sequence[KeyVersion]],
    docs: Mapping[tuple[str, int, str], int],
) -> dict[str, set[str]]:
    """Initial build: send each (index, slice, node)'s rows as ``LoadChunk`` frames.
    Returns node -> the indexer incarnations that acknowledged (more than one: it restarted
    and lost what it held, so the build must start over)."""
    wire = dict(ts0.to_wire())
    seen: dict[str, set[str]] = {}

    async def one(key: tuple[str, int, str], rows: Sequence[KeyVersion]) -> None:
        index_id, partition, node = key
        n_docs = docs.get(key, 0)
        for frame in _frames(rows) or [[]]:
            msg = LoadChunk.columnar(index_id, partition, wire, frame, n_docs)
            n_docs = 0  # counted once per key
            ack = await to_node(client, node, msg, LoadChunkAck)
            seen.setdefault(node, set()).add(ack.incarnation)

    async def go() -> None:
        await asyncio.gather(*(one(k, chunks.get(k, [])) for k in set(chunks) | set(docs)))

    client.rpc.run(go())
    return seen


def load_finish(
    client: Client,
    ts0: Timestamp,
    slices: Sequence[tuple[str, int, str]],
    incarnations: Mapping[str, str],
) -> list[LoadFinished]:
    """End every listed (index, slice, node) load at ``ts0``, in parallel. ``incarnations``:
    node -> the indexer incarnation that took its chunks (a restarted one refuses)."""
    wire = dict(ts0.to_wire())

    async def go() -> list[LoadFinished]:
        return await asyncio.gather(
            *(
                to_node(
                    client,
                    node,
                    LoadFinish(
                        index_id=i, partition=p, ts0=wire, incarnation=incarnations.get(node, "")
                    ),
                    LoadFinished,
                    LOAD_FINISH_TIMEOUT,
                )
                for i, p, node in slices
            )
        )

    return client.rpc.run(go())
