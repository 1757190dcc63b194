"""Partition migration from the client: ``rebalance``, ``move_partition``, status.

A part of ``Client`` kept apart for module size; it reaches the cluster only through the
client's ``RpcSession`` (``self.rpc``). Starting a rebalance is a quick
coordinator op (the plan is recorded in the cluster state and the master migrates in the
background); these calls then poll ``GetRebalance`` until it is over, so a client that
disconnects does not stop a rebalance, and one that reconnects can watch it again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from shardex.api.rebalance import GetRebalance, MovePartition, RebalanceReply, StartRebalance
from shardex.client.types import RebalanceResult, rebalance_from
from shardex.errors import ErrorCode, ShardexError

if TYPE_CHECKING:
    from shardex.client.rpc_session import RpcSession


def _request_id() -> str:
    return uuid.uuid4().hex


class RebalanceError(ShardexError):
    """Some move of a rebalance did not complete (``result`` says which and why); the
    others did. A failed move's partition stays on its source, serving."""

    def __init__(self, result: RebalanceResult) -> None:
        self.result = result
        bad = result.failed
        shown = "; ".join(
            f"{m.keyspace}/{m.partition} {m.source}->{m.target}: {m.status} ({m.error})"
            for m in bad[:5]
        )
        super().__init__(
            f"{result.kind} {result.id} {result.state}: {len(result.moved)} moved, "
            f"{len(bad)} not: {shown}",
            code=ErrorCode.PARTIAL_FAILURE,
            details={"id": result.id, "moved": len(result.moved), "failed": len(bad)},
        )


class RebalanceOps:
    """Partition migration: a base of ``Client``, which provides ``rpc``."""

    rpc: RpcSession

    def rebalance(
        self,
        *,
        max_parallel: int = 2,
        rate_limit: int = 0,
        eject: Sequence[str] = (),
        on_progress: Callable[[RebalanceResult], None] | None = None,
        poll_interval: float = 0.2,
    ) -> RebalanceResult:
        """Move partitions so every keyspace is balanced over the data nodes that are up
        (e.g. after ``shardex cluster add-node``), while reads, writes and change streams
        go on; returns when done. ``max_parallel`` migrations run at a time, each copy at
        most ``rate_limit`` bytes/s (0: unlimited). If a rebalance is already running this
        waits for it and then balances whatever it left. Raises ``RebalanceError`` (with
        ``.result``) if some move did not complete; a failed move leaves its partition
        where it was, serving. It also rebuilds the index copies a lost indexer took with
        it (``num_replica``) on the up indexers, from the copies that survived.

        ``eject`` (node names): remove those nodes from the cluster instead. Their index
        slices move to other indexers first, then every copy they hold (active or replica)
        moves to the other data nodes, writes going on, then they leave the member list
        (they may keep running, holding nothing: stop them). A manager node, an unknown
        name, a down node with active copies, or a node holding an index slice no other
        indexer can take is refused (BAD_REQUEST / NODE_UNAVAILABLE naming it); if the
        eject does not complete (``RebalanceError``) the nodes stay members, and running it
        again finishes it."""
        names = [eject] if isinstance(eject, str) else list(eject)
        for name in names:
            if not isinstance(name, str) or not name.strip():
                raise ShardexError(
                    f"eject takes node names, got {name!r}",
                    code=ErrorCode.BAD_REQUEST,
                    details={"eject": repr(eject), "hint": 'e.g. eject=["node3"]'},
                )

        def start() -> RebalanceReply:
            msg = StartRebalance(
                request_id=_request_id(),
                max_parallel=max_parallel,
                rate_limit=rate_limit,
                eject=names,
            )
            return self.rpc.call(msg, RebalanceReply)

        reply = start()
        if reply.attached:
            self._wait_rebalance(reply, on_progress, poll_interval)
            reply = start()
        return self._wait_rebalance(reply, on_progress, poll_interval)

    def move_partition(
        self,
        keyspace: str,
        partition: int,
        target: str,
        *,
        rate_limit: int = 0,
        wait: bool = True,
        on_progress: Callable[[RebalanceResult], None] | None = None,
    ) -> RebalanceResult:
        """Migrate one partition to data node ``target`` (admin and tests); with ``wait``
        returns when it is done (``RebalanceError`` if it failed), else at once."""
        msg = MovePartition(
            keyspace=keyspace,
            partition=partition,
            target=target,
            request_id=_request_id(),
            rate_limit=rate_limit,
        )
        reply = self.rpc.call(msg, RebalanceReply)
        if not wait:
            assert reply.record is not None
            return rebalance_from(reply.record, reply.phases)
        return self._wait_rebalance(reply, on_progress, 0.1)

    def rebalance_status(self) -> RebalanceResult | None:
        """The running or last rebalance (or partition move), None if there never was one."""
        reply = self.rpc.call(GetRebalance(), RebalanceReply)
        return None if reply.record is None else rebalance_from(reply.record, reply.phases)

    def _wait_rebalance(
        self,
        reply: RebalanceReply,
        on_progress: Callable[[RebalanceResult], None] | None,
        poll_interval: float,
    ) -> RebalanceResult:
        assert reply.record is not None
        wanted = reply.record.id
        result = rebalance_from(reply.record, reply.phases)
        while True:
            if on_progress is not None:
                on_progress(result)
            if result.state != "running":
                break
            time.sleep(poll_interval)
            reply = self.rpc.call(GetRebalance(), RebalanceReply)
            if reply.record is None or reply.record.id != wanted:
                break  # replaced by a newer one: ours is over; report what we saw last
            result = rebalance_from(reply.record, reply.phases)
        self.rpc.run(self.rpc.router.refresh())
        if result.state != "done" and result.state != "running":
            raise RebalanceError(result)
        return result
