"""The node (RN) side of a paginated scan under elasticity: one batch of one shard.

``ElasticShardScanner.scan_batch`` is the elastic-scan algorithm's RN procedure (section B,
"The RN"):

* a base-shard batch first checks that no partition it handed to a virtual scan has come
  back (QUERY_STATE: its skipped entries would be lost), then adds to the virtual-scan map
  every base partition of this shard that now lives elsewhere, with the current resume key;
* a virtual-shard batch first makes sure the partition has arrived here (waits a bounded
  time for an in-flight move, else QUERY_STATE);
* it then returns entries in key order from the resume key, skipping every entry whose
  partition is not a target (base shard: base partitions minus the map; virtual: the one);
* a partition that left during the batch makes a base batch repeat from the saved state
  (its skipped entries would otherwise fall behind the resume key) and a virtual batch fail
  with QUERY_STATE (a second move within one query); a partition that came back during a
  base batch fails it with QUERY_STATE.

Deviation from the algorithm's pseudo-code (a bug there): the "returned partition" check looks
only at map entries whose *base* owner is this shard. The pseudo-code checks every map entry, which
wrongly fails a normal scan of a base shard that is also the target of a virtual scan (a
partition moving between two existing shards, the common rebalance).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.scan.continuation import VirtualScan, clone_vs
from shardex.scan.elastic_migrations import MigrationManager, RuntimeControlBlock
from shardex.scan.paging_wire import PageRow, ShardBatch, ShardBatchResult

Entry = tuple[bytes, int, Any]  # (key, partition, value)


class TopologyLookup(Protocol):
    """The topology history: every published topology by number (the algorithm's system table)."""

    @property
    def latest(self) -> Topology | None: ...

    def get(self, seq_num: int) -> Topology: ...


class ShardStore(Protocol):
    """One scan's view of a node's storage (its spans applied)."""

    def entries_after(
        self, after: bytes | None, partitions: frozenset[int] | None = None
    ) -> Iterator[Entry]:
        """Entries with key > ``after`` (all if None) in key order, of partitions open now.

        Lazy: whether a partition is open is decided as each entry is reached, as a
        storage engine that closes a partition's files mid-scan would behave.
        ``partitions``: a hint, the only partitions the batch wants (a store may skip the
        others' storage entirely; the scanner filters by partition anyway).
        """
        ...


StoreFactory = Callable[[bytes], ShardStore]  # scan spec -> this node's view for the scan


@dataclass
class BatchContext:
    """What a row hook sees: the batch in progress (tests inject migrations from here)."""

    node: str
    request: ShardBatch
    vsm: list[VirtualScan]  # the working map (after this batch's detection)
    targets: frozenset[int]
    rows: int  # rows returned so far in this attempt
    attempt: int


RowHook = Callable[[BatchContext], Awaitable[None]]


def query_state(message: str, **details: Any) -> ShardexError:
    return ShardexError(
        message,
        code=ErrorCode.QUERY_STATE,
        details={
            **details,
            "hint": "the scan overlapped more than one migration of a partition; restart it",
        },
    )


class ElasticShardScanner:
    """Serves ``ShardBatch`` requests for this node's shard."""

    def __init__(
        self,
        node: str,
        migrations: MigrationManager,
        topologies: TopologyLookup,
        store_for: StoreFactory,
        *,
        max_local_repeats: int = 2,
        arrival_timeout: float = 10.0,
        topology_timeout: float = 10.0,
        on_row: RowHook | None = None,
    ) -> None:
        self.node = node
        self.migrations = migrations
        self._topologies = topologies
        self._store_for = store_for
        # Past this many local repeats the batch returns no rows and the saved state, and the
        # proxy's caller asks again (the algorithm's consumption-limit branch).
        self.max_local_repeats = max_local_repeats
        self.arrival_timeout = arrival_timeout
        self.topology_timeout = topology_timeout
        self.on_row = on_row

    async def scan_batch(self, req: ShardBatch) -> ShardBatchResult:
        if req.shard != self.node:
            raise ShardexError(
                f"batch for shard {req.shard!r} sent to node {self.node!r}",
                code=ErrorCode.STALE_TOPOLOGY,
                details={"shard": req.shard, "node": self.node},
            )
        if req.limit <= 0:
            raise ShardexError(
                f"batch limit must be positive, got {req.limit}",
                code=ErrorCode.BAD_REQUEST,
                details={"limit": req.limit},
            )
        base = self._topologies.get(req.base_topo)
        # The algorithm's wait condition 1: this node has seen the base topology (or a later one).
        seen = await self.migrations.wait_until(
            lambda: self.migrations.known_topo >= base.seq_num, self.topology_timeout
        )
        if not seen:
            raise ShardexError(
                f"node {self.node} has not seen topology {base.seq_num}",
                code=ErrorCode.STALE_TOPOLOGY,
                details={"base_topo": base.seq_num, "known": self.migrations.known_topo},
            )
        store = self._store_for(req.scan)
        vsm = [clone_vs(v) for v in req.vsm]
        attempt = 0
        while True:
            rcb = RuntimeControlBlock()
            self.migrations.register(rcb)
            try:
                if req.vs_pid < 0:
                    targets = self._prepare_base_scan(base, req.resume, vsm)
                else:
                    targets = await self._prepare_virtual_scan(base, req)
                saved_vsm = [clone_vs(v) for v in vsm]  # the algorithm's savedCK
                rows, resume, exhausted = await self._execute(
                    store, req, vsm, frozenset(targets), attempt
                )
            finally:
                self.migrations.unregister(rcb)
            if req.vs_pid < 0 and rcb.restored & set(base.partitions_of(self.node)):
                raise query_state(
                    f"partition(s) {sorted(rcb.restored)} returned to {self.node} during a "
                    "batch after a failed migration",
                    partitions=sorted(rcb.restored),
                    shard=self.node,
                )
            moved = rcb.migrated & targets
            if not moved:
                return ShardBatchResult(
                    rows=rows, resume=resume, vsm=vsm, exhausted=exhausted, repeats=attempt
                )
            if req.vs_pid >= 0:
                raise query_state(
                    f"partition {req.vs_pid} left {self.node} during its virtual scan "
                    "(it migrated twice during the query)",
                    partition=req.vs_pid,
                    shard=self.node,
                )
            # Entries of the moved partitions were skipped from the moment they left while
            # the resume key moved on: redo the batch from the saved state, whose detection
            # step now hands those partitions to virtual scans starting at req.resume.
            if attempt >= self.max_local_repeats:
                return ShardBatchResult(
                    rows=[], resume=req.resume, vsm=saved_vsm, exhausted=False, repeats=attempt
                )
            attempt += 1
            vsm = saved_vsm

    def _prepare_base_scan(
        self, base: Topology, resume: bytes | None, vsm: list[VirtualScan]
    ) -> set[int]:
        mine = base.partitions_of(self.node)
        for vs in vsm:
            # Only partitions whose base shard is this one can "come back" here, and only
            # an unfinished virtual scan (ordered scans mark theirs done) still needs them.
            if (
                not vs.done
                and base.assignment.get(vs.pid) == self.node
                and self.migrations.is_open(vs.pid)
            ):
                raise query_state(
                    f"partition {vs.pid} came back to {self.node} after the scan handed it "
                    f"to a virtual scan on {vs.shard} (a failed migration)",
                    partition=vs.pid,
                    shard=self.node,
                )
        official = self._topologies.latest or base
        known = {vs.pid for vs in vsm}
        for pid in mine:
            if pid in known:
                continue
            where = self.migrations.where_is(pid, official)
            if where == self.node:
                continue
            if not where:
                raise query_state(
                    f"partition {pid} is neither on {self.node} nor recorded as moved",
                    partition=pid,
                    shard=self.node,
                )
            vsm.append(VirtualScan(pid=pid, shard=where, resume=resume))
            known.add(pid)
        return set(mine) - known

    async def _prepare_virtual_scan(self, base: Topology, req: ShardBatch) -> set[int]:
        pid = req.vs_pid
        vs = next((v for v in req.vsm if v.pid == pid), None)
        if vs is None or vs.shard != self.node or pid not in base.assignment:
            raise ShardexError(
                f"virtual scan of partition {pid} on {self.node} is not in the scan's map",
                code=ErrorCode.BAD_REQUEST,
                details={"partition": pid, "shard": self.node},
            )
        # ensureMigratedPartition: an in-flight move completes within the wait; a failed or
        # second move does not, and the query must not return a partial partition.
        arrived = await self.migrations.wait_until(
            lambda: self.migrations.is_open(pid), self.arrival_timeout
        )
        if not arrived:
            raise query_state(
                f"partition {pid} did not arrive on {self.node} (its migration failed or it "
                "moved again during the query)",
                partition=pid,
                shard=self.node,
            )
        return {pid}

    async def _execute(
        self,
        store: ShardStore,
        req: ShardBatch,
        vsm: list[VirtualScan],
        targets: frozenset[int],
        attempt: int,
    ) -> tuple[list[PageRow], bytes | None, bool]:
        rows: list[PageRow] = []
        hook = self.on_row
        ctx = BatchContext(self.node, req, vsm, targets, 0, attempt) if hook else None
        for key, pid, value in store.entries_after(req.resume, targets):
            if pid not in targets:
                continue
            rows.append(PageRow(key=key, partition=pid, value=value))
            if len(rows) >= req.limit:
                return rows, key, False
            if hook is not None and ctx is not None:
                ctx.rows = len(rows)
                await hook(ctx)
        return rows, None, True
