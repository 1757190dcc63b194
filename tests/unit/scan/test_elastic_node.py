"""The node side of elastic paging, case by case (the sim test covers them at random)."""

from __future__ import annotations

import asyncio

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.scan.continuation import ContinuationCodec
from shardex.scan.elastic_node import BatchContext
from shardex.scan.paging import PageCoordinator
from shardex.scan.paging_wire import PageRow, ShardBatch, ShardBatchResult
from shardex.testing.elastic_checker import check_paginated_scan
from shardex.testing.elastic_memory import ElasticMemoryCluster


def make(**scanner_kwargs):  # type: ignore[no-untyped-def]
    """Four partitions on A and B (two each), C empty; entry k belongs to partition k % 4."""
    assignment = {0: "A", 1: "A", 2: "B", 3: "B"}
    entries = [(bytes([k]), k % 4, k) for k in range(40)]
    cluster = ElasticMemoryCluster(assignment, entries, extra_nodes=["C"])
    for node in ("A", "B", "C"):
        cluster.scanner(node, **scanner_kwargs)

    async def call(node: str, req: ShardBatch) -> ShardBatchResult:
        return await cluster.scanners[node].scan_batch(req)

    coord = PageCoordinator(cluster.history, call, ContinuationCodec("node-tests"))
    return cluster, coord


async def drain(coord: PageCoordinator, size: int, ordered: bool, between=None):  # type: ignore[no-untyped-def]
    pages: list[list[PageRow]] = []
    cont = None
    while True:
        page = await coord.page(b"all", size, cont, ordered=ordered)
        pages.append(page.rows)
        cont = page.continuation
        if cont is None:
            return pages
        if between is not None:
            between(len(pages))


@pytest.mark.parametrize("ordered", [False, True])
def test_a_move_between_two_base_shards_is_exact(ordered: bool) -> None:
    """P0 moves A -> B (both base shards): B's normal scan must not take P0 for a partition
    that came back (the algorithm's pseudo-code would raise QUERY_STATE here)."""
    cluster, coord = make()

    def between(n: int) -> None:
        if n == 1:
            cluster.move(0, "B")

    pages = asyncio.run(drain(coord, 3, ordered, between))
    check_paginated_scan(pages, cluster.expected(), ordered=ordered)


@pytest.mark.parametrize("ordered", [False, True])
def test_a_move_during_a_batch_is_repeated_locally(ordered: bool) -> None:
    cluster, coord = make(max_local_repeats=1)
    seen: list[int] = []

    async def hook(ctx: BatchContext) -> None:
        if ctx.node == "A" and ctx.rows == 2 and cluster.owner[1] == "A":
            cluster.move(1, "C")
        seen.append(ctx.attempt)

    cluster.set_hook(hook)
    pages = asyncio.run(drain(coord, 7, ordered))
    check_paginated_scan(pages, cluster.expected(), ordered=ordered)
    assert 1 in seen  # the batch really ran a second attempt


def test_a_partition_back_after_a_failed_migration_ends_the_query() -> None:
    cluster, coord = make()

    async def run() -> None:
        first = await coord.page(b"all", 3, None, ordered=False)
        cluster.begin_move(0, "C")  # A releases P0...
        second = await coord.page(b"all", 3, first.continuation, ordered=False)
        assert second.continuation is not None  # ...the scan hands P0 to a virtual scan
        cluster.fail_move(0)  # ...and the move fails at C: P0 is back on A
        with pytest.raises(ShardexError) as info:
            await coord.page(b"all", 3, second.continuation, ordered=False)
        assert info.value.code == ErrorCode.QUERY_STATE
        assert info.value.details["partition"] == 0 and "hint" in info.value.details

    asyncio.run(run())


def test_a_partition_returning_during_a_batch_ends_the_query() -> None:
    cluster, coord = make()

    async def hook(ctx: BatchContext) -> None:
        if ctx.node == "A" and ctx.rows == 2 and 0 not in cluster.inflight:
            cluster.begin_move(0, "C")
            cluster.fail_move(0)

    cluster.set_hook(hook)
    with pytest.raises(ShardexError) as info:
        asyncio.run(drain(coord, 5, False))
    assert info.value.code == ErrorCode.QUERY_STATE


def test_a_virtual_scan_waits_for_an_in_flight_move() -> None:
    """B has released P2 but C has not activated it yet: C's virtual scan waits for the
    arrival (an event, not a poll) instead of returning P2 empty."""
    cluster, coord = make(arrival_timeout=30.0)

    async def run() -> list[list[PageRow]]:
        cluster.begin_move(2, "C")
        asyncio.get_running_loop().call_later(0.01, cluster.finish_move, 2)
        return await drain(coord, 50, False)

    pages = asyncio.run(run())
    check_paginated_scan(pages, cluster.expected(), ordered=False)
    assert cluster.owner[2] == "C"


def test_a_virtual_partition_that_never_arrives_ends_the_query() -> None:
    cluster, coord = make(arrival_timeout=0.05)
    cluster.begin_move(2, "C")
    with pytest.raises(ShardexError) as info:
        asyncio.run(drain(coord, 50, False))
    assert info.value.code == ErrorCode.QUERY_STATE
    assert "did not arrive" in info.value.message


def test_a_second_move_during_a_virtual_scan_ends_the_query() -> None:
    cluster2, coord2 = make()

    async def run() -> None:
        first = await coord2.page(b"all", 1, None, ordered=False)  # base = topology 1
        cluster2.move(2, "C")

        async def hook(ctx: BatchContext) -> None:
            if ctx.node == "C" and ctx.request.vs_pid == 2 and cluster2.owner[2] == "C":
                cluster2.move(2, "A")

        cluster2.set_hook(hook)
        cont = first.continuation
        with pytest.raises(ShardexError) as info:
            while cont is not None:
                cont = (await coord2.page(b"all", 50, cont, ordered=False)).continuation
        assert info.value.code == ErrorCode.QUERY_STATE
        assert "migrated twice" in info.value.message

    asyncio.run(run())


def test_bad_batches_are_refused() -> None:
    cluster, _ = make()

    async def run() -> None:
        req = ShardBatch(
            scan=b"all",
            base_topo=1,
            shard="B",
            shard_idx=0,
            vs_pid=-1,
            resume=None,
            vsm=[],
            limit=5,
        )
        with pytest.raises(ShardexError) as info:
            await cluster.scanners["A"].scan_batch(req)
        assert info.value.code == ErrorCode.STALE_TOPOLOGY
        req.shard, req.limit = "A", 0
        with pytest.raises(ShardexError) as info:
            await cluster.scanners["A"].scan_batch(req)
        assert info.value.code == ErrorCode.BAD_REQUEST
        req.limit, req.base_topo = 5, 99
        with pytest.raises(ShardexError) as info:
            await cluster.scanners["A"].scan_batch(req)
        assert info.value.code == ErrorCode.TOPOLOGY_NOT_FOUND

    asyncio.run(run())
