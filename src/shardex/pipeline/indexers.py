"""The pipeline's calls to indexers and the timekeeper, from the driver or a Spark worker.

Every call goes through the process's ``Client``, by its RPC session (``Client.rpc``: its loop
thread and its connection pool to named nodes). Loads to several indexers run in parallel;
frames are cut at ``MAX_ROWS_PER_FRAME`` rows so one message stays far below the frame limit. A
maintenance batch's stability round is ``rounds/sender.py``'s (one round trip per indexer, then
the timekeeper); ``advance_stability`` here asks the timekeeper alone (idle rounds, builds).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.delivery import (
    MAX_ROWS_PER_FRAME,
    LoadBegin,
    LoadBegun,
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
from shardex.index.keyversion import KeyVersion
from shardex.meta.state import StateContext
from shardex.net.messages import Message

__all__ = [
    "ADVANCE_TIMEOUT",
    "advance_stability",
    "index_state",
    "list_slices",
    "load_begin",
    "load_chunks",
    "load_finish",
    "to_node",
]

M = TypeVar("M", bound=Message)

# A stabilise fans out to every indexer and fsyncs: allow for a slow disk under load.
ADVANCE_TIMEOUT = 30.0
# A load's end sorts and writes a whole slice (an SST for big ones).
LOAD_FINISH_TIMEOUT = 600.0


async def to_node(
    client: Client, node: str, msg: Message, expect: type[M], timeout: float | None = None
) -> M:
    router = client.rpc.router
    conn = await router.pool.get(await router.address(node), router.request_timeout)
    return await conn.request(msg, timeout or router.request_timeout, expect=expect)


def _frames(rows: Sequence[Any]) -> list[Sequence[Any]]:
    return [rows[i : i + MAX_ROWS_PER_FRAME] for i in range(0, len(rows), MAX_ROWS_PER_FRAME)]


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
    publish; with ``stabilised`` (the indexers' replies to a round's ``DeliverAndStabilise``)
    only to check and publish."""
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


def load_begin(
    client: Client, ts0: Timestamp, slices: Sequence[tuple[str, int, str]]
) -> list[LoadBegun]:
    """Open every listed (index, slice, node) load at ``ts0``, in parallel, before any chunk
    (``LoadBegin``: it also restarts slices an earlier attempt finished)."""
    wire = dict(ts0.to_wire())

    async def go() -> list[LoadBegun]:
        return await asyncio.gather(
            *(
                to_node(client, node, LoadBegin(index_id=i, partition=p, ts0=wire), LoadBegun)
                for i, p, node in slices
            )
        )

    return client.rpc.run(go())


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
