"""High seqnos, history checks and keyspace stats: answered by any node, gathered from the
owners.

A request naming its partitions is an owner's share, answered from memory (the partitions'
metadata): ``HighSeqnos`` and ``CheckHistory`` in the receive callback, since every
request_plus scan asks them of each data node it does not read. A request for every
partition of a keyspace is gathered here from the owners the latest topology names, in
parallel, retrying the partitions nobody answered for (a hand-over in flight) with a
refreshed cluster state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import shardex.data.streams as streams
from shardex.api.data import (
    CheckHistory,
    HighSeqnos,
    HighSeqnosReply,
    HistoryChecked,
    HistoryPoint,
    KeyspaceStats,
    KeyspaceStatsReply,
    PartitionStat,
)
from shardex.api.errors import KeyspaceNotFound, not_my_partition
from shardex.api.records import STATE_ACTIVE
from shardex.data.engine import DataEngine
from shardex.data.placement import PlacementView, latest_topology
from shardex.data.serving import ServingGate
from shardex.errors import ErrorCode, ShardexError
from shardex.net import Connection, ConnectionPool

T = TypeVar("T")

FAN_OUT_TIMEOUT = 5.0
FAN_OUT_ATTEMPTS = 4  # a partition in hand-over is missing for a moment: retry the gather


class OwnerGather:
    """Handlers of HighSeqnos, CheckHistory and KeyspaceStats (module docstring)."""

    def __init__(
        self,
        *,
        engine: Callable[[], DataEngine],
        placement: PlacementView,
        pool: ConnectionPool,
        gate: ServingGate,
    ) -> None:
        self._engine = engine  # a getter: the engine exists only while the service runs
        self.placement = placement
        self.pool = pool
        self.gate = gate
        self.name = gate.name

    # --- this node's share ---------------------------------------------------------------------

    def local_high_seqnos(self, keyspace: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """(high seqno, uuid) of those of ``partitions`` this node serves, from memory (the
        partitions' metadata): a request_plus scan asks it of every owner, and its own
        node's scan coordinator calls it in-process. A node failed over serves none: its
        copies still say active at the old branch's uuid, and an asker with a topology from
        before the failover (the pipeline's stream asks owners directly) would take that
        answer as current and never look for the promoted copies; answering none of them
        makes it refresh and ask the gathered RPC (``pipeline/source/seqnos.py``)."""
        if self.gate.failed_over:
            return {}
        try:
            return self._engine().partition_seqnos(keyspace, partitions)
        except KeyspaceNotFound:
            if self.placement.keyspace_exists(keyspace):
                return {}
            raise

    def _local_stats(self, keyspace: str, partitions: list[int]) -> list[PartitionStat]:
        eng = self._engine()
        try:
            held = set(eng.partitions(keyspace))
        except KeyspaceNotFound:
            if self.placement.keyspace_exists(keyspace):
                return []
            raise
        out = []
        for p in sorted(held & set(partitions)):
            info = eng.partition_info(keyspace, p)
            if info.state == STATE_ACTIVE:
                out.append(
                    PartitionStat(
                        p, self.name, info.doc_count, info.high_seqno, info.uuid, info.state
                    )
                )
        return out

    # --- routes --------------------------------------------------------------------------------

    def on_high_seqnos(
        self, msg: HighSeqnos, conn: Connection
    ) -> HighSeqnosReply | Awaitable[HighSeqnosReply]:
        if msg.partitions is not None:  # an owner's share: from memory, answered inline
            return HighSeqnosReply(entries=self.local_high_seqnos(msg.keyspace, msg.partitions))
        return self._gather_high_seqnos(msg)  # every partition: gathered, in a task

    def on_check_history(self, msg: CheckHistory, conn: Connection) -> HistoryChecked:
        """Each point against its partition's failover log, from memory (``CheckHistory``);
        NOT_MY_PARTITION for a partition this node does not hold active."""
        self.gate.check()
        out = []
        for p, seqno, uuid in msg.points:
            try:
                info = self._engine().partition_info(msg.keyspace, p)
            except ShardexError as exc:
                raise self.gate.enrich(exc) from None
            if info.state != STATE_ACTIVE:
                raise self.gate.enrich(not_my_partition(msg.keyspace, p, info.state))
            # A token of the current branch is in its history whatever its seqno (one above
            # the high seqno is a write not made yet, or a bogus token: the wait says so).
            rollback = None if uuid == info.uuid else streams.rollback_seqno(info, seqno, uuid)
            out.append(HistoryPoint(p, rollback, info.uuid, info.high_seqno))
        return HistoryChecked(points=out)

    async def _gather_high_seqnos(self, msg: HighSeqnos) -> HighSeqnosReply:
        async def remote(address: str, parts: list[int]) -> dict[int, tuple[int, int]]:
            req = HighSeqnos(keyspace=msg.keyspace, partitions=parts)
            reply = await self.pool.request(address, req, FAN_OUT_TIMEOUT, expect=HighSeqnosReply)
            return reply.entries

        entries = await self._gather(msg.keyspace, self.local_high_seqnos, remote)
        return HighSeqnosReply(entries=entries)

    async def on_stats(self, msg: KeyspaceStats, conn: Connection) -> KeyspaceStatsReply:
        if msg.partitions is not None:
            return KeyspaceStatsReply(partitions=self._local_stats(msg.keyspace, msg.partitions))

        def local(keyspace: str, parts: list[int]) -> dict[int, PartitionStat]:
            return {s.partition: s for s in self._local_stats(keyspace, parts)}

        async def remote(address: str, parts: list[int]) -> dict[int, PartitionStat]:
            req = KeyspaceStats(keyspace=msg.keyspace, partitions=parts)
            reply = await self.pool.request(
                address, req, FAN_OUT_TIMEOUT, expect=KeyspaceStatsReply
            )
            return {s.partition: s for s in reply.partitions}

        stats = await self._gather(msg.keyspace, local, remote)
        return KeyspaceStatsReply(partitions=[stats[p] for p in sorted(stats)])

    # --- the gather ----------------------------------------------------------------------------

    async def _gather(
        self,
        keyspace: str,
        local: Callable[[str, list[int]], dict[int, T]],
        remote: Callable[[str, list[int]], Awaitable[dict[int, T]]],
    ) -> dict[int, T]:
        """Ask every owner (in parallel) for its partitions of ``keyspace``; retry the
        partitions nobody answered for (a hand-over in flight) with a refreshed state."""
        state = await self.placement.state()
        if keyspace not in state.keyspaces:
            state = await self.placement.refresh()
        meta = state.keyspaces.get(keyspace)
        topo = latest_topology(state, keyspace)
        if meta is None or topo is None:
            raise KeyspaceNotFound(
                f"keyspace {keyspace!r} not found", details={"keyspace": keyspace}
            )
        out: dict[int, T] = {}
        failures: dict[str, str] = {}
        for attempt in range(FAN_OUT_ATTEMPTS):
            missing = [p for p in range(meta.num_partitions) if p not in out]
            by_owner: dict[str, list[int]] = {}
            for p in missing:
                by_owner.setdefault(topo.assignment.get(p, self.name), []).append(p)
            owners = sorted(by_owner)
            calls = [self._ask(keyspace, o, by_owner[o], local, remote) for o in owners]
            failures = {}
            for owner, res in zip(
                owners, await asyncio.gather(*calls, return_exceptions=True), strict=True
            ):
                if isinstance(res, BaseException):
                    failures[owner] = str(res)
                else:
                    out.update(res)
            if len(out) == meta.num_partitions:
                return out
            await asyncio.sleep(0.05 * 2**attempt)
            state = await self.placement.refresh()
            topo = latest_topology(state, keyspace) or topo
        missing = [p for p in range(meta.num_partitions) if p not in out]
        raise ShardexError(
            f"no owner answered for {len(missing)} partition(s) of {keyspace!r}",
            code=ErrorCode.NODE_UNAVAILABLE if failures else ErrorCode.NOT_MY_PARTITION,
            details={"keyspace": keyspace, "partitions": missing[:50], "failures": failures},
        )

    async def _ask(
        self,
        keyspace: str,
        owner: str,
        parts: list[int],
        local: Callable[[str, list[int]], dict[int, T]],
        remote: Callable[[str, list[int]], Awaitable[dict[int, T]]],
    ) -> dict[int, T]:
        if owner == self.name:
            return local(keyspace, parts)
        return await remote(self.placement.address(owner), parts)
