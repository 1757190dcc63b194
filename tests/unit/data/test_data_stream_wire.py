"""The stream server's form of a run (``DataEngine.stream(..., wire=True)``: changes as
``StreamBatch`` tuples) carries exactly what ``stream`` does, and ``_take`` reports an
exhausted run so a bounded stream is served without an extra executor trip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shardex.api.records import Change, SnapshotMarker
from shardex.data.engine import DataEngine
from shardex.data.streaming import _batches, _take


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[DataEngine]:
    eng = DataEngine(tmp_path / "db")
    eng.create_keyspace("ks", 1)
    eng.create_partition("ks", 0)
    yield eng
    eng.close()


def _as_tuple(c: Change) -> tuple:
    return (c.seqno, c.docid, c.op, c.cas, c.body, c.flags, c.expiry)


def test_wire_items_match_change_items(engine: DataEngine) -> None:
    for i in range(20):
        engine.upsert("ks", f"d{i}", {"i": i}, durability="memory")
    engine.delete("ks", "d3", durability="memory")
    engine.upsert("ks", "d3", {"back": True}, durability="memory")
    for start, end in ((0, None), (5, 15), (21, 22), (22, 22)):
        plain = list(engine.stream("ks", 0, start, 0 if start == 0 else _uuid(engine), end))
        uuid = 0 if start == 0 else _uuid(engine)
        wire = list(engine.stream("ks", 0, start, uuid, end, wire=True))
        assert len(plain) == len(wire)
        for a, b in zip(plain, wire, strict=True):
            if isinstance(a, SnapshotMarker):
                assert a == b
            else:
                assert _as_tuple(a) == b
    deleted = [
        t for t in engine.stream("ks", 0, 0, 0, wire=True) if type(t) is tuple and t[2] == "delete"
    ]
    assert [(t[1], t[4]) for t in deleted] == [("d3", None)]


def _uuid(engine: DataEngine) -> int:
    return engine.partition_info("ks", 0).uuid


def test_take_reports_the_end_of_a_run(engine: DataEngine) -> None:
    for i in range(10):
        engine.upsert("ks", f"d{i}", {"i": i}, durability="memory")
    run = engine.stream("ks", 0, 0, 0, 10, wire=True)  # marker + 10 changes
    items, done = _take(run, 20, 1 << 20)
    assert len(items) == 11 and done  # fewer than asked: no further take needed
    run = engine.stream("ks", 0, 0, 0, 10, wire=True)
    first, done = _take(run, 11, 1 << 20)
    assert len(first) == 11 and not done  # exactly n: the end is unknown yet
    assert _take(run, 11, 1 << 20) == ([], True)
    run = engine.stream("ks", 0, 0, 0, 10, wire=True)
    cut, done = _take(run, 20, 1)  # the byte cap cuts after the first change
    assert len(cut) == 2 and not done
    rest, done = _take(run, 20, 1 << 20)
    assert len(rest) == 9 and done
    batches = list(_batches(7, cut + rest))
    assert len(batches) == 1 and batches[0].marker is not None
    assert [c[0] for c in batches[0].changes] == list(range(1, 11))
