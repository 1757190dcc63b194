"""Retention: change records and tombstones are purged once older than the retention window
AND passed by every registered consumer; streams from below the purge seqno roll back."""

from __future__ import annotations

import pytest

from shardex.api.records import Change, SnapshotMarker
from shardex.data.engine import DataEngine
from shardex.errors import ErrorCode, ShardexError


@pytest.fixture
def engine(tmp_path):
    eng = DataEngine(tmp_path / "db", retention_seqnos=10)
    eng.create_keyspace("one", 1)
    eng.create_partition("one", 0)
    yield eng
    eng.close()


LIVE = [f"d{i}" for i in (0, 1, 2, 3, 5, 6, 7, 8)]


def fill(engine: DataEngine, n: int) -> None:
    """Upserts of the LIVE docids, and every 5th step an insert + delete of x<i>."""
    for i in range(n):
        if i % 5 == 4:
            engine.insert("one", f"x{i}", {}, durability="memory")
            engine.delete("one", f"x{i}", durability="memory")
        else:
            engine.upsert("one", f"d{i % 10}", {"i": i}, durability="memory")


def test_purge_keeps_retention_window_and_drops_tombstones(engine):
    fill(engine, 30)  # 36 seqnos: 24 upserts of d*, 6 inserts + 6 deletes of x*
    info = engine.partition_info("one", 0)
    assert info.high_seqno == 36
    assert engine.purge() == {("one", 0): 26}
    info = engine.partition_info("one", 0)
    assert info.purge_seqno == 26
    uuid = info.uuid
    # Records above the purge seqno are all still there, in order.
    assert [c.seqno for c in engine.stream("one", 0, 26, uuid) if isinstance(c, Change)] == list(
        range(27, 37)
    )
    # Tombstones created at or below the purge seqno are gone; newer ones stay.
    tombstones = {
        d: engine._parts[("one", 0)].read_doc(d) for d in (f"x{i}" for i in range(4, 30, 5))
    }
    assert {d for d, r in tombstones.items() if r is not None} == {
        d for d, r in tombstones.items() if r is not None and r.seqno > 26
    }
    assert any(r is None for r in tombstones.values())
    # Live documents are never purged.
    assert all(engine.get("one", d).doc is not None for d in LIVE)
    # A stream from below the purge seqno must roll back to 0; at it, it is fine.
    with pytest.raises(ShardexError) as err:
        engine.stream("one", 0, 20, uuid)
    assert err.value.code is ErrorCode.ROLLBACK and err.value.details["rollback_seqno"] == 0
    assert next(engine.stream("one", 0, 26, uuid)).start == 27
    assert engine.purge() == {}  # nothing new to purge


def test_consumer_checkpoint_holds_records_back(engine):
    fill(engine, 40)
    engine.set_consumer_checkpoint("pipeline", "one", 0, 5)
    engine.set_consumer_checkpoint("other", "one", 0, 30)
    assert engine.consumer_checkpoints("one", 0) == {"other": 30, "pipeline": 5}
    engine.purge()
    assert engine.partition_info("one", 0).purge_seqno == 5
    engine.set_consumer_checkpoint("pipeline", "one", 0, 45)
    engine.purge()
    assert engine.partition_info("one", 0).purge_seqno == 30  # now "other" is the laggard
    engine.remove_consumer("other")
    engine.purge()
    high = engine.partition_info("one", 0).high_seqno
    assert engine.partition_info("one", 0).purge_seqno == high - 10


def test_stream_from_zero_after_purge_is_a_backfill_of_current_documents(engine):
    fill(engine, 30)
    engine.purge()
    uuid = engine.partition_info("one", 0).uuid
    items = list(engine.stream("one", 0, 0, 0))
    marker = items[0]
    assert marker == SnapshotMarker(0, 1, 36, uuid, backfill=True)
    got = [c for c in items[1:] if isinstance(c, Change)]
    assert [c.seqno for c in got] == sorted(c.seqno for c in got)
    live = {c.docid: c.doc() for c in got if not c.deleted}
    assert live == {d: engine.get("one", d).doc for d in LIVE}
    with pytest.raises(ShardexError) as err:
        engine.stream("one", 0, 0, 0, end_seqno=30)
    assert err.value.code is ErrorCode.BAD_REQUEST


def test_purge_survives_reopen_and_writes_continue(engine, tmp_path):
    fill(engine, 30)
    engine.purge()
    before = engine.partition_info("one", 0)
    engine.close()
    with DataEngine(tmp_path / "db", retention_seqnos=10) as eng:
        assert eng.partition_info("one", 0) == before
        assert eng.upsert("one", "z", {}).seqno == before.high_seqno + 1
