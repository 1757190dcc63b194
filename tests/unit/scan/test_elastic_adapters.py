"""The index adapter of paginated scans on real RocksDB slices, in process: indexer engines
fed by ``LocalPipeline``, ``IndexShardStore`` + ``IndexScanMigrations`` under the protocol's
scanner and page coordinator. Index partitions move here through the hooks the index
rebalance will call (incoming, left, arrived, topology published): the pages are exact.
Also: the pinned snapshot is read by every page, and a released one is SNAPSHOT_TOO_OLD."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from shardex.api.spans import encode_spans, to_user_spans, to_wire_spans
from shardex.core.spans import Span, clip_ranges
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology, TopologyHistory
from shardex.errors import ErrorCode, ShardexError
from shardex.index.engine import IndexerEngine
from shardex.meta.index_definition import make_definition
from shardex.scan.continuation import Continuation, ContinuationCodec
from shardex.scan.elastic_adapters_index import IndexScanMigrations, batch_view
from shardex.scan.elastic_node import ElasticShardScanner
from shardex.scan.paging import PageCoordinator
from shardex.scan.paging_store_spec import (
    PagedScanSpec,
    decode_spec,
    encode_spec,
    primary_spans,
    spec_ranges,
)
from shardex.scan.paging_wire import PageRow, ShardBatch, ShardBatchResult
from shardex.testing.elastic_checker import check_paginated_scan
from shardex.testing.index import FakeKeyspace, LocalPipeline

DEFN = make_definition(
    id="ix",
    name="by_age",
    keyspace="ks",
    keys=["age", "name"],
    partition_by=["META().id"],
    num_partition=4,
)
BASE = {0: "A", 1: "A", 2: "B", 3: "B"}


class Rig:
    """Three indexer engines (C starts empty), the index's history, one scanner per node."""

    def __init__(self, tmp: Path, keep: int = 5) -> None:
        self.tmp = tmp
        self.engines = {n: IndexerEngine(tmp / n, keep_snapshots=keep, sync=False) for n in "ABC"}
        self.ks = FakeKeyspace(num_partitions=8)
        self.pipe = LocalPipeline([DEFN], self.engines, {"ix": dict(BASE)})
        self.pipe.create_slices()
        self.history = TopologyHistory([Topology(seq_num=1, assignment=dict(BASE))])
        self.migrations = {n: IndexScanMigrations(n) for n in "ABC"}
        self.rng = random.Random(4)
        self.ts = self.write(150)

    def write(self, n: int) -> Timestamp:
        start = self.ks.ts() if self.ks.log else None
        for _ in range(n):
            i = self.rng.randrange(200)
            self.ks.upsert(f"d{i}", {"age": self.rng.randrange(30), "name": f"n{i % 7}"})
        end = self.ks.ts()
        self.pipe.deliver(self.ks.changes(start, end))
        self.pipe.stabilise(end)
        return end

    def move(self, partition: int, target: str) -> None:
        """What the index rebalance will do: copy the slice, then the hooks in order."""
        source = self.history.latest.assignment[partition]  # type: ignore[union-attr]
        self.migrations[target].partition_incoming("ix", partition)
        copy = {p: ("X" if p != partition else target) for p in BASE}
        throwaway = IndexerEngine(self.tmp / f"x{partition}", sync=False)
        pipe = LocalPipeline([DEFN], {target: self.engines[target], "X": throwaway}, {"ix": copy})
        pipe.create_slices()
        pipe.deliver(self.ks.changes(None, self.ks.ts()))
        pipe.stabilise(self.ks.ts())
        throwaway.close()
        self.migrations[source].partition_left("ix", partition, target)
        self.migrations[target].partition_arrived("ix", partition)
        topo = self.history.latest.with_moves({partition: target})  # type: ignore[union-attr]
        self.history.append(topo)
        for m in self.migrations.values():
            m.topology_published("ix", topo.seq_num)

    async def call(self, node: str, req: ShardBatch) -> ShardBatchResult:
        """The shard node's side, as ``ElasticScanNode._index`` builds it."""
        spec = decode_spec(req.scan)
        snap = None if spec.snapshot is None else Timestamp.from_wire(spec.snapshot)
        base = self.history.get(req.base_topo)
        wanted = [req.vs_pid] if req.vs_pid >= 0 else base.partitions_of(node)
        latest = self.history.latest.seq_num  # type: ignore[union-attr]
        mm, store = batch_view(
            self.engines[node], self.migrations[node], node, "ix", spec_ranges(spec), snap,
            latest, wanted,
        )  # fmt: skip
        store.open(req.resume, wanted)
        return await ElasticShardScanner(node, mm, self.history, lambda _s: store).scan_batch(req)

    def expected(self, ts: Timestamp, spans: list[Span] | None = None) -> list[Any]:
        out = []
        for node, eng in self.engines.items():
            for p, entries in eng.entries("ix", ts).items():
                if self.history.latest.assignment[p] == node:  # type: ignore[union-attr]
                    out += [(e, p, None) for e in entries]
        if spans is not None:
            ranges = spec_ranges(PagedScanSpec("ks", "ix", to_wire_spans(spans)))
            out = [
                e
                for e in out
                if any(
                    (lo is None or e[0] >= lo) and (hi is None or e[0] < hi) for lo, hi in ranges
                )
            ]
        return sorted(out)

    def close(self) -> None:
        for e in self.engines.values():
            e.close()


@pytest.fixture
def rig(tmp_path: Path) -> Any:
    r = Rig(tmp_path)
    yield r
    r.close()


def pages_of(rig: Rig, spec: PagedScanSpec, sizes: list[int], *, ordered: bool, between: Any):
    coord = PageCoordinator(rig.history, rig.call, ContinuationCodec("unit"))

    async def go() -> list[list[PageRow]]:
        pages: list[list[PageRow]] = []
        ck: Continuation | None = Continuation(ordered=ordered)
        while ck is not None:
            rows, ck = await coord.page_state(encode_spec(spec), sizes[len(pages) % len(sizes)], ck)
            pages.append(rows)
            if ck is not None:
                between(len(pages))
        return pages

    return asyncio.run(go())


@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("ordered", [False, True])
def test_index_partitions_moving_between_pages_are_exact(
    rig: Rig, ordered: bool, pinned: bool
) -> None:
    # Tips follow the moves through virtual scans (nothing is written meanwhile, so the
    # tips are rig.ts); a pinned scan reads each partition where its base topology had it.
    snapshot = dict(rig.ts.to_wire()) if pinned else None
    spec = PagedScanSpec("ks", "ix", [], snapshot=snapshot)
    want = rig.expected(rig.ts)

    def between(n: int) -> None:
        if n == 1:
            rig.move(0, "C")  # from the first base shard, while it is being scanned
        if n == 3:
            rig.move(3, "C")  # from the second base shard
        if n == 5:
            rig.move(1, "B")  # between two base shards

    pages = pages_of(rig, spec, [7, 3, 11], ordered=ordered, between=between)
    check_paginated_scan(pages, want, ordered=ordered)
    assert [t.seq_num for t in rig.history.all()] == [1, 2, 3, 4]


def test_spans_and_tips_and_the_pinned_snapshot(rig: Rig) -> None:
    spans = encode_spans(to_user_spans([{"low": [5], "high": [20], "inclusion": "low"}]), DEFN)
    assert spans is not None
    pinned = PagedScanSpec("ks", "ix", to_wire_spans(spans), snapshot=dict(rig.ts.to_wire()))
    want = rig.expected(rig.ts, spans)
    later: list[Timestamp] = []

    def write(n: int) -> None:
        if n <= 2:  # new snapshots (fewer than the 5 kept); the scan keeps reading rig.ts
            later.append(rig.write(10))

    pages = pages_of(rig, pinned, [4], ordered=True, between=write)
    check_paginated_scan(pages, want, ordered=True)
    assert later and rig.expected(later[-1], spans) != want
    tips = PagedScanSpec("ks", "ix", to_wire_spans(spans))
    pages = pages_of(rig, tips, [9], ordered=False, between=lambda n: None)
    check_paginated_scan(pages, rig.expected(later[-1], spans), ordered=False)


def test_a_released_snapshot_is_snapshot_too_old(tmp_path: Path) -> None:
    rig = Rig(tmp_path, keep=2)
    try:
        spec = PagedScanSpec("ks", "ix", [], snapshot=dict(rig.ts.to_wire()))

        def churn(n: int) -> None:
            for _ in range(3):
                rig.write(5)

        with pytest.raises(ShardexError) as info:
            pages_of(rig, spec, [5], ordered=False, between=churn)
        assert info.value.code is ErrorCode.SNAPSHOT_TOO_OLD
    finally:
        rig.close()


def test_primary_spans_are_exact_docid_ranges() -> None:
    spans = primary_spans(
        to_user_spans(
            [
                {"low": ["b"], "high": ["d"], "inclusion": "high"},
                {"low": ["x"], "inclusion": "both"},
            ]
        )
    )
    ranges = spec_ranges(PagedScanSpec("ks", "", spans))
    assert ranges == [(b"b\x00", b"d\x00"), (b"x", None)]
    assert clip_ranges(ranges, b"c") == [(b"c\x00", b"d\x00"), (b"x", None)]
    assert clip_ranges(ranges, b"z") == [(b"z\x00", None)]
    for bad in ([{"low": [5]}], [{"low": ["a", "b"]}], [{"high": {"a": 1}}]):
        with pytest.raises(ShardexError) as info:
            primary_spans(to_user_spans(bad))
        assert info.value.code is ErrorCode.BAD_REQUEST
