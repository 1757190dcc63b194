"""Query stability for a SQL statement: the one TS every leaf of its plan reads.

not_bounded reads the tips (no TS). at_plus waits for the caller's vector (on the current
branches); request_plus for the keyspace's high seqnos read after the statement arrived.
Each leaf's node answers ``WaitStability`` once its slices hold a snapshot covering that,
and the oldest answer, one every node holds a snapshot at, is pinned for all (the
initiator's own slices are asked in-process).

request_plus in one round (``speculate`` switch): the high seqnos are a round trip of their
own before the wait can be asked. Instead, every leaf node is asked at once for its slices'
newest common snapshot, and reads the high seqnos of the data partitions it owns on arrival
(``WaitStability.seqnos_of``, as a request_plus scan's ``ScanSlices`` does); the data nodes
that run no leaf are asked in the node's shared round meanwhile. When every snapshot
answered covers the seqnos so gathered, the oldest is the TS the two rounds would have
pinned. Otherwise the leaves are asked again to wait for those seqnos: two rounds, as
without it. With the pipeline keeping up, one round is the common case.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Final

from shardex.api.scan import AT_PLUS, REQUEST_PLUS, StabilityAt, WaitStability
from shardex.core.timestamp import Timestamp
from shardex.errors import ShardexError
from shardex.scan.at_plus import on_current_branches
from shardex.scan.coordinator import ScanCoordinator, oldest_common
from shardex.sql.exec.failover import FAILOVER
from shardex.sql.exec.plan import PhysicalPlan

__all__ = ["WAIT_MARGIN", "StatementStability"]

WAIT_MARGIN: Final = 10.0  # a leaf node's reply beyond the wait itself

Seqnos = Mapping[int, tuple[int, int]]


class StatementStability:
    def __init__(self, scan: ScanCoordinator) -> None:
        self.scan = scan

    async def pin(
        self,
        plan: PhysicalPlan,
        consistency: str,
        at: Mapping[int, tuple[int, int]] | None,
        timeout: float,
    ) -> Timestamp | None:
        """The TS ``plan``'s leaves read (None: the tips)."""
        if not plan.leaves or consistency not in (REQUEST_PLUS, AT_PLUS):
            return None
        assert plan.keyspace is not None and plan.record is not None
        view = self.scan.view
        if consistency == AT_PLUS:
            assert at is not None
            wait_for = await on_current_branches(view, plan.keyspace, Timestamp.from_wire(at))
        elif plan.tuning["speculate"]:
            ts = await self._one_round(plan, timeout)
            if isinstance(ts, Timestamp):
                return ts
            wait_for = ts[1]
        else:
            # Shared with the concurrent statements and scans of this node (one HighSeqnos
            # per data node per round trip, read after each of them arrived).
            wait_for = await view.shared_high_seqnos(plan.keyspace)
        leaves = plan.leaves
        tss = await asyncio.gather(
            *(self._ask(plan, lf.node, lf.partitions, wait_for, timeout) for lf in leaves)
        )
        return oldest_common([t for t, _ in tss])

    async def _one_round(
        self, plan: PhysicalPlan, timeout: float
    ) -> Timestamp | tuple[None, Timestamp]:
        """request_plus with the seqnos riding in the leaves' wait: the TS to pin, or (None,
        the high seqnos) when a snapshot answered does not cover them."""
        assert plan.keyspace is not None
        view = self.scan.view
        keyspace = plan.keyspace
        owners = await view.data_owners(keyspace)
        leaf_nodes = {leaf.node for leaf in plan.leaves}
        # Remote leaf nodes read their own partitions' seqnos on arrival; this node's own
        # are read in-process by the round, which asks the data nodes without a leaf.
        ride = {n: ps for n, ps in owners.items() if n in leaf_nodes and n != view.name}
        others = view.shared_partial_high_seqnos(keyspace, ride.keys(), owners)
        try:
            answers = await asyncio.gather(
                *(
                    self._ask(plan, leaf.node, leaf.partitions, None, timeout, ride.get(leaf.node))
                    for leaf in plan.leaves
                )
            )
        except BaseException:
            others.cancel()
            raise
        known = dict(await others)
        for _, seqnos in answers:
            if seqnos:
                known.update(seqnos)
        wait_for = await view.high_seqnos(keyspace, known=known)  # asks what is missing
        tss = [t for t, _ in answers]
        if all(t.covers(wait_for) for t in tss):
            return oldest_common(tss)
        return None, wait_for

    async def _ask(
        self,
        plan: PhysicalPlan,
        node: str,
        parts: list[int],
        wait_for: Timestamp | None,
        timeout: float,
        seqnos_of: list[int] | None = None,
    ) -> tuple[Timestamp, Seqnos | None]:
        """``node``'s slices' snapshot covering ``wait_for`` (None: the newest now), and the
        high seqnos of ``seqnos_of`` it read on arrival (None: not asked or not read)."""
        assert plan.record is not None and plan.keyspace is not None
        index_id = plan.record.id
        local = self.scan.local_index
        if node == self.scan.name and local is not None:  # no loopback connection
            return await local.stable_ts(index_id, parts, wait_for, timeout), None
        req = WaitStability(
            index_id=index_id,
            partitions=parts,
            wait_for=None if wait_for is None else dict(wait_for.to_wire()),
            timeout=timeout,
            seqnos_keyspace=plan.keyspace if seqnos_of else "",
            seqnos_of=seqnos_of or [],
        )
        try:
            reply = await self.scan.pool.request(
                self.scan.view.address(node), req, timeout + WAIT_MARGIN, expect=StabilityAt
            )
        except ShardexError as exc:
            if exc.code in FAILOVER:
                exc.details.setdefault("indexer", node)  # another copy may stand in
            raise
        return Timestamp.from_wire(reply.ts), reply.high_seqnos
