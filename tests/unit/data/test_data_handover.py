"""Engine pieces of a hand-over (conditional release, chunked copy-in, markers, term fence)
and the reconcile rules that keep migrations and placement from stepping on each other."""

from __future__ import annotations

import threading

import pytest

from shardex.api.migration import IncomingMarker
from shardex.core.topology import Topology
from shardex.data.engine import DataEngine
from shardex.data.reconcile import never_moved, reconcile
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.partitioning import partition_of
from shardex.meta.rebalance_state import FAILED, MOVING, new_record, with_move
from shardex.meta.state import KeyspaceMeta, StateContext

META = KeyspaceMeta(name="ks", num_partitions=4, uuid="u1", created_cas=1)
T1 = Topology(seq_num=1, assignment={0: "n1", 1: "n2", 2: "n1", 3: "n2"})


def ids(partition: int, n: int, prefix: str = "d") -> list[str]:
    out, i = [], 0
    while len(out) < n:
        if partition_of(f"{prefix}{i}", 4) == partition:
            out.append(f"{prefix}{i}")
        i += 1
    return out


def state(cas: int, *topos: Topology, rebalance=None, epoch: int = 2) -> StateContext:
    return StateContext(
        cas=cas,
        epoch=epoch,
        keyspaces={"ks": META},
        data_topologies={"ks": list(topos)},
        rebalance=rebalance,
    )


@pytest.fixture
def pair(tmp_path):
    src, dst = DataEngine(tmp_path / "src"), DataEngine(tmp_path / "dst")
    reconcile(src, "n1", state(2, T1))
    reconcile(dst, "n2", state(2, T1))
    yield src, dst
    src.close()
    dst.close()


def test_release_if_high_is_atomic_with_writers(pair) -> None:
    src, _ = pair
    for d in ids(0, 20):
        src.upsert("ks", d, {"x": 1})
    high = src.partition_info("ks", 0).high_seqno
    stop = threading.Event()
    acked: list[int] = []

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            docid = next(
                d for d in (f"x{i}-{k}" for k in range(100)) if src.partition_for("ks", d) == 0
            )
            try:
                acked.append(src.upsert("ks", docid, {"i": i}).seqno)
            except ShardexError:
                return

    th = threading.Thread(target=writer)
    th.start()
    try:
        while not acked:
            pass
        # A stale high seqno is refused while writes go on...
        with pytest.raises(ShardexError) as info:
            src.release_if_high("ks", 0, high)
        assert info.value.code == ErrorCode.STALE_TOPOLOGY
        frozen = src.freeze_partition("ks", 0)
        info_after = src.release_if_high("ks", 0, frozen.high_seqno)
    finally:
        stop.set()
        th.join()
    assert info_after.state == "released" and max(acked) == frozen.high_seqno
    with pytest.raises(ShardexError) as info:
        src.upsert("ks", ids(0, 1)[0], {})
    assert info.value.code == ErrorCode.NOT_MY_PARTITION


def test_chunked_copy_continues_the_same_history(pair) -> None:
    src, dst = pair
    docs = ids(2, 300)
    for d in docs:
        src.upsert("ks", d, {"pad": "x" * 100})
    src.delete("ks", docs[3])
    part = 2
    with src.snapshot_partition("ks", part) as snap:
        copy = dst.begin_ingest("ks", part, snap.info)
        items = list(snap.raw_items())
        for k in range(0, len(items), 7):  # many small chunks: one SST in the end
            copy.add(items[k : k + 7])
        info = copy.finish()
    assert info.state == "pending" and info.high_seqno == snap.info.high_seqno
    assert info.uuid == snap.info.uuid and copy.items == len(items)
    assert not copy.path.exists()
    dst.activate_partition("ks", part)
    assert list(src.stream("ks", part, 0, 0)) == list(dst.stream("ks", part, 0, 0))
    # An aborted copy leaves nothing behind.
    with src.snapshot_partition("ks", 0) as snap:
        copy = dst.begin_ingest("ks", 0, snap.info)
        copy.add(list(snap.raw_items())[:3])
        copy.abort()
    assert not copy.path.exists() and dst.partition_state("ks", 0) == "absent"


def test_markers_and_term_fence_persist(tmp_path) -> None:
    eng = DataEngine(tmp_path / "e")
    reconcile(eng, "n1", state(2, T1))
    m = IncomingMarker(
        migration_id="m1", keyspace="ks", partition=1, source="n2", base_seq=1, record_cas=5
    )
    eng.set_incoming(m)
    eng.raise_topology_floor("ks", 4)
    eng.raise_topology_floor("ks", 3)  # never lowered
    eng.check_fence(7)
    eng.close()
    eng = DataEngine(tmp_path / "e")
    assert eng.incoming() == {("ks", 1): m} and eng.topology_floor("ks") == 4
    eng.check_fence(7)
    with pytest.raises(ShardexError) as info:
        eng.check_fence(6)
    assert info.value.details["reason"] == "deposed"
    eng.drop_keyspace("ks")  # markers go with the keyspace
    assert eng.incoming() == {} and eng.topology_floor("ks") == 0
    eng.close()


def test_reconcile_opens_only_partitions_that_never_lived_elsewhere(tmp_path) -> None:
    t2 = T1.with_moves({0: "n2"})  # 0 moved n1 -> n2
    t3 = t2.with_moves({1: "n1"})  # 1 moved n2 -> n1
    assert never_moved([T1, t2, t3], 2, "n1") and not never_moved([T1, t2, t3], 1, "n1")
    n1, n2 = DataEngine(tmp_path / "n1"), DataEngine(tmp_path / "n2")
    reconcile(n1, "n1", state(9, T1, t2, t3))
    reconcile(n2, "n2", state(9, T1, t2, t3))
    # Moved partitions arrive by migration only: a node that lost them keeps them unavailable.
    assert n1.partitions("ks") == [2] and n2.partitions("ks") == [3]
    # A state older than the keyspace's floor opens nothing.
    n1.raise_topology_floor("ks", 3)
    n1.drop_partition("ks", 2)
    reconcile(n1, "n1", state(3, T1))
    assert n1.partitions("ks") == []
    reconcile(n1, "n1", state(9, T1, t2, t3))
    assert n1.partitions("ks") == [2]
    n1.close()
    n2.close()


def test_reconcile_settles_incoming_copies(pair) -> None:
    src, dst = pair
    part, doc = 2, ids(2, 1)[0]
    src.upsert("ks", doc, {"x": 1})
    plan = [("ks", "u1", part, "n1", "n2", 1)]
    rec = with_move(new_record("r", "move", plan, ["m1"], 0.0), "m1", status=MOVING)
    marker = IncomingMarker(
        migration_id="m1",
        keyspace="ks",
        partition=part,
        source="n1",
        base_seq=1,
        record_cas=5,
        epoch=2,
    )

    def copy_in() -> None:
        dst.set_incoming(marker)
        with src.snapshot_partition("ks", part) as snap:
            dst.ingest_partition("ks", part, snap.info, snap.raw_items())

    copy_in()
    reconcile(dst, "n2", state(4, T1))  # cannot know of the migration yet: keep
    # A deposed master's never-committed state (older term, any cas) proves nothing either.
    reconcile(dst, "n2", state(99, T1, epoch=1))
    reconcile(dst, "n2", state(6, T1, rebalance=rec))  # in flight: keep
    assert dst.partition_state("ks", part) == "pending" and dst.incoming()
    reconcile(dst, "n2", state(7, T1, rebalance=with_move(rec, "m1", status=FAILED)))
    assert dst.partition_state("ks", part) == "absent" and not dst.incoming()
    # Published while this node was away: the complete copy activates itself.
    copy_in()
    published = T1.with_moves({part: "n2"})
    reconcile(dst, "n2", state(8, T1, published, rebalance=with_move(rec, "m1", status="done")))
    assert dst.partition_state("ks", part) == "active" and not dst.incoming()
    assert dst.get("ks", doc).doc == {"x": 1}
    # The released source copy goes once the topology names the new owner (floor raised).
    src.release_partition("ks", part)
    reconcile(src, "n1", state(8, T1, published))
    assert src.partition_state("ks", part) == "absent" and src.topology_floor("ks") == 2
    reconcile(src, "n1", state(2, T1))  # a stale state never re-opens it empty
    assert src.partition_state("ks", part) == "absent"
