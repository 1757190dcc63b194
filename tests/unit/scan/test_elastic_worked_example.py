"""The worked example of ``elastic-all-shard-queries.md``, batch by batch.

Shards S1 (P1..P6) and S2 (P7..P12); S3 joins and receives P2 (during batch 1), P3 (before
batch 3), P7 (before batch 4) and P8 (during batch 4, between S2's batch and S3's). Index
entries are (index key, primary key, partition).

The algorithm's text says the query is ``key > 15`` but its walk-through returns (12, 40, 8) and
(15, 41, 7) in batch 3, i.e. it actually scans the whole index. Both are tested: the
walk-through verbatim over the whole index (its rows, continuation states and union), and
the same schedule with ``key > 15`` really applied (rows worked out by hand below).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from shardex.scan.continuation import ContinuationCodec, scan_digest
from shardex.scan.elastic_node import BatchContext
from shardex.scan.paging import PageCoordinator
from shardex.scan.paging_wire import ShardBatch, ShardBatchResult
from shardex.testing.elastic_memory import ElasticMemoryCluster

S1_INDEX = [(23, 11, 1), (47, 12, 2), (55, 13, 2), (58, 14, 3), (60, 15, 6), (60, 16, 3)]
S1_INDEX += [(62, 18, 2), (75, 19, 1), (75, 20, 5), (75, 21, 2), (80, 22, 4)]
S2_INDEX = [(12, 40, 8), (15, 41, 7), (23, 42, 12), (23, 43, 8), (34, 44, 7), (47, 45, 10)]
S2_INDEX += [(48, 46, 7), (66, 47, 9), (70, 48, 7), (70, 49, 8), (70, 50, 7), (80, 51, 11)]
PAGE_SIZES = [4, 4, 5, 7, 5, 5]  # the example's batch limits, read off its walk-through
SECRET = "worked-example-secret"

Triple = tuple[int, int, int]


def key(ikey: int, pk: int) -> bytes:
    return ikey.to_bytes(2, "big") + pk.to_bytes(2, "big")


def triple(k: bytes, pid: int) -> Triple:
    return (int.from_bytes(k[:2], "big"), int.from_bytes(k[2:], "big"), pid)


def span_of(spec: bytes) -> tuple[bytes | None, bytes | None]:
    # "gt:N" is key > N on the index key (the low end is exclusive, past every pk of N)
    if spec.startswith(b"gt:"):
        return key(int(spec[3:]), 0xFFFF), None
    return None, None


def build() -> ElasticMemoryCluster:
    assignment = {p: "S1" for p in range(1, 7)} | {p: "S2" for p in range(7, 13)}
    entries = [(key(i, pk), p, pk) for i, pk, p in S1_INDEX + S2_INDEX]
    cluster = ElasticMemoryCluster(assignment, entries, extra_nodes=["S3"])
    for node in ("S1", "S2", "S3"):
        # The specification's example answers a mid-batch move with an empty page and the saved
        # continuation (its consumption-limit branch), not a local repeat.
        cluster.scanner(node, span_of, max_local_repeats=0)
    return cluster


class Script:
    """Runs the example's migrations at the points the specification names."""

    def __init__(self, cluster: ElasticMemoryCluster) -> None:
        self.cluster = cluster
        self.batch = 0
        self.calls: list[str] = []

    async def on_row(self, ctx: BatchContext) -> None:
        # Batch 1 at S1: "(23, 11, 1), (47, 12, 2) are retrieved; P2 moves to S3".
        if self.batch == 1 and ctx.node == "S1" and ctx.rows == 2 and ctx.attempt == 0:
            self.cluster.move(2, "S3")

    def call(self) -> Callable[[str, ShardBatch], Awaitable[ShardBatchResult]]:
        async def call(node: str, req: ShardBatch) -> ShardBatchResult:
            self.calls.append(f"{self.batch}:{node}:{req.vs_pid}")
            # Batch 4: "P8 moves to S3" after S2's part of the batch, before S3's.
            if self.batch == 4 and node == "S3" and self.cluster.owner[8] == "S2":
                self.cluster.move(8, "S3")
            return await self.cluster.scanners[node].scan_batch(req)

        return call

    def between_batches(self) -> None:
        if self.batch == 2:
            self.cluster.move(3, "S3")  # "P3 moves to S3 before batch 3"
        if self.batch == 3:
            self.cluster.move(7, "S3")  # "P7 moves from S2 to S3 before batch 4"


def run_example(spec: bytes, *, ordered: bool = False):  # type: ignore[no-untyped-def]
    cluster = build()
    script = Script(cluster)
    cluster.set_hook(script.on_row)
    codec = ContinuationCodec(SECRET)
    coord = PageCoordinator(cluster.history, script.call(), codec)
    digest = scan_digest(spec + (b"/ordered" if ordered else b"/unordered"))

    async def drive():  # type: ignore[no-untyped-def]
        batches = []
        continuation = None
        for size in PAGE_SIZES * (4 if ordered else 1):
            script.batch += 1
            page = await coord.page(spec, size, continuation, ordered=ordered)
            state = (
                None
                if page.continuation is None
                else codec.decode(page.continuation, expect_digest=digest)
            )
            batches.append(([triple(r.key, r.partition) for r in page.rows], state))
            continuation = page.continuation
            if continuation is None:
                break
            script.between_batches()
        return batches

    return asyncio.run(drive()), cluster, script


def pair(k: bytes | None) -> tuple[int, int] | None:
    """(index key, primary key) of a resume key."""
    return None if k is None else triple(k, 0)[:2]


def vsm_of(state) -> list[tuple[int, str, tuple[int, int] | None]]:  # type: ignore[no-untyped-def]
    return [(v.pid, v.shard, pair(v.resume)) for v in state.vsm]


def resume_of(state) -> tuple[int, int] | None:  # type: ignore[no-untyped-def]
    return pair(state.resume)


def test_the_seed_walk_through_verbatim() -> None:
    batches, cluster, script = run_example(b"all")
    assert len(batches) == 6
    rows = [b[0] for b in batches]
    # Batch 1: P2 moved mid-batch, (55, 13, 2) was skipped: empty result, saved continuation.
    assert rows[0] == []
    assert batches[0][1].shard_idx == 0 and batches[0][1].resume is None
    assert batches[0][1].vsm == []
    # Batch 2: P2 detected -> VSM[P2] = {P2, S3, null}; four rows, resume (60, 16, 3).
    assert rows[1] == [(23, 11, 1), (58, 14, 3), (60, 15, 6), (60, 16, 3)]
    assert vsm_of(batches[1][1]) == [(2, "S3", None)]
    assert resume_of(batches[1][1]) == (60, 16)
    # Batch 3: P3 detected at (60, 16, 3); S1 ends; S2 gives two rows.
    assert rows[2] == [(75, 19, 1), (75, 20, 5), (80, 22, 4), (12, 40, 8), (15, 41, 7)]
    st = batches[2][1]
    assert (st.shard_idx, resume_of(st)) == (1, (15, 41))
    assert vsm_of(st) == [(2, "S3", None), (3, "S3", (60, 16))]
    # Batch 4: P7 detected at (15, 41, 7); S2 ends; the virtual scan of P2 on S3 starts.
    # (The specification says "7 results" for S2 but lists six entries; the page has 6 + 1.)
    assert rows[3] == [
        (23, 42, 12),
        (23, 43, 8),
        (47, 45, 10),
        (66, 47, 9),
        (70, 49, 8),
        (80, 51, 11),
        (47, 12, 2),
    ]
    st = batches[3][1]
    assert (st.shard_idx, st.vs_pid, resume_of(st)) == (2, 2, (47, 12))
    assert vsm_of(st) == [(2, "S3", None), (3, "S3", (60, 16)), (7, "S3", (15, 41))]
    # Batch 5: rest of P2, nothing of P3 after (60, 16, 3), two rows of P7.
    assert rows[4] == [(55, 13, 2), (62, 18, 2), (75, 21, 2), (34, 44, 7), (48, 46, 7)]
    st = batches[4][1]
    assert (st.shard_idx, st.vs_pid, resume_of(st)) == (4, 7, (48, 46))
    # Batch 6: the rest of P7, then no shard is left: continuation None.
    assert rows[5] == [(70, 48, 7), (70, 50, 7)]
    assert batches[5][1] is None
    union = [r for b in rows for r in b]
    assert len(union) == len(set(union))
    assert sorted(union) == sorted(S1_INDEX + S2_INDEX)
    # The migrations really happened where the specification puts them.
    assert cluster.owner[2] == cluster.owner[3] == cluster.owner[7] == cluster.owner[8] == "S3"
    assert cluster.history.latest is not None and cluster.history.latest.seq_num == 5
    assert "4:S3:2" in script.calls


def test_the_example_with_key_greater_than_15_applied() -> None:
    batches, _, _ = run_example(b"gt:15")
    rows = [b[0] for b in batches]
    assert rows == [
        [],
        [(23, 11, 1), (58, 14, 3), (60, 15, 6), (60, 16, 3)],
        [(75, 19, 1), (75, 20, 5), (80, 22, 4), (23, 42, 12), (23, 43, 8)],
        [
            *[(47, 45, 10), (66, 47, 9), (70, 49, 8), (80, 51, 11)],  # rest of S2
            *[(47, 12, 2), (55, 13, 2), (62, 18, 2)],  # virtual scan of P2 on S3
        ],
        [(75, 21, 2), (34, 44, 7), (48, 46, 7), (70, 48, 7), (70, 50, 7)],
        [],  # the last page finds P7 exhausted and ends the scan
    ]
    # P7's virtual scan starts where S2 was when the move was seen: after (23, 43, 8).
    assert vsm_of(batches[3][1])[2] == (7, "S3", (23, 43))
    assert batches[5][1] is None
    union = [r for b in rows for r in b]
    expected = [e for e in S1_INDEX + S2_INDEX if e[0] > 15]
    assert len(union) == len(set(union)) == len(expected) == 21
    assert sorted(union) == sorted(expected)


@pytest.mark.parametrize("spec", [b"all", b"gt:15"])
def test_the_example_schedule_as_an_ordered_scan(spec: bytes) -> None:
    """Beyond the specification: the same migrations under an ordered (merging) paginated scan."""
    batches, _, _ = run_example(spec, ordered=True)
    union = [r for b in batches for r in b[0]]
    expected = [e for e in S1_INDEX + S2_INDEX if spec == b"all" or e[0] > 15]
    assert batches[-1][1] is None
    assert union == sorted(expected)  # every row once, in (key, pk) order across pages
