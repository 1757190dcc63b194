"""Whether a data node serves a request now, and how its refusals name the right owner.

Shared by the data service's write path, read path and gathers (``writes.py``, ``reads.py``,
``gather.py``): a node failed over serves nothing until recovered; a node that cannot hear a
majority of the managers does not serve keyspaces with replicas (``lease.py``); a restarted
node waits (bounded) for its first reconcile to learn which of the two it is. Errors about a
partition get the owner the latest topology names, so a client with a stale topology
refreshes and retries.
"""

from __future__ import annotations

import asyncio
import contextlib

from shardex.api.errors import KeyspaceNotFound, not_my_partition
from shardex.data.lease import ServingLease
from shardex.data.placement import PlacementView
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.partitioning import partition_of

FIRST_RECONCILE_WAIT = 2.0  # seconds a restarted node's client requests wait to learn its role


class ServingGate:
    """The serving checks and error enrichment of one data node (module docstring)."""

    def __init__(
        self,
        *,
        name: str,
        placement: PlacementView,
        lease: ServingLease,
        reconciled: asyncio.Event,
    ) -> None:
        self.name = name
        self.placement = placement
        self.lease = lease
        self.reconciled = reconciled  # set after the node's first successful reconcile
        # Set when the cluster state says this node was failed over: it serves nothing (its
        # copies may hold writes the cluster never acknowledged) until recovered.
        self.failed_over = False

    # --- errors ------------------------------------------------------------------------------

    def enrich(self, exc: ShardexError) -> ShardexError:
        """NOT_MY_PARTITION gets the owner the latest topology names (a hint: the client
        refreshes its topology anyway)."""
        if exc.code is ErrorCode.NOT_MY_PARTITION and "owner_hint" not in exc.details:
            ks, p = exc.details.get("keyspace"), exc.details.get("partition")
            if isinstance(ks, str) and isinstance(p, int):
                exc.details["owner_hint"] = self.placement.owner_hint(ks, p)
        return exc

    def not_here(self, exc: KeyspaceNotFound, keyspace: str, docid: object) -> ShardexError:
        """The keyspace is unknown here; if the cluster has it, this node simply owns none
        of it (yet), which the client must hear as NOT_MY_PARTITION, not as "no keyspace"."""
        state = self.placement.cached
        meta = None if state is None else state.keyspaces.get(keyspace)
        if meta is None or not isinstance(docid, str) or not docid:
            return exc
        p = partition_of(docid, meta.num_partitions)
        return self.enrich(not_my_partition(keyspace, p, "absent"))

    # --- serving -----------------------------------------------------------------------------

    async def wait(self, keyspace: str) -> None:
        """A restarted node learns whether it was failed over meanwhile from its first
        reconcile: client requests wait for it (bounded, so a node no manager answers
        still serves what it holds), then pass ``check`` and the lease."""
        if not self.reconciled.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FIRST_RECONCILE_WAIT):
                    await self.reconciled.wait()
        self.check_serving(keyspace)

    def serves_now(self, keyspace: str) -> bool:
        """``wait`` without waiting: False while the first reconcile is still to come (the
        caller then takes the waiting path); raises as ``wait`` does."""
        if not self.reconciled.is_set():
            return False
        self.check_serving(keyspace)
        return True

    def check_serving(self, keyspace: str) -> None:
        """NODE_FAILED_OVER, or NODE_UNAVAILABLE without the lease of a replicated keyspace."""
        self.check()
        if self.replicated(keyspace) and not self.lease.check():
            raise ShardexError(
                f"node {self.name} cannot reach a majority of the managers: it does not serve "
                f"{keyspace!r}, whose partitions a failover may be moving to replicas",
                code=ErrorCode.NODE_UNAVAILABLE,
                details={"node": self.name, "keyspace": keyspace, "reason": "no_lease"},
            )

    def replicated(self, keyspace: str) -> bool:
        state = self.placement.cached
        meta = None if state is None else state.keyspaces.get(keyspace)
        return meta is not None and meta.num_replicas > 0

    def check(self) -> None:
        """NODE_FAILED_OVER while this node is failed over."""
        if self.failed_over:
            raise ShardexError(
                f"node {self.name} was failed over: it serves nothing until recovered",
                code=ErrorCode.NODE_FAILED_OVER,
                details={
                    "node": self.name,
                    "hint": f"shardex recovery {self.name}, then shardex rebalance",
                },
            )
