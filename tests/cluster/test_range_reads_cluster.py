"""Multi-range change reads (``ReadRanges``, one request per owner node) against the stream
path on a live 3-node cluster: the same chunks and key versions, caps that cut replies and
continue, ROLLBACK per range with its details, a stale topology and a partition moved in the
middle of a range resumed without skipping or doubling, and malformed requests refused."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster, wait_for
from data_helpers import docids_in, owner_of, running_cluster

import shardex.pipeline.source.ranges as source_ranges
from shardex.api.data import RangeSpec, ReadRanges, ReadRangesReply
from shardex.client import Client, connect_local
from shardex.client.range_reads import read_round
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_definition import IndexDefinition, IndexKey
from shardex.pipeline.source.checks import Chunk
from shardex.pipeline.source.driver_read import read_and_project
from shardex.pipeline.source.plan import plan_ranges
from shardex.pipeline.source.read import chunk_groups, parse_rollback
from shardex.pipeline.source.types import PartitionRange
from shardex.runtime.pidfile import pid_alive

pytestmark = pytest.mark.cluster

KS = "rr"
PARTS = 16
ALL = 10**9  # small_range: every range through ReadRanges
DEFS = [
    IndexDefinition(
        id="rr.1",
        name="by_name",
        keyspace=KS,
        keys=[IndexKey(expr="name"), IndexKey(expr="n", desc=True)],
        partition_by=["META().id"],
        num_partition=4,
    ),
    IndexDefinition(id="rr.2", name="by_n", keyspace=KS, keys=[IndexKey(expr="n")]),
]
Row = tuple[int, int, int, str, str, int, Any]
Env = tuple[Client, Client, LocalCluster]  # reader, admin (moves), the cluster


@pytest.fixture(scope="module")
def clients(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Env]:
    path: Path = tmp_path_factory.mktemp("range-reads") / "cluster"
    with (
        running_cluster(path, nodes=3) as cluster,
        connect_local(path) as c,
        connect_local(path) as admin,
    ):
        c.create_keyspace(KS, num_partitions=PARTS)
        yield c, admin, cluster


def _rows(client: Client, ranges: list[PartitionRange], small_range: int) -> list[Row]:
    """Every change read, in the order each partition's chunks came (per partition)."""
    by_part: dict[int, list[Row]] = {}
    for group in chunk_groups(client, KS, ranges, 1, small_range=small_range, concurrency=8):
        for ch in group:
            by_part.setdefault(ch.partition, []).extend(
                (ch.partition, ch.uuid, c.seqno, c.docid, c.op, c.cas, c.body) for c in ch.changes
            )
    return [r for p in sorted(by_part) for r in by_part[p]]


def _key(r: tuple) -> tuple:
    return (r[0], r[5], r[6], r[2], r[1], r[3], r[4])


def test_same_rows_as_streams(clients: Env, monkeypatch: Any) -> None:
    client, _, _ = clients
    ks = client.keyspace(KS)
    ks.upsert_many([(f"d{i}", {"name": f"n{i % 13}", "n": i}) for i in range(500)])
    mid = client.high_seqnos(KS)
    for i in range(0, 500, 4):
        ks.upsert(f"d{i}", {"name": f"m{i}", "n": -i})  # repeated docids
    for i in range(1, 500, 9):
        ks.delete(f"d{i}")
    for d in docids_in(3, PARTS, 5, "only3-"):  # partitions 3 and 4 move further
        ks.upsert(d, {"name": "three", "n": 3})
    for d in docids_in(4, PARTS, 2, "only4-"):
        ks.upsert(d, {"name": "four", "n": 4})
        ks.delete(d)
    end = client.high_seqnos(KS)
    calls: list[int] = []

    async def counted(*args: Any, **kw: Any) -> Any:
        calls.append(len(args[2]))
        return await read_round(*args, **kw)

    monkeypatch.setattr(source_ranges, "read_round", counted)
    owners = {owner_of(client, KS, p) for p in range(PARTS)}
    for start in (Timestamp({}), mid):
        ranges = plan_ranges(KS, start, end)
        # Partially empty: the planned ranges plus every partition's empty (end, end].
        ranges += [PartitionRange(p, e.seqno, e.uuid, e.seqno, e.uuid) for p, e in end.items()]
        calls.clear()
        got = _rows(client, ranges, ALL)
        assert len(calls) == len(owners)  # one request per owner: everything fits one reply
        want = _rows(client, ranges, 0)
        assert got == want
        assert len(got) == sum(e.seqno - start.seqno(p) for p, e in end.items())
        calls.clear()
        kv = read_and_project(client, KS, DEFS, start, end, small_range=ALL)
        assert calls
        ref = read_and_project(client, KS, DEFS, start, end, small_range=0)
        assert sorted(kv, key=_key) == sorted(ref, key=_key)
    # Only partitions 3 and 4 moved after this point: the others are empty ranges.
    after = client.high_seqnos(KS)
    for d in docids_in(3, PARTS, 2, "again3-"):
        ks.upsert(d, {"name": "x", "n": 1})
    last = client.high_seqnos(KS)
    rows = _rows(client, plan_ranges(KS, after, last), ALL)
    assert {r[0] for r in rows} == {3} and [r[2] for r in rows] == [
        after[3].seqno + 1,
        after[3].seqno + 2,
    ]


def _read_small(client: Client, ranges: list[PartitionRange], **kw: Any) -> list[Row]:
    chunks: list[Chunk] = []

    async def put(ch: Chunk) -> None:
        chunks.append(ch)

    async def no_stream(r: PartitionRange) -> None:
        raise AssertionError(f"streamed {r}")

    client.rpc.run(
        source_ranges.read_small_ranges(
            client.rpc.router, KS, ranges, put, no_stream, resume_timeout=10, **kw
        )
    )
    by_part: dict[int, list[Row]] = {}
    for ch in chunks:
        by_part.setdefault(ch.partition, []).extend(
            (ch.partition, ch.uuid, c.seqno, c.docid, c.op, c.cas, c.body) for c in ch.changes
        )
    return [r for p in sorted(by_part) for r in by_part[p]]


def test_caps_cut_replies_and_the_reads_continue(
    clients: Env,
) -> None:
    client, _, _ = clients
    client.keyspace(KS).upsert_many([(f"c{i}", {"name": "c" * 200, "n": i}) for i in range(300)])
    ranges = plan_ranges(KS, Timestamp({}), client.high_seqnos(KS))
    want = _rows(client, ranges, 0)
    assert _read_small(client, ranges, max_items=7) == want
    assert _read_small(client, ranges, max_bytes=900) == want  # ~3 changes per reply
    assert _read_small(client, ranges, max_items=1, max_bytes=1) == want


def _reply(client: Client, node: str, specs: list[RangeSpec]) -> ReadRangesReply:
    msg = ReadRanges(keyspace=KS, ranges=specs)
    return client.rpc.run(client.rpc.router.to_node(node, msg, ReadRangesReply))


def test_rollback_is_per_range_with_its_details(
    clients: Env,
) -> None:
    client, _, _ = clients
    client.keyspace(KS).upsert_many([(f"r{i}", {"n": i}) for i in range(100)])
    end = client.high_seqnos(KS)
    node = owner_of(client, KS, 0)
    mine = [p for p in range(PARTS) if owner_of(client, KS, p) == node]
    forged_p, good_p = mine[0], mine[1]
    # A position inside the partition's history, on a branch it never had.
    forged = RangeSpec(
        forged_p, end[forged_p].seqno - 1, end[forged_p].uuid ^ 0x5A5A, end[forged_p].seqno
    )
    good = RangeSpec(good_p, 0, 0, end[good_p].seqno)
    above = RangeSpec(mine[2], 0, 0, end[mine[2]].seqno + 3)
    rb, ok, short = _reply(client, node, [forged, good, above]).results
    assert rb.error is not None and rb.error.code == ErrorCode.ROLLBACK.value
    assert rb.error.details["rollback_seqno"] == 0 and rb.error.details["partition"] == forged_p
    assert rb.error.details["uuid"] == end[forged_p].uuid and not rb.changes
    assert ok.error is None and ok.reached == good.end_seqno and len(ok.changes) == good.end_seqno
    assert short.error is not None and short.error.details["rollback_seqno"] == end[mine[2]].seqno

    # Through the reader, the same ROLLBACK (tag and all) as the stream path raises.
    def failure(small: int, r: PartitionRange) -> ShardexError:
        with pytest.raises(ShardexError) as err:
            _rows(client, [PartitionRange(good_p, 0, 0, end[good_p].seqno, 0), r], small)
        return err.value

    bad = PartitionRange(
        forged_p, forged.from_seqno, forged.uuid, end[forged_p].seqno, end[forged_p].uuid
    )
    for r in (bad, PartitionRange(mine[2], 0, 0, above.end_seqno, end[mine[2]].uuid)):
        new, old = failure(ALL, r), failure(0, r)
        assert new.code is old.code is ErrorCode.ROLLBACK
        assert parse_rollback(new) == parse_rollback(old) is not None
        assert str(new) == str(old)


def test_stale_topology_resumes_at_the_owner(clients: Env) -> None:
    client, _, _ = clients
    client.keyspace(KS).upsert_many([(f"s{i}", {"n": i}) for i in range(200)])
    end = client.high_seqnos(KS)
    ranges = plan_ranges(KS, Timestamp({}), end)
    want = _rows(client, ranges, 0)
    _, topo = client.rpc.run(client.rpc.router.keyspace(KS))
    nodes = sorted(set(topo.assignment.values()))
    wrong = {p: nodes[(nodes.index(n) + 1) % len(nodes)] for p, n in topo.assignment.items()}
    stale = Topology(seq_num=topo.seq_num, assignment=wrong)
    client.rpc.router.force_topology(KS, stale)
    before = client.rpc.router.refreshes
    assert _rows(client, ranges, ALL) == want
    assert client.rpc.router.refreshes > before


def test_partition_moved_mid_range_resumes_exactly(
    clients: Env,
) -> None:
    """The first reply for p is cut by the cap; before the next request p moves to another
    node: the old owner answers NOT_MY_PARTITION and the read continues at the new owner
    from the last seqno received."""
    client, admin, _ = clients
    p = 6
    client.keyspace(KS).upsert_many((d, {"n": 1}) for d in docids_in(p, PARTS, 60, "mv"))
    end = client.high_seqnos(KS)
    other = next(q for q in range(PARTS) if owner_of(client, KS, q) != owner_of(client, KS, p))
    ranges = [
        PartitionRange(p, 0, 0, end[p].seqno, end[p].uuid),
        PartitionRange(other, 0, 0, end[other].seqno, end[other].uuid),
    ]
    want = _rows(client, ranges, 0)
    owner = owner_of(client, KS, p)
    target = next(n for n in ("node1", "node2", "node3") if n != owner)
    moved: list[str] = []
    chunks: list[Chunk] = []

    async def put(ch: Chunk) -> None:
        chunks.append(ch)
        if ch.partition == p and not moved:
            res = await asyncio.to_thread(admin.move_partition, KS, p, target)
            moved.append(res.state)

    async def no_stream(r: PartitionRange) -> None:
        raise AssertionError(f"streamed {r}")

    before = client.rpc.router.refreshes
    client.rpc.run(
        source_ranges.read_small_ranges(
            client.rpc.router, KS, ranges, put, no_stream, resume_timeout=30, max_items=10
        )
    )
    assert moved == ["done"] and owner_of(client, KS, p) == target
    assert client.rpc.router.refreshes > before
    for q in (p, other):
        got = [
            (ch.partition, ch.uuid, c.seqno, c.docid, c.op, c.cas, c.body)
            for ch in chunks
            if ch.partition == q
            for c in ch.changes
        ]
        assert got == [r for r in want if r[0] == q]
        assert [r[2] for r in got] == list(range(1, end[q].seqno + 1))


def test_bad_requests_are_refused_and_the_node_keeps_serving(
    clients: Env,
) -> None:
    client, _, _ = clients
    client.keyspace(KS).upsert("b1", {"n": 1})
    end = client.high_seqnos(KS)
    node = owner_of(client, KS, 0)
    bad = [
        [RangeSpec(0, 5, 0, 2)],  # from above end
        [RangeSpec(0, 0, 0, 1), RangeSpec(0, 1, 0, 2)],  # a partition twice
        [RangeSpec(PARTS, 0, 0, 1)],  # outside the keyspace
    ]
    for specs in bad:
        with pytest.raises(ShardexError) as err:
            _reply(client, node, specs)
        assert err.value.code is ErrorCode.BAD_REQUEST
    with pytest.raises(ShardexError) as err:
        msg = ReadRanges(keyspace="no-such-keyspace", ranges=[RangeSpec(0, 0, 0, 1)])
        client.rpc.run(client.rpc.router.to_node(node, msg, ReadRangesReply))
    assert err.value.code is ErrorCode.KEYSPACE_NOT_FOUND
    with pytest.raises(ShardexError) as err:
        client.rpc.run(read_round(client.rpc.router, "no-such-keyspace", [RangeSpec(0, 0, 0, 1)]))
    assert err.value.code is ErrorCode.KEYSPACE_NOT_FOUND
    (res,) = _reply(client, node, [RangeSpec(0, 0, 0, end[0].seqno)]).results
    assert res.error is None and res.reached == end[0].seqno


def test_owner_down_then_back_resumes_within_the_timeout(
    clients: Env,
) -> None:
    """kill -9 of an owner (durable writes: the same branch when it is back): its ranges
    fail with NODE_UNAVAILABLE, are retried after topology refreshes, and the read ends
    exact once the node restarts; the other owners' ranges are read meanwhile."""
    client, _, cluster = clients
    client.keyspace(KS).upsert_many([(f"k{i}", {"n": i}) for i in range(300)])
    end = client.high_seqnos(KS)
    ranges = plan_ranges(KS, Timestamp({}), end)
    want = _rows(client, ranges, 0)
    assert any(owner_of(client, KS, p) == "node2" for p in range(PARTS))
    pid = cluster.pid(2)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 5, what="node2 gone")
    before = client.rpc.router.refreshes
    out: list[Any] = []
    reader = threading.Thread(target=lambda: out.append(_rows(client, ranges, ALL)))
    reader.start()
    try:
        # The read has failed at node2 at least twice (each failure is followed by a refresh).
        wait_for(lambda: client.rpc.router.refreshes >= before + 2, 20, what="retries")
        assert reader.is_alive()
    finally:
        cluster.start()  # restarts node2 only
        reader.join(60)
    assert out and out[0] == want
