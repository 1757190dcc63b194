"""Pinned paginated index scans across index-partition moves, and their snapshot leases.

* A pinned scan (request_plus / at_plus: one stability TS for every page) reads each
  partition where its base topology put it, also after the partition moved: the new owner's
  copy starts at the move's T1, after the pinned TS, and has no snapshot at it
  (``elastic_adapters_index.batch_view``). Tip scans still follow the move.
* The source keeps a handed-over slice while a lease holds it and drops it once the lease
  is released (``slice_copy``); a page (or a renewal) that then needs it answers
  SNAPSHOT_TOO_OLD naming the move.
* Renewals (``paging_leases``): a snapshot gone fails the renewal, a failure in transit is
  tried once more, a release stays best effort; a failed renewal cancels its page
  (``paging_store_proxy``), so no row of it is returned.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from shardex.api.slice_copy import IndexPartitionSwitched
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import ACTIVE
from shardex.scan.elastic_adapters_index import batch_view
from shardex.scan.elastic_node import ElasticShardScanner
from shardex.scan.paging_leases import (
    LEASE,
    RELEASE,
    RENEW,
    LeaseSnapshots,
    SnapshotsLeased,
    lease_on_nodes,
    serve_lease,
)
from shardex.scan.paging_store_proxy import _with_renewal
from shardex.scan.paging_store_spec import PagedScanSpec, decode_spec, spec_ranges
from shardex.scan.paging_wire import ShardBatch, ShardBatchResult
from shardex.testing.elastic_checker import check_paginated_scan
from tests.unit.index.test_index_service import FakeCoordinator, record, service, state_of
from tests.unit.scan.test_elastic_adapters import Rig, pages_of


def _code(exc: pytest.ExceptionInfo[ShardexError]) -> ErrorCode:
    return exc.value.code


# --- the pages ---------------------------------------------------------------------------


@pytest.mark.parametrize("ordered", [False, True])
def test_a_pinned_scan_reads_a_moved_partition_at_its_source(tmp_path: Path, ordered: bool) -> None:
    rig = Rig(tmp_path)
    try:
        pinned = rig.ts
        spec = PagedScanSpec("ks", "ix", [], snapshot=dict(pinned.to_wire()))
        want = rig.expected(pinned)

        def between(n: int) -> None:
            if n == 1:
                rig.write(20)  # the copies below start after the pinned TS
                rig.move(0, "C")  # from the base shard being scanned
            if n == 3:
                rig.move(3, "C")
                rig.move(1, "B")  # between two base shards

        pages = pages_of(rig, spec, [7, 3, 11], ordered=ordered, between=between)
        check_paginated_scan(pages, want, ordered=ordered)
        # The new owners could not have served it: no snapshot at the pinned TS there.
        for p, node in ((0, "C"), (1, "B")):
            with pytest.raises(ShardexError) as err:
                rig.engines[node].slice("ix", p).scan(None, snapshot_ts=pinned)
            assert _code(err) is ErrorCode.SNAPSHOT_TOO_OLD
        # A tip scan started now follows the moves to the new owners.
        tips = PagedScanSpec("ks", "ix", [])
        after = pages_of(rig, tips, [9], ordered=ordered, between=lambda n: None)
        check_paginated_scan(after, rig.expected(rig.ks.ts()), ordered=ordered)
    finally:
        rig.close()


def test_a_pinned_page_whose_source_dropped_the_slice_names_the_move(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        spec = PagedScanSpec("ks", "ix", [], snapshot=dict(rig.ts.to_wire()))
        moved: dict[tuple[str, int], str] = {}

        async def call(node: str, req: ShardBatch) -> ShardBatchResult:
            s = decode_spec(req.scan)
            base = rig.history.get(req.base_topo)
            wanted = [req.vs_pid] if req.vs_pid >= 0 else base.partitions_of(node)
            mm, store = batch_view(
                rig.engines[node], rig.migrations[node], node, "ix", spec_ranges(s),
                rig.ts, rig.history.latest.seq_num, wanted,  # type: ignore[union-attr]
                lambda i, p: moved.get((i, p)),
            )  # fmt: skip
            scanner = ElasticShardScanner(node, mm, rig.history, lambda _s: store)
            return await scanner.scan_batch(req)

        rig.call = call  # type: ignore[method-assign]
        source = rig.history.latest.assignment[0]  # type: ignore[union-attr]

        def between(n: int) -> None:
            if n == 1:  # moved, then its lease expired and the source dropped the slice
                rig.write(5)
                rig.move(0, "C")
                moved[("ix", 0)] = "C"
                rig.engines[source].drop_slice("ix", 0)

        with pytest.raises(ShardexError) as err:
            pages_of(rig, spec, [1], ordered=True, between=between)
        assert _code(err) is ErrorCode.SNAPSHOT_TOO_OLD
        details = err.value.details
        assert (details["partition"], details["node"], details["moved_to"]) == (0, source, "C")
        assert "restart the scan" in details["hint"]
    finally:
        rig.close()


# --- the source keeps a leased slice ------------------------------------------------------


def _switched(index_id: str, grace: float) -> IndexPartitionSwitched:
    return IndexPartitionSwitched(
        migration_id="mv-1", index_id=index_id, partition=1, source="me", target="other",
        topology_seq=2, grace=grace,
    )  # fmt: skip


def _lease(
    index_id: str, mode: str, ts: Timestamp | None, parts: list[int], lease_id: str = "scan-1"
) -> LeaseSnapshots:
    wire = None if ts is None else dict(ts.to_wire())
    return LeaseSnapshots(
        index_id=index_id, partitions=parts, lease_id=lease_id, mode=mode, ts=wire
    )


async def _until(cond: Any, what: str, bound: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while not cond():
        assert loop.time() < deadline, f"not within {bound}s: {what}"
        await asyncio.sleep(0.02)


async def test_a_handed_over_slice_stays_while_leased_and_renewals_then_fail(
    tmp_path: Path,
) -> None:
    rec, topo = record("1.1.a", ACTIVE, {0: "me", 1: "me"})
    coord = FakeCoordinator(state_of(2, 9, (rec, topo)), state_of(2, 9, (rec, topo)))
    svc = service(tmp_path, coord)
    await svc.start()
    try:
        await svc.reconcile()
        ts = Timestamp({0: (1, 7)})
        svc.engine.stabilise(rec.id, ts)  # a snapshot at ts on both slices
        await serve_lease(svc, "me", _lease(rec.id, LEASE, ts, [0, 1]))
        await svc.slice_moves.on_switched(_switched(rec.id, 0.0), None)  # type: ignore[arg-type]
        for _ in range(5):  # the grace (0 s) is over; the lease keeps the slice
            await asyncio.sleep(0.02)
        assert {s.partition for s in svc.engine.slices(rec.id)} == {0, 1}
        # A retired slice grants no new lease, but renews the one it holds.
        with pytest.raises(ShardexError) as err:
            await serve_lease(svc, "me", _lease(rec.id, LEASE, ts, [1], lease_id="scan-2"))
        assert _code(err) is ErrorCode.STALE_TOPOLOGY
        renewed = await serve_lease(svc, "me", _lease(rec.id, RENEW, ts, [0, 1]))
        assert renewed.leased == [0, 1]
        # The scan ends: its release lets the handed-over slice go at once.
        await serve_lease(svc, "me", _lease(rec.id, RELEASE, None, [0, 1]))
        await _until(lambda: len(svc.engine.slices(rec.id)) == 1, "the retired slice dropped")
        # A renewal that needs the dropped slice fails with the move named.
        with pytest.raises(ShardexError) as err:
            await serve_lease(svc, "me", _lease(rec.id, RENEW, ts, [0, 1]))
        assert _code(err) is ErrorCode.SNAPSHOT_TOO_OLD
        assert err.value.details["moved_to"] == "other"
        # ... and one whose snapshot was released on a live slice too.
        with pytest.raises(ShardexError) as err:
            await serve_lease(svc, "me", _lease(rec.id, RENEW, Timestamp({0: (0, 7)}), [0]))
        assert _code(err) in (ErrorCode.SNAPSHOT_TOO_OLD, ErrorCode.INDEX_NOT_READY)
        # ... and one whose snapshot the ring let go (unleased, K newer ones) names the slice.
        await serve_lease(svc, "me", _lease(rec.id, RELEASE, None, [0]))
        for n in range(2, 3 + svc.engine.keep_snapshots):
            svc.engine.stabilise(rec.id, Timestamp({0: (n, 7)}))
        with pytest.raises(ShardexError) as err:
            await serve_lease(svc, "me", _lease(rec.id, RENEW, ts, [0]))
        assert _code(err) is ErrorCode.SNAPSHOT_TOO_OLD
        assert (err.value.details["partition"], err.value.details["node"]) == (0, "me")
        # A release stays best effort.
        released = await serve_lease(svc, "me", _lease(rec.id, RELEASE, None, [0, 1]))
        assert released.leased == [0]
    finally:
        await svc.stop()


# --- renewals over the wire ---------------------------------------------------------------


class FlakyAsk:
    """Answers ``LeaseSnapshots`` after failing the first ``failures`` calls with ``code``."""

    def __init__(self, failures: int, code: ErrorCode) -> None:
        self.failures = failures
        self.code = code
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, node: str, msg: LeaseSnapshots) -> SnapshotsLeased:
        self.calls.append((node, msg.mode))
        if len(self.calls) <= self.failures:
            raise ShardexError(f"{self.code.value} from {node}", code=self.code, details={})
        return SnapshotsLeased(node=node, leased=msg.partitions)


async def _renew(ask: FlakyAsk, mode: str = RENEW) -> None:
    ts = dict(Timestamp({0: (3, 1)}).to_wire())
    await lease_on_nodes(ask, {"n1": [0]}, "ix", "scan-1", mode, ts)


async def test_a_renewal_failing_in_transit_is_tried_once_more() -> None:
    ask = FlakyAsk(1, ErrorCode.TIMEOUT)
    await _renew(ask)
    assert ask.calls == [("n1", RENEW), ("n1", RENEW)]
    for code in (ErrorCode.CONNECTION_CLOSED, ErrorCode.NODE_UNAVAILABLE):
        ask = FlakyAsk(2, code)
        with pytest.raises(ShardexError) as err:
            await _renew(ask)
        assert _code(err) is code and len(ask.calls) == 2


async def test_a_renewal_finding_the_snapshot_gone_fails_at_once() -> None:
    ask = FlakyAsk(1, ErrorCode.SNAPSHOT_TOO_OLD)
    with pytest.raises(ShardexError) as err:
        await _renew(ask)
    assert _code(err) is ErrorCode.SNAPSHOT_TOO_OLD and len(ask.calls) == 1
    ask = FlakyAsk(1, ErrorCode.TIMEOUT)
    with pytest.raises(ShardexError):
        await _renew(ask, LEASE)  # the first lease is never retried here
    assert len(ask.calls) == 1
    ask = FlakyAsk(5, ErrorCode.SNAPSHOT_TOO_OLD)
    await _renew(ask, RELEASE)  # a release only logs
    assert len(ask.calls) == 1


async def test_a_failed_renewal_cancels_its_page_and_returns_no_row() -> None:
    page_started = asyncio.Event()
    page_cancelled = asyncio.Event()

    async def page() -> list[int]:
        page_started.set()
        try:
            await asyncio.Event().wait()  # a batch still reading
        except asyncio.CancelledError:
            page_cancelled.set()
            raise
        return [1]

    async def renew() -> None:
        await page_started.wait()
        raise ShardexError("gone", code=ErrorCode.SNAPSHOT_TOO_OLD, details={})

    with pytest.raises(ShardexError) as err:
        await _with_renewal(page(), renew())
    assert _code(err) is ErrorCode.SNAPSHOT_TOO_OLD and page_cancelled.is_set()

    async def renewed() -> None:
        return None

    async def rows() -> list[int]:
        return [1, 2]

    assert await _with_renewal(rows(), renewed()) == [1, 2]
