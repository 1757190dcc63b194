"""A pinned paged scan's batch read from other copies when its shard fails
(``scan/paging_copies.py``): the stand-ins' answers merged are exactly the shard's own
batch, the shard's partitions go to their first live copies, and without a copy the shard's
own error ends the page."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from shardex.core.topology import Topology
from shardex.errors import ConnectionClosed, ErrorCode, NodeUnavailable, ShardexError
from shardex.scan.paging_copies import (
    check_stand_in,
    fails_over,
    merge_answers,
    read_from_copies,
    read_stand_in,
)
from shardex.scan.paging_store_spec import PagedScanSpec
from shardex.scan.paging_wire import ShardBatch, ShardBatchResult

# a's partitions 0 and 1 have copies on b and c; b's 2 on c; c's 3 has no other copy
TOPO = Topology(
    seq_num=4,
    assignment={0: "a", 1: "a", 2: "b", 3: "c"},
    replicas={0: ["b"], 1: ["c"], 2: ["c"]},
)
RNG = random.Random(5)
ENTRIES = {p: sorted({RNG.randbytes(4) for _ in range(300)}) for p in range(4)}


class Store:
    """A node's copies: the entries of the partitions it holds, in key order."""

    def __init__(self, partitions: list[int]) -> None:
        self.partitions = partitions

    def entries_after(
        self, after: bytes | None, partitions: frozenset[int] | None = None
    ) -> Iterator[tuple[bytes, int, None]]:
        rows = [
            (e, p, None)
            for p in self.partitions
            for e in ENTRIES[p]
            if (after is None or e > after) and (partitions is None or p in partitions)
        ]
        return iter(sorted(rows))


def _batch(shard: str, resume: bytes | None, limit: int, **kw: object) -> ShardBatch:
    return ShardBatch(
        scan=b"spec", base_topo=4, shard=shard, shard_idx=0, vs_pid=-1, resume=resume,
        vsm=[], limit=limit, **kw,
    )  # fmt: skip


def _shard_batch(shard: str, resume: bytes | None, limit: int) -> ShardBatchResult:
    """What the shard itself answers (its own store: every partition it is primary of)."""
    return read_stand_in(Store(TOPO.partitions_of(shard)), _batch(shard, resume, limit),
                         TOPO.partitions_of(shard))  # fmt: skip


class Cluster:
    def __init__(self, down: set[str]) -> None:
        self.down = down
        self.asked: list[tuple[str, list[int]]] = []

    async def call(self, node: str, req: ShardBatch) -> ShardBatchResult:
        self.asked.append((node, req.stand_in))
        if node in self.down:
            raise NodeUnavailable(f"{node} is down")
        parts = check_stand_in(req, TOPO, node, pinned=True)
        return read_stand_in(Store(TOPO.copies_of(node)), req, parts)


async def test_a_failed_shards_pages_come_whole_from_its_copies() -> None:
    cluster = Cluster(down={"a"})
    want = sorted(ENTRIES[0] + ENTRIES[1])
    got: list[bytes] = []
    resume = None
    while True:
        req = _batch("a", resume, 70)
        own = _shard_batch("a", resume, 70)  # what a would have answered
        res = await read_from_copies(cluster.call, "ix", TOPO, req, ConnectionClosed("a died"))
        assert [r.key for r in res.rows] == [r.key for r in own.rows]
        assert (res.resume, res.exhausted) == (own.resume, own.exhausted)
        got += [r.key for r in res.rows]
        if res.exhausted:
            break
        resume = res.resume
    assert got == want
    assert ("b", [0]) in cluster.asked and ("c", [1]) in cluster.asked


async def test_a_stand_in_that_fails_too_is_replaced_or_the_shards_error_ends_it() -> None:
    cluster = Cluster(down={"b", "c"})  # 2's copy on c is down too
    shard_error = ConnectionClosed("b died")
    with pytest.raises(ShardexError) as err:
        await read_from_copies(cluster.call, "ix", TOPO, _batch("b", None, 10), shard_error)
    assert err.value is shard_error
    cluster = Cluster(down={"c"})
    with pytest.raises(ShardexError) as err:  # c's 3 has no other copy
        await read_from_copies(cluster.call, "ix", TOPO, _batch("c", None, 10), shard_error)
    assert err.value is shard_error


def test_merged_answers_are_cut_at_the_limit_and_exhausted_only_when_all_are() -> None:
    req = _batch("a", None, 5)
    a = read_stand_in(Store([0]), req, [0])
    b = read_stand_in(Store([1]), req, [1])
    merged = merge_answers(req, [a, b])
    assert [r.key for r in merged.rows] == sorted(ENTRIES[0] + ENTRIES[1])[:5]
    assert not merged.exhausted and merged.resume == merged.rows[-1].key
    last = _batch("a", sorted(ENTRIES[0] + ENTRIES[1])[-3], 5)
    done = merge_answers(last, [read_stand_in(Store([0]), last, [0]),
                                read_stand_in(Store([1]), last, [1])])  # fmt: skip
    assert done.exhausted and done.resume is None and len(done.rows) == 2


def test_a_stand_in_batch_is_checked() -> None:
    assert check_stand_in(_batch("a", None, 5, stand_in=[1]), TOPO, "c", pinned=True) == [1]
    with pytest.raises(ShardexError) as err:  # c holds no copy of 0
        check_stand_in(_batch("a", None, 5, stand_in=[0]), TOPO, "c", pinned=True)
    assert err.value.code is ErrorCode.STALE_TOPOLOGY
    with pytest.raises(ShardexError) as err:  # the tips: another copy is another state
        check_stand_in(_batch("a", None, 5, stand_in=[1]), TOPO, "c", pinned=False)
    assert err.value.code is ErrorCode.BAD_REQUEST


def test_only_a_pinned_index_scan_fails_over() -> None:
    pinned = PagedScanSpec(keyspace="k", index_id="ix", snapshot={0: (1, 2)})
    tips = PagedScanSpec(keyspace="k", index_id="ix")
    primary = PagedScanSpec(keyspace="k", index_id="", snapshot={0: (1, 2)})
    down = NodeUnavailable("down")
    assert fails_over(down, pinned)
    assert not fails_over(down, tips) and not fails_over(down, primary)
    too_old = ShardexError("gone", code=ErrorCode.SNAPSHOT_TOO_OLD)
    assert not fails_over(too_old, pinned)
