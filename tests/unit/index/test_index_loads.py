"""The engine under the pipeline's wire protocol: ``stabilise_many`` (one atomic write for
several indexes, states skipped, missing indexes) and load sessions (chunks, duplicates,
restarts, stale and rolled-back loads), plus ``describe_slices`` on the simulator's engine."""

from __future__ import annotations

import pytest

from shardex.core.keycodec import encode_entry
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index import (
    DELETE,
    STATE_ACTIVE,
    STATE_CREATED,
    STATE_LOADING,
    STATE_NEEDS_REBUILD,
    UPSERT,
    IndexerEngine,
    bulk,
    make_definition,
)
from shardex.index.delivery import describe_slices
from shardex.index.oracle import check_index
from shardex.testing.index_fake import MemorySliceEngine

A = make_definition(
    id="a", name="a", keyspace="ks", keys=["k"], partition_by=["META().id"], num_partition=2
)
B = make_definition(id="b", name="b", keyspace="ks", keys=["k"])
U = 0xFEED


def ts(*seqnos: int, uuid: int = U) -> Timestamp:
    return Timestamp({p: (s, uuid) for p, s in enumerate(seqnos)})


def up(index_id: str, ip: int, docid: str, k: object, seqno: int, part: int = 0) -> tuple:
    return (index_id, ip, UPSERT, encode_entry([k], docid), docid, part, seqno)


@pytest.fixture
def eng(tmp_path):
    e = IndexerEngine(tmp_path / "idx", sync=False)
    for p in (0, 1):
        e.create_slice(A, p)
    e.create_slice(B, 0)
    yield e
    e.close()


def count_writes(eng: IndexerEngine, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    calls: list[bool] = []
    real = eng.store.write

    def write(batch, *, sync: bool = False):  # type: ignore[no-untyped-def]
        calls.append(sync)
        return real(batch, sync=sync)

    monkeypatch.setattr(eng.store, "write", write)
    return calls


def test_stabilise_many_is_one_write_and_reports_every_slice(eng, monkeypatch) -> None:
    eng.sync = True
    eng.enqueue([up("a", 0, "x", 1, 1), up("a", 1, "y", 2, 2), up("b", 0, "x", 1, 1)])
    eng.enqueue([up("b", 0, "z", 3, 3)])
    writes = count_writes(eng, monkeypatch)
    res = eng.stabilise_many(["b", "a", "gone", "a"], ts(3))
    assert writes == [True]  # every slice of both indexes in one synced write
    assert res.missing == ["gone"]
    assert [(r.index_id, r.partition, r.state, r.items_count) for r in res.slices] == [
        ("a", 0, STATE_ACTIVE, 1),
        ("a", 1, STATE_ACTIVE, 1),
        ("b", 0, STATE_ACTIVE, 2),
    ]
    assert all(r.applied == ts(3) and r.ack is not None for r in res.slices)
    check_index(B, eng.entries("b", ts(3)), {"x": {"k": 1}, "z": {"k": 3}})
    # Again at the same TS: acknowledged without work, no write.
    again = eng.stabilise_many(["a", "b"], ts(3))
    assert writes == [True] and all(r.ack and r.ack.already for r in again.slices)


def test_stabilise_many_skips_loading_and_rebuilding_slices(eng) -> None:
    eng.load_chunk("a", 1, ts(2), [up("a", 1, "y", 2, 2)])
    eng.slice("b", 0).rollback_to(0, 0)  # never applied anything: stays created
    eng.enqueue([up("a", 0, "x", 1, 3), up("b", 0, "x", 1, 3)])
    res = eng.stabilise_many(["a", "b"], ts(3))
    got = {(r.index_id, r.partition): (r.state, r.ack is not None) for r in res.slices}
    assert got == {
        ("a", 0): (STATE_ACTIVE, True),
        ("a", 1): (STATE_LOADING, False),
        ("b", 0): (STATE_ACTIVE, True),
    }
    eng.slice("b", 0).rollback_to(0, 1)  # applied 3 > 1: needs a rebuild
    res = eng.stabilise_many(["b"], ts(4))
    assert [(r.state, r.ack, r.applied) for r in res.slices] == [(STATE_NEEDS_REBUILD, None, ts(3))]


def test_stabilise_many_refusal_writes_nothing(eng, monkeypatch) -> None:
    eng.enqueue([up("b", 0, "x", 1, 5)])
    eng.stabilise_many(["b"], ts(5, 5))
    eng.enqueue([up("a", 0, "x", 1, 6), up("a", 1, "y", 2, 1, part=1)])
    writes = count_writes(eng, monkeypatch)
    # Forwards for a (its slices come first in the batch), backwards in partition 1 for b:
    # the whole round is refused and nothing of a is written.
    with pytest.raises(ShardexError) as err:
        eng.stabilise_many(["a", "b"], ts(6, 4))
    assert err.value.code == ErrorCode.BAD_REQUEST and writes == []
    for p in (0, 1):
        sl = eng.slice("a", p)
        assert sl.applied_ts() == Timestamp() and sl.state == STATE_CREATED
        assert sl.queued() == 1 and sl.entries() == []
    assert eng.slice("b", 0).applied_ts() == ts(5, 5)


def test_load_session_collapses_duplicates_and_ignores_removals(eng) -> None:
    t0 = ts(4)
    rows = [up("b", 0, f"d{i}", i, i + 1) for i in range(4)]
    assert eng.load_chunk("b", 0, t0, rows[:3], docs=3) == 3
    assert eng.load_chunk("b", 0, t0, rows[1:], docs=3) == 4  # a retried task overlaps
    assert eng.load_chunk("b", 0, t0, [("b", 0, DELETE, b"", "d9", 0, 2)]) == 4
    session = eng.load_session("b", 0)
    assert session is not None and session.docs == 6 and session.chunks == 3
    assert eng.slice("b", 0).state == STATE_LOADING
    with pytest.raises(ShardexError) as err:
        eng.load_chunk("b", 0, t0, [up("a", 1, "x", 1, 1)])
    assert err.value.code == ErrorCode.BAD_REQUEST and "a/1" in err.value.message
    assert eng.load_finish("b", 0, t0) == 4
    assert eng.load_session("b", 0) is None
    check_index(B, eng.entries("b", t0), {f"d{i}": {"k": i} for i in range(4)})
    # Retries after the finish, even once the maintenance stream moved the slice on.
    eng.enqueue([up("b", 0, "d9", 9, 5)])
    eng.stabilise_many(["b"], ts(5))
    assert eng.load_finish("b", 0, t0) == 5
    assert eng.load_chunk("b", 0, t0, rows) == 5
    assert eng.slice("b", 0).applied_ts() == ts(5)


def test_restarts_stale_loads_and_rollbacks(eng) -> None:
    eng.load_chunk("b", 0, ts(3), [up("b", 0, "old", 1, 1)])
    # A restarted build at a newer T0 replaces the session (and the slice's storage).
    assert eng.load_chunk("b", 0, ts(5), [up("b", 0, "new", 2, 4)]) == 1
    with pytest.raises(ShardexError) as err:
        eng.load_chunk("b", 0, ts(3), [])  # a straggler of the abandoned build
    assert err.value.code == ErrorCode.BAD_REQUEST
    assert err.value.details["session_ts0"] == ts(5).to_json()
    # Rolled back during the load: the rows at that T0 are void.
    eng.rollback_to("ks", 0, 2)
    for call in (
        lambda: eng.load_chunk("b", 0, ts(5), []),
        lambda: eng.load_finish("b", 0, ts(5)),
    ):
        with pytest.raises(ShardexError) as err:
            call()
        assert err.value.code == ErrorCode.INDEX_IN_ROLLBACK
    # A build on the new history (another uuid) starts over from an empty slice.
    t_new = ts(2, uuid=U + 1)
    assert eng.load_chunk("b", 0, t_new, [up("b", 0, "kept", 7, 2)]) == 1
    assert eng.load_finish("b", 0, t_new) == 1
    check_index(B, eng.entries("b", t_new), {"kept": {"k": 7}})


def test_empty_loads_and_needs_rebuild_after_reopen(tmp_path) -> None:
    path = tmp_path / "idx"
    with IndexerEngine(path, sync=False) as e:
        e.create_slice(B, 0)
        e.load_chunk("b", 0, ts(2), [up("b", 0, "x", 1, 1)])
    with IndexerEngine(path, sync=False) as e:
        sl = e.slice("b", 0)
        assert sl.state == STATE_NEEDS_REBUILD and e.load_session("b", 0) is None
        e.enqueue([up("b", 0, "late", 5, 3)])  # dropped while it needs a rebuild
        # The build restarts with no chunk for this slice: it loads empty at T0.
        assert e.load_finish("b", 0, ts(2)) == 0
        assert sl.state == STATE_ACTIVE and sl.applied_ts() == ts(2)
        assert e.entries("b", ts(2)) == {0: []}
        # A created slice finished without chunks: empty too.
        e.create_slice(A, 0)
        assert e.load_finish("a", 0, ts(2)) == 0 and e.slice("a", 0).state == STATE_ACTIVE
        # An active slice refuses a load at another T0.
        with pytest.raises(ShardexError) as err:
            e.load_chunk("a", 0, ts(3), [])
        assert err.value.code == ErrorCode.BAD_REQUEST and "hint" in err.value.details


def test_drop_index_forgets_its_sessions(eng) -> None:
    eng.load_chunk("a", 0, ts(1), [up("a", 0, "x", 1, 1)])
    assert eng.drop_index("a") == 2
    assert eng.load_session("a", 0) is None
    eng.create_slice(A, 0)
    assert eng.load_finish("a", 0, ts(1)) == 0  # the old rows did not survive the drop


def test_describe_slices_on_the_simulators_engine() -> None:
    sim = MemorySliceEngine()
    sim.create_slice(B, 0)
    (info,) = describe_slices(sim, None, lambda _i: ts(1))
    assert (info.index_id, info.state, info.items_count, info.queued) == ("b", "created", 0, 0)
    assert info.applied == {} and info.stability == ts(1).to_wire()
    assert describe_slices(sim, "other", lambda _i: None) == []


def test_a_rebuild_over_old_storage_by_sst_holds_only_the_new_load(eng, monkeypatch) -> None:
    monkeypatch.setattr(bulk, "SST_THRESHOLD", 1)  # ingestion even for a few entries
    eng.enqueue([up("b", 0, f"d{i}", i, i + 1) for i in range(5)])
    eng.stabilise_many(["b"], ts(5))
    assert eng.rollback_to("ks", 0, 2) == [eng.slice("b", 0)]
    t_new = ts(3, uuid=U + 1)
    rows = [up("b", 0, "d0", 10, 1), up("b", 0, "n1", 11, 3)]
    assert eng.load_chunk("b", 0, t_new, rows) == 2
    assert eng.load_finish("b", 0, t_new) == 2
    check_index(B, eng.entries("b", t_new), {"d0": {"k": 10}, "n1": {"k": 11}})
    assert set(eng.slice("b", 0).back_rows()) == {"d0", "n1"}


def test_the_drivers_begin_restarts_an_active_slice_a_chunk_cannot(eng) -> None:
    """A build attempt that finished this slice and failed on another is retried at a newer
    T0; a slice whose node missed a rollback holds a lost branch. The driver's begin reloads
    both; a chunk (a worker of an abandoned attempt may still send one) never restarts an
    active slice, and a begin its applied TS covers is an older attempt's."""
    eng.load_chunk("b", 0, ts(2), [up("b", 0, "first", 1, 1)])
    assert eng.load_finish("b", 0, ts(2)) == 1
    with pytest.raises(ShardexError) as err:
        eng.load_chunk("b", 0, ts(4), [])
    assert err.value.code == ErrorCode.BAD_REQUEST and "LoadBegin" in err.value.details["hint"]
    for older in (ts(1), ts(2)):
        if older == ts(2):  # the attempt at the applied TS finished: nothing to do
            assert eng.load_begin("b", 0, older) == STATE_ACTIVE
        else:
            with pytest.raises(ShardexError) as err:
                eng.load_begin("b", 0, older)
            assert err.value.code == ErrorCode.BAD_REQUEST
        assert eng.slice("b", 0).state == STATE_ACTIVE
    assert eng.load_begin("b", 0, ts(4)) == STATE_ACTIVE
    assert eng.slice("b", 0).state != STATE_ACTIVE
    assert eng.load_begin("b", 0, ts(4)) != STATE_ACTIVE  # idempotent
    with pytest.raises(ShardexError) as err:  # a straggler of the finished attempt
        eng.load_chunk("b", 0, ts(2), [])
    assert err.value.code == ErrorCode.BAD_REQUEST
    assert eng.load_chunk("b", 0, ts(4), [up("b", 0, "second", 2, 3)]) == 1
    assert eng.load_finish("b", 0, ts(4)) == 1
    check_index(B, eng.entries("b", ts(4)), {"second": {"k": 2}})
    # Active on a branch that is gone (another uuid): the begin on the new one reloads.
    branch = ts(3, uuid=U + 1)
    assert eng.load_begin("b", 0, branch) == STATE_ACTIVE
    assert eng.load_chunk("b", 0, branch, [up("b", 0, "kept", 7, 3)]) == 1
    assert eng.load_finish("b", 0, branch) == 1
    check_index(B, eng.entries("b", branch), {"kept": {"k": 7}})
