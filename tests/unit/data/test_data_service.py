"""DataService without processes: reconciliation rules, keyspace incarnations, group commit,
and how stream runs are cut into wire batches."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from shardex.api.data import HighSeqnos, HighSeqnosReply, StreamBatch
from shardex.api.records import Change, SnapshotMarker
from shardex.core.topology import Topology, balanced_assignment
from shardex.data.service import DataService
from shardex.data.streaming import _batches
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.net import TcpTransport


class FakeCoordinator:
    def __init__(self) -> None:
        self.state = StateContext()
        self.callbacks: list[object] = []

    def on_change(self, cb: object) -> None:
        self.callbacks.append(cb)


def state_with(cas: int, *metas: tuple[str, str, int, int, list[str]]) -> StateContext:
    """``(name, uuid, num_partitions, created_cas, nodes)`` per keyspace."""
    keyspaces, topos = {}, {}
    for name, uuid, n, created, nodes in metas:
        keyspaces[name] = KeyspaceMeta(name=name, num_partitions=n, uuid=uuid, created_cas=created)
        topos[name] = [Topology(seq_num=1, assignment=balanced_assignment(n, nodes))]
    return StateContext(cas=cas, keyspaces=keyspaces, data_topologies=topos)


@contextlib.asynccontextmanager
async def running_service(tmp_path: Path) -> AsyncIterator[tuple[DataService, FakeCoordinator]]:
    """A started ``DataService`` named n1 on a fake coordinator (no reconcile loop)."""
    coord = FakeCoordinator()
    ds = DataService(
        data_dir=tmp_path,
        node_name="n1",
        transport=TcpTransport(),
        secret="s" * 32,
        coordinator=lambda: coord,
        reconcile_interval=3600,
    )
    await ds.start()
    try:
        yield ds, coord
    finally:
        await ds.stop()


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[DataService, FakeCoordinator]]:
    async with running_service(tmp_path) as both:
        yield both


async def test_reconcile_opens_assigned_partitions_only(service) -> None:
    ds, coord = service
    coord.state = state_with(5, ("ks", "u1", 8, 5, ["n1", "n2"]))
    await ds.reconcile()
    assert ds.engine.partitions("ks") == [0, 2, 4, 6]  # n1's half of a 2-node placement
    ks = ds.engine.keyspace("ks")
    assert (ks.uuid, ks.created_cas) == ("u1", 5)
    # Not assigned any more (e.g. moved away): kept, the migration decides when it goes.
    coord.state = state_with(6, ("ks", "u1", 8, 5, ["n2"]))
    await ds.reconcile()
    assert ds.engine.partitions("ks") == [0, 2, 4, 6]


async def test_reconcile_drops_keyspaces_gone_from_a_newer_state(service) -> None:
    ds, coord = service
    coord.state = state_with(5, ("ks", "u1", 4, 5, ["n1"]))
    await ds.reconcile()
    ds.engine.upsert("ks", "d", {"a": 1})
    # A state older than the keyspace (a lagging replica) proves nothing: keep it.
    coord.state = state_with(4)
    await ds.reconcile()
    assert ds.engine.get("ks", "d").doc == {"a": 1}
    # An empty state (a manager that knows nothing) proves nothing either.
    coord.state = StateContext()
    await ds.reconcile()
    assert ds.engine.partitions("ks") == [0, 1, 2, 3]
    # A newer state without it: the keyspace was dropped while we were away.
    coord.state = state_with(7)
    await ds.reconcile()
    assert [k.name for k in ds.engine.keyspaces()] == []


async def test_recreated_keyspace_replaces_the_old_incarnation(service) -> None:
    ds, coord = service
    coord.state = state_with(5, ("ks", "u1", 4, 5, ["n1"]))
    await ds.reconcile()
    ds.engine.upsert("ks", "old", {"a": 1})
    # Dropped and re-created under the same name while this node was down.
    coord.state = state_with(9, ("ks", "u2", 2, 8, ["n1"]))
    await ds.reconcile()
    ks = ds.engine.keyspace("ks")
    assert (ks.uuid, ks.num_partitions) == ("u2", 2)
    with pytest.raises(ShardexError) as info:
        ds.engine.get("ks", "old")
    assert info.value.code == ErrorCode.DOC_NOT_FOUND
    # A stale state naming the old incarnation does not bring it back.
    coord.state = state_with(9, ("ks", "u1", 4, 5, ["n1"]))
    await ds.reconcile()
    assert ds.engine.keyspace("ks").uuid == "u2"


async def test_keyspace_unknown_here_but_in_the_cluster_is_not_my_partition(service) -> None:
    ds, coord = service
    coord.state = state_with(5, ("ks", "u1", 4, 5, ["n2"]))  # nothing of it on n1
    with pytest.raises(ShardexError) as info:
        await ds.writes.mutate("upsert", "ks", "doc", b"{}", None, "persist")
    err = info.value
    assert err.code == ErrorCode.NOT_MY_PARTITION
    assert err.details["owner_hint"] == "n2" and err.details["keyspace"] == "ks"
    with pytest.raises(ShardexError) as info:
        await ds.writes.mutate("upsert", "nope", "doc", b"{}", None, "persist")
    assert info.value.code == ErrorCode.KEYSPACE_NOT_FOUND


async def test_a_failed_over_node_answers_no_high_seqnos_for_its_old_partitions(
    service,
) -> None:
    """Its copies still say active, at the old branch's uuid; an asker with a topology from
    before the failover must hear "not here" (and look again), not that stale uuid."""
    ds, coord = service
    coord.state = state_with(5, ("ks", "u1", 4, 5, ["n1"]))
    await ds.reconcile()
    ds.engine.upsert("ks", "d", {"a": 1})
    share = HighSeqnos(keyspace="ks", partitions=[0, 1, 2, 3])
    before = ds.gather.on_high_seqnos(share, None)
    assert isinstance(before, HighSeqnosReply) and sorted(before.entries) == [0, 1, 2, 3]
    coord.state = msgspec.structs.replace(
        state_with(6, ("ks", "u1", 4, 5, ["n1"])), failed_over={"n1": 6}
    )
    await ds.reconcile()
    assert ds.failed_over
    after = ds.gather.on_high_seqnos(share, None)
    assert isinstance(after, HighSeqnosReply) and after.entries == {}
    assert ds.local_high_seqnos("ks", [0, 1, 2, 3]) == {}


async def test_group_commit_coalesces_concurrent_writes(service) -> None:
    ds, coord = service
    coord.state = state_with(5, ("ks", "u1", 1, 5, ["n1"]))
    await ds.reconcile()
    committer = ds.committer
    assert committer is not None
    ops = [
        committer.submit("ks", "persist", ("upsert", f"d{i}", b'{"i": %d}' % i, None))
        for i in range(200)
    ]
    ops.append(committer.submit("ks", "persist", ("insert", "d0", b"{}", None)))  # after d0
    ops.append(committer.submit("ks", "persist", ("upsert", "bad", b"[1]", None)))
    results = await asyncio.gather(*ops, return_exceptions=True)
    seqnos = [r.seqno for r in results[:200]]
    assert seqnos == list(range(1, 201))  # arrival order, gap-free
    assert isinstance(results[200], ShardexError) and results[200].code == ErrorCode.DOC_EXISTS
    assert isinstance(results[201], ShardexError) and results[201].code == ErrorCode.BAD_REQUEST
    assert committer.ops == 202 and committer.flushes < 20  # one fsync per group, not per op


def test_stream_batches_split_at_markers() -> None:
    items = [
        SnapshotMarker(3, 1, 2, 77),
        Change(3, 1, "a", "upsert", 10, b"{}"),
        Change(3, 2, "b", "delete", 11, None),
        SnapshotMarker(3, 3, 3, 78),
        Change(3, 3, "c", "upsert", 12, b"{}"),
    ]
    batches = list(_batches(9, items))
    assert batches == [
        StreamBatch(
            stream_id=9,
            marker=(1, 2, 77, False),
            changes=[(1, "a", "upsert", 10, b"{}", 0, 0), (2, "b", "delete", 11, None, 0, 0)],
        ),
        StreamBatch(
            stream_id=9, marker=(3, 3, 78, False), changes=[(3, "c", "upsert", 12, b"{}", 0, 0)]
        ),
    ]
    assert next(_batches(9, [Change(3, 4, "d", "upsert", 13, b"{}")])).marker is None
