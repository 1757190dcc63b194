"""Indexer local engine: apply up to a TS, idempotent re-delivery, back index, snapshots,
scans, bulk loads, rollback, tombstones, reopening."""

from __future__ import annotations

import pytest

from shardex.core.keycodec import encode_entry, encode_key
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index import (
    DELETE,
    STATE_ACTIVE,
    STATE_CREATED,
    STATE_NEEDS_REBUILD,
    UPSERT,
    UPSERT_DELETION,
    IndexerEngine,
    Span,
    make_definition,
)
from shardex.index.oracle import check_back_index, check_index

D = make_definition(id="ix", name="ix", keyspace="ks", keys=["k"])
U = 0xFEED


def ts(**seqnos: int) -> Timestamp:
    return Timestamp({int(p[1:]): (s, U) for p, s in seqnos.items()})


def up(docid: str, k: object, seqno: int, part: int = 0, ip: int = 0) -> tuple:
    return ("ix", ip, UPSERT, encode_entry([k], docid), docid, part, seqno)


def rm(docid: str, seqno: int, kind: int = DELETE, part: int = 0, ip: int = 0) -> tuple:
    return ("ix", ip, kind, b"", docid, part, seqno)


@pytest.fixture
def eng(tmp_path):
    e = IndexerEngine(tmp_path / "idx", keep_snapshots=3, sync=False)
    e.create_slice(D, 0)
    yield e
    e.close()


def keys(eng: IndexerEngine, snapshot_ts: Timestamp | None = None) -> list[tuple]:
    return [(k[0], d) for k, d in eng.scan("ix", 0, snapshot_ts=snapshot_ts)]


def check(eng: IndexerEngine, docs: dict, at: Timestamp | None = None) -> None:
    check_index(D, eng.entries("ix", at), docs)
    sl = eng.slice("ix", 0)
    check_back_index(sl.entries(), sl.back_rows())


def test_applies_only_up_to_the_ts(eng) -> None:
    eng.enqueue([up(f"d{i}", i, i) for i in range(1, 11)])
    sl = eng.slice("ix", 0)
    assert sl.queued() == 10 and sl.high_watermark() == {0: 10}
    [ack] = eng.stabilise("ix", ts(p0=5))
    assert ack.applied == 5 and not ack.already
    assert keys(eng) == [(i, f"d{i}") for i in range(1, 6)]
    assert sl.queued() == 5 and sl.applied_ts() == ts(p0=5)
    eng.stabilise("ix", ts(p0=10))
    check(eng, {f"d{i}": {"k": i} for i in range(1, 11)}, ts(p0=10))
    assert sl.items_count == 10 and sl.queued() == 0


def test_partitions_apply_independently(eng) -> None:
    eng.enqueue([up("a", 1, 3, part=0), up("b", 2, 3, part=1), up("c", 3, 9, part=1)])
    eng.stabilise("ix", ts(p0=3, p1=4))
    assert keys(eng) == [(1, "a"), (2, "b")]
    assert eng.slice("ix", 0).queued() == 1  # c (p1 seqno 9) waits for a later TS


def test_redelivery_is_idempotent(eng) -> None:
    batch = [up("a", 1, 1), up("b", 2, 2), up("a", 5, 3), rm("b", 4)]
    assert eng.enqueue(batch).accepted == 4
    assert eng.enqueue(batch).dropped == 4  # same micro-batch again: already queued
    eng.stabilise("ix", ts(p0=4))
    sl = eng.slice("ix", 0)
    before = (sl.entries(), sl.back_rows())
    assert eng.enqueue(batch).dropped == 4  # re-run after it was applied
    [ack] = eng.stabilise("ix", ts(p0=4))
    assert ack.already and ack.writes == 0
    assert (sl.entries(), sl.back_rows()) == before
    check(eng, {"a": {"k": 5}})


def test_back_index_update_move_delete_reinsert(eng) -> None:
    eng.enqueue([up("a", 1, 1), up("b", 2, 2)])
    eng.stabilise("ix", ts(p0=2))
    eng.enqueue([up("a", 7, 3)])  # key changes: the old entry goes
    eng.stabilise("ix", ts(p0=3))
    assert keys(eng) == [(2, "b"), (7, "a")]
    eng.enqueue([rm("a", 4)])
    eng.stabilise("ix", ts(p0=4))
    sl = eng.slice("ix", 0)
    assert sl.back_rows()["a"] == (0, 4, b"")  # tombstone with the delete's seqno
    eng.enqueue([up("a", 1, 5)])  # re-insert after delete
    eng.stabilise("ix", ts(p0=5))
    check(eng, {"a": {"k": 1}, "b": {"k": 2}})
    assert sl.items_count == 2


def test_unchanged_key_writes_nothing_and_unknown_removal_is_a_noop(eng) -> None:
    eng.enqueue([up("a", 1, 1)])
    eng.stabilise("ix", ts(p0=1))
    eng.enqueue([up("a", 1, 2), rm("zz", 3, UPSERT_DELETION), rm("yy", 4, DELETE)])
    [ack] = eng.stabilise("ix", ts(p0=4))
    assert ack.applied == 3 and ack.writes == 0
    assert eng.slice("ix", 0).stats.unchanged == 1
    assert "zz" not in eng.slice("ix", 0).back_rows()


def test_last_version_per_docid_wins_within_a_ts(eng) -> None:
    # delivered out of order: the newest seqno decides, whatever the arrival order
    eng.enqueue([up("a", 3, 3), rm("a", 2, UPSERT_DELETION), up("a", 1, 1)])
    eng.stabilise("ix", ts(p0=3))
    check(eng, {"a": {"k": 3}})


def test_older_seqno_never_overwrites_newer(eng) -> None:
    eng.enqueue([up("a", 9, 9)])
    eng.stabilise("ix", ts(p0=9))
    sl = eng.slice("ix", 0)
    batch = eng.store.batch()
    with sl.lock:  # the back-index guard itself, below the enqueue filter
        row = ("ix", 0, UPSERT, encode_entry([1], "a"), "a", 0, 5)  # a queued key version
        writes, _, _, stale = sl._apply({"a": row}, batch)
    assert writes == 0 and batch.count == 0 and stale == 1
    assert eng.enqueue([up("a", 1, 5)]).dropped == 1  # and the enqueue filter drops it


def test_stabilise_rules(eng) -> None:
    eng.enqueue([up("a", 1, 2, part=0), up("b", 1, 2, part=1)])
    eng.stabilise("ix", ts(p0=2, p1=2))
    assert eng.stabilise("ix", ts(p0=1, p1=1))[0].already  # older TS: acknowledged
    with pytest.raises(ShardexError) as ei:
        eng.stabilise("ix", ts(p0=5, p1=1))  # forwards in one, backwards in another
    assert ei.value.code == ErrorCode.BAD_REQUEST
    assert eng.enqueue([("nope", 0, UPSERT, b"x", "a", 0, 9)]).unknown == 1
    with pytest.raises(ShardexError) as ei:
        eng.stabilise("nope", ts(p0=1))
    assert ei.value.code == ErrorCode.INDEX_NOT_FOUND


def test_same_seqnos_on_a_new_branch_move_the_applied_ts_and_snapshot(eng) -> None:
    """A failover with no write since: the round's TS names the promoted partition's new
    uuid at the seqno already applied. The slice takes it (nothing to apply), so a scan at
    the new TS finds a snapshot and the timekeeper sees the TS applied."""
    eng.enqueue([up("a", 1, 2, part=0), up("b", 2, 3, part=1)])
    eng.stabilise("ix", ts(p0=2, p1=3))
    branched = Timestamp({0: (2, 0xBEEF), 1: (3, U)})
    [ack] = eng.stabilise("ix", branched)
    sl = eng.slice("ix", 0)
    assert not ack.already and ack.applied == 0
    assert sl.applied_ts() == branched
    assert sl.snapshot_timestamps()[-1] == branched
    assert keys(eng, branched) == [(1, "a"), (2, "b")]
    assert eng.stabilise("ix", branched)[0].already  # a re-sent TS: no work


def test_snapshots_keep_last_k_and_old_scans_see_old_state(eng) -> None:
    # step i: d{i} in, d{i-1} out; stabilise at p0=10*i
    for i in range(1, 6):
        eng.enqueue([up(f"d{i}", i, 10 * i - 1), rm(f"d{i - 1}", 10 * i, UPSERT_DELETION)])
        eng.stabilise("ix", ts(p0=10 * i))
    sl = eng.slice("ix", 0)
    assert sl.snapshot_timestamps() == [ts(p0=30), ts(p0=40), ts(p0=50)]
    assert eng.latest_snapshot_ts("ix") == ts(p0=50)
    with pytest.raises(ShardexError) as ei:
        list(eng.scan("ix", 0, snapshot_ts=ts(p0=20)))
    assert ei.value.code == ErrorCode.SNAPSHOT_TOO_OLD
    with pytest.raises(ShardexError) as ei:
        eng.scan("ix", 0, snapshot_ts=ts(p0=90))
    assert ei.value.code == ErrorCode.INDEX_NOT_READY
    it = eng.scan("ix", 0, snapshot_ts=ts(p0=30))
    eng.enqueue([up("d3", 100, 51)])  # the tip moves; the snapshot does not
    eng.stabilise("ix", ts(p0=60))
    assert list(it) == [([3], "d3")]  # pinned at scan(): the release at p0=60 is harmless
    assert keys(eng) == [(5, "d5"), (100, "d3")]
    assert keys(eng, ts(p0=40)) == [(4, "d4")]
    with pytest.raises(ShardexError):
        eng.scan("ix", 0, snapshot_ts=ts(p0=30))  # released by the stabilise at 60


def test_scan_spans_limit_reverse(tmp_path) -> None:
    d = make_definition(id="ix", name="ix", keyspace="ks", keys=["a", ("b", True)])
    with IndexerEngine(tmp_path / "s", sync=False) as e:
        e.create_slice(d, 0)
        rows = []
        for i, (a, b) in enumerate([(a, b) for a in range(4) for b in range(3)]):
            entry = encode_entry([a, b], f"x{a}{b}", [False, True])
            rows.append(("ix", 0, UPSERT, entry, f"x{a}{b}", 0, i + 1))
        e.enqueue(rows)
        e.stabilise("ix", ts(p0=100))

        def scan(*spans, **kw):
            return [tuple(k) for k, _ in e.scan("ix", 0, list(spans), **kw)]

        one, two = encode_key([1]), encode_key([2])
        assert scan(Span(one, one)) == [(1, 2), (1, 1), (1, 0)]  # prefix, DESC second part
        assert scan(Span(one, two, False, True)) == [(2, 2), (2, 1), (2, 0)]
        assert scan(Span(one, two, True, False)) == [(1, 2), (1, 1), (1, 0)]
        assert scan(Span(None, one, True, False)) == [(0, 2), (0, 1), (0, 0)]
        assert len(scan(Span(two, None))) == 6
        k11 = encode_key([1, 1], [False, True])
        assert scan(Span(k11, k11)) == [(1, 1)]
        # overlapping spans never return an entry twice; reverse and limit
        assert len(scan(Span(one, two), Span(two, None))) == 9
        assert scan(Span(one, two), reverse=True, limit=2) == [(2, 0), (2, 1)]
        assert scan(Span(two, one)) == []
        assert len(list(e.scan("ix", 0))) == 12


@pytest.mark.parametrize("use_sst", [False, True])
def test_bulk_load_then_stream(eng, use_sst: bool) -> None:
    ts0 = ts(p0=10, p1=4)
    sl = eng.slice("ix", 0)
    sl.begin_load(ts0)
    eng.enqueue([up("b", 99, 12), up("a", 0, 3)])  # while loading: > T0 queued, <= T0 dropped
    assert sl.queued() == 1
    load = [up(f"d{i}", i, i, part=i % 2) for i in range(1, 9)]
    method = eng.bulk_load("ix", 0, [*load, rm("x", 5, UPSERT_DELETION)], ts0, use_sst=use_sst)
    assert method == ("sst" if use_sst else "batch")
    assert sl.state == STATE_ACTIVE and sl.applied_ts() == ts0 and sl.items_count == 8
    assert sl.snapshot_timestamps() == [ts0]
    assert eng.enqueue([up("d1", 50, 1)]).dropped == 1  # covered by T0
    eng.enqueue([up("d2", 42, 13), rm("d3", 5, part=1)])
    eng.stabilise("ix", ts(p0=13, p1=5))
    docs = {f"d{i}": {"k": i} for i in range(1, 9)} | {"b": {"k": 99}, "d2": {"k": 42}}
    del docs["d3"]
    check(eng, docs)
    with pytest.raises(ShardexError):
        eng.bulk_load("ix", 0, load, ts0)  # only into an empty slice


def test_rollback_marks_rebuild_and_reset(eng) -> None:
    eng.enqueue([up("a", 1, 3), up("b", 2, 8)])
    eng.stabilise("ix", ts(p0=5))
    assert eng.rollback_to("ks", 0, 6) == []  # applied 5 <= 6: only the queue is trimmed
    assert eng.slice("ix", 0).queued() == 0
    assert eng.rollback_to("other", 0, 0) == []
    [sl] = eng.rollback_to("ks", 0, 2)  # applied beyond the rollback point
    assert sl.state == STATE_NEEDS_REBUILD
    for call in (lambda: eng.scan("ix", 0), lambda: eng.stabilise("ix", ts(p0=9))):
        with pytest.raises(ShardexError) as ei:
            call()
        assert ei.value.code == ErrorCode.INDEX_IN_ROLLBACK
    assert eng.enqueue([up("c", 1, 10)]).accepted == 0
    eng.reset("ix", 0)
    assert sl.state == STATE_CREATED and sl.entries() == [] and sl.back_rows() == {}
    eng.bulk_load("ix", 0, [up("a", 1, 1)], ts(p0=2))
    check(eng, {"a": {"k": 1}})


def test_purge_tombstones(eng) -> None:
    eng.enqueue([up("a", 1, 1), up("b", 1, 2)])
    eng.stabilise("ix", ts(p0=2))
    eng.enqueue([rm("a", 3), rm("b", 4, UPSERT_DELETION)])
    eng.stabilise("ix", ts(p0=4))
    sl = eng.slice("ix", 0)
    assert eng.purge_tombstones("ix", ts(p0=3)) == 1  # only a's removal is covered
    assert set(sl.back_rows()) == {"b"}
    eng.enqueue([up("b", 2, 5)])  # re-insert over a tombstone, then purge: stays
    eng.stabilise("ix", ts(p0=5))
    assert eng.purge_tombstones("ix", ts(p0=5)) == 0
    check(eng, {"b": {"k": 2}})


def test_reopen_keeps_state_and_snapshot(tmp_path) -> None:
    path = tmp_path / "r"
    with IndexerEngine(path, sync=False) as e:
        e.create_slice(D, 0)
        e.enqueue([up("a", 1, 1), up("b", 2, 2), up("c", 3, 3)])
        e.stabilise("ix", ts(p0=2))
        sl = e.slice("ix", 0)
        sl.begin_load  # noqa: B018 - attribute exists (API surface)
    with IndexerEngine(path, sync=False) as e:
        sl = e.slice("ix", 0)
        assert sl.state == STATE_ACTIVE and sl.applied_ts() == ts(p0=2)
        assert sl.queued() == 0  # the queue is memory only: re-delivered from applied TS
        assert e.stabilise("ix", ts(p0=2))[0].already
        assert [d for _, d in e.scan("ix", 0, snapshot_ts=ts(p0=2))] == ["a", "b"]
        assert sl.items_count == 2
        assert e.create_slice(D, 0) is sl
        e.create_slice(D, 0)
        e2 = make_definition(id="ix2", name="b", keyspace="ks", keys=["k"])
        e.create_slice(e2, 0).begin_load(ts(p0=1))  # torn load: crash while loading
    with IndexerEngine(path, sync=False) as e:
        assert e.slice("ix2", 0).state == STATE_NEEDS_REBUILD
        assert e.drop_index("ix2") == 1
        with pytest.raises(ShardexError):
            e.slice("ix2", 0)
