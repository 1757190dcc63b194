"""``ReadRanges`` on the node (``data/range_reads.py``), against an in-process engine: every
range's answer is what a stream of it carries, the reply's caps cut and say where, errors
stay with their range, a backfill is sent to a stream, and malformed requests fail whole."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardex.api.data import RangeChanges, RangeSpec, ReadRanges
from shardex.api.errors import not_my_partition
from shardex.api.records import SnapshotMarker
from shardex.data.engine import DataEngine
from shardex.data.range_reads import MAX_RANGES, RangeReadServer, read_ranges
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.partitioning import partition_of

PARTS = 4


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[DataEngine]:
    eng = DataEngine(tmp_path / "db")
    eng.create_keyspace("ks", PARTS)
    for p in range(PARTS - 1):  # the last partition is not held here
        eng.create_partition("ks", p)
    yield eng
    eng.close()


def _ids(partition: int, n: int) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < n:
        if partition_of(f"d{i}", PARTS) == partition:
            out.append(f"d{i}")
        i += 1
    return out


def _fill(engine: DataEngine, per_partition: int) -> None:
    """``per_partition`` writes to each held partition: three docids over and over (so
    docids repeat), then partition 0 deletes one."""
    for p in range(PARTS - 1):
        ids = _ids(p, 3)
        for i in range(per_partition):
            engine.upsert("ks", ids[i % 3], {"i": i, "pad": "x" * 50}, durability="memory")
    engine.delete("ks", _ids(0, 1)[0], durability="memory")


def _stream_tuples(engine: DataEngine, p: int, start: int, uuid: int, end: int) -> list[tuple]:
    return [
        t
        for t in engine.stream("ks", p, start, uuid, end, wire=True)
        if not isinstance(t, SnapshotMarker)
    ]


def _spec(engine: DataEngine, p: int, start: int, end: int | None = None) -> RangeSpec:
    info = engine.partition_info("ks", p)
    return RangeSpec(p, start, info.uuid if start else 0, info.high_seqno if end is None else end)


def test_each_range_carries_what_its_stream_carries(engine: DataEngine) -> None:
    _fill(engine, 30)
    specs = [_spec(engine, p, 0) for p in range(PARTS - 1)]
    out = read_ranges(engine, "ks", specs, 20_000, 1 << 20)
    for spec, res in zip(specs, out, strict=True):
        assert isinstance(res, RangeChanges) and res.error is None
        assert res.reached == spec.end_seqno
        assert res.uuid == engine.partition_info("ks", spec.partition).uuid
        want = _stream_tuples(engine, spec.partition, spec.from_seqno, spec.uuid, spec.end_seqno)
        assert [tuple(c) for c in res.changes] == want
    middle = _spec(engine, 1, 3, 9)
    (res,) = read_ranges(engine, "ks", [middle], 20_000, 1 << 20)
    assert isinstance(res, RangeChanges) and [c[0] for c in res.changes] == list(range(4, 10))
    empty = _spec(engine, 1, 5, 5)
    assert read_ranges(engine, "ks", [empty], 20_000, 1 << 20) == [
        RangeChanges(partition=1, uuid=empty.uuid, reached=5)
    ]


def test_caps_cut_the_reply_and_say_where(engine: DataEngine) -> None:
    _fill(engine, 20)
    specs = [_spec(engine, p, 0) for p in range(PARTS - 1)]
    highs = [s.end_seqno for s in specs]
    # 25 items: the first range whole (its 20 or 21), the second cut, the third untouched.
    out = read_ranges(engine, "ks", specs, 25, 1 << 20)
    assert all(isinstance(r, RangeChanges) for r in out)
    got = [len(r.changes) for r in out]  # type: ignore[union-attr]
    assert got[0] == highs[0] and got[1] == 25 - highs[0] and got[2] == 0
    assert [r.reached for r in out] == [highs[0], 25 - highs[0], 0]  # type: ignore[union-attr]
    # Bytes: a tiny budget still returns one change (progress), then nothing.
    out = read_ranges(engine, "ks", specs, 20_000, 1)
    assert [r.reached for r in out] == [1, 0, 0]  # type: ignore[union-attr]
    # Continuing from where a cut stopped gives the rest, dense.
    first = read_ranges(engine, "ks", specs[:1], 7, 1 << 20)[0]
    assert isinstance(first, RangeChanges) and first.reached == 7
    rest = read_ranges(engine, "ks", [RangeSpec(0, 7, first.uuid, highs[0])], 20_000, 1 << 20)[0]
    assert isinstance(rest, RangeChanges)
    seqnos = [c[0] for c in first.changes] + [c[0] for c in rest.changes]
    assert seqnos == list(range(1, highs[0] + 1))


def test_errors_stay_with_their_range(engine: DataEngine) -> None:
    _fill(engine, 10)
    good = _spec(engine, 0, 0)
    forged = _spec(engine, 1, 3)
    forged = RangeSpec(1, 3, forged.uuid ^ 0x5A5A, forged.end_seqno)
    above = _spec(engine, 2, 0)
    above = RangeSpec(2, 0, 0, above.end_seqno + 5)
    absent = RangeSpec(PARTS - 1, 0, 0, 4)
    out = read_ranges(engine, "ks", [forged, good, above, absent], 20_000, 1 << 20)
    rb, ok, short, gone = out
    assert isinstance(rb, ShardexError) and rb.code is ErrorCode.ROLLBACK
    assert rb.details["partition"] == 1 and rb.details["rollback_seqno"] == 0
    assert isinstance(ok, RangeChanges) and ok.reached == good.end_seqno and ok.changes
    assert isinstance(short, ShardexError) and short.code is ErrorCode.ROLLBACK
    high = above.end_seqno - 5
    assert short.details["rollback_seqno"] == high and short.details["planned_end"] == high + 5
    assert isinstance(gone, ShardexError) and gone.code is ErrorCode.NOT_MY_PARTITION


def test_a_backfill_is_sent_to_a_stream(tmp_path: Path) -> None:
    with DataEngine(tmp_path / "db", retention_seqnos=5) as eng:
        eng.create_keyspace("ks", 1)
        eng.create_partition("ks", 0)
        for i in range(30):
            eng.upsert("ks", f"d{i % 4}", {"i": i}, durability="memory")
        assert eng.purge()
        high = eng.partition_info("ks", 0).high_seqno
        (res,) = read_ranges(eng, "ks", [RangeSpec(0, 0, 0, high)], 20_000, 1 << 20)
        assert isinstance(res, RangeChanges) and res.use_stream and not res.changes
        # Not from 0: an ordinary log read above the purge point.
        uuid = eng.partition_info("ks", 0).uuid
        (res,) = read_ranges(eng, "ks", [RangeSpec(0, high - 3, uuid, high)], 20_000, 1 << 20)
        assert isinstance(res, RangeChanges) and [c[0] for c in res.changes] == [
            high - 2,
            high - 1,
            high,
        ]


# --- the request as a whole -------------------------------------------------------------------


async def _inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _server(engine: DataEngine, cluster_parts: int | None = PARTS) -> RangeReadServer:
    return RangeReadServer(engine, _inline, lambda exc: exc, lambda ks: cluster_parts)


def _ask(server: RangeReadServer, msg: ReadRanges) -> Any:
    return asyncio.run(server.on_read(msg, None))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ranges", "kw", "what"),
    [
        ([RangeSpec(0, 5, 1, 4)], {}, "from_seqno <= end_seqno"),
        ([RangeSpec(0, 0, 0, 1), RangeSpec(0, 1, 0, 2)], {}, "listed twice"),
        ([RangeSpec(PARTS, 0, 0, 1)], {}, "outside"),
        ([RangeSpec(-1, 0, 0, 1)], {}, "outside"),
        ([RangeSpec(0, -1, 0, 1)], {}, "from_seqno <= end_seqno"),
        ([RangeSpec(0, 0, 0, 1)], {"max_items": 0}, "max_items"),
        ([RangeSpec(0, 0, 0, 1)], {"max_bytes": 0}, "max_bytes"),
        ([RangeSpec(p, 0, 0, 0) for p in range(MAX_RANGES + 1)], {}, "more than"),
    ],
)
def test_bad_requests_fail_whole(
    engine: DataEngine, ranges: list[RangeSpec], kw: dict[str, int], what: str
) -> None:
    _fill(engine, 3)
    before = [engine.partition_info("ks", p).high_seqno for p in range(PARTS - 1)]
    with pytest.raises(ShardexError) as err:
        _ask(_server(engine), ReadRanges(keyspace="ks", ranges=ranges, **kw))
    assert err.value.code is ErrorCode.BAD_REQUEST and what in err.value.message
    assert [engine.partition_info("ks", p).high_seqno for p in range(PARTS - 1)] == before
    # And the next good request is served.
    ok = _ask(_server(engine), ReadRanges(keyspace="ks", ranges=[_spec(engine, 0, 0)]))
    assert ok.results[0].reached == before[0]


def test_unknown_keyspace_and_a_keyspace_held_elsewhere(engine: DataEngine) -> None:
    msg = ReadRanges(keyspace="nope", ranges=[RangeSpec(0, 0, 0, 1)])
    with pytest.raises(ShardexError) as err:
        _ask(_server(engine, cluster_parts=None), msg)
    assert err.value.code is ErrorCode.KEYSPACE_NOT_FOUND
    # The cluster has it, this node holds none of it: NOT_MY_PARTITION per range.
    reply = _ask(_server(engine, cluster_parts=8), msg)
    (res,) = reply.results
    assert res.error is not None and res.error.code == ErrorCode.NOT_MY_PARTITION.value
    assert res.reached == 0 and not res.changes
    with pytest.raises(ShardexError) as err:
        _ask(_server(engine, 8), ReadRanges(keyspace="nope", ranges=[RangeSpec(8, 0, 0, 1)]))
    assert err.value.code is ErrorCode.BAD_REQUEST


def test_errors_are_enriched_on_the_way_out(engine: DataEngine) -> None:
    def enrich(exc: ShardexError) -> ShardexError:
        exc.details["owner_hint"] = "node9"
        return exc

    server = RangeReadServer(engine, _inline, enrich, lambda ks: PARTS)
    reply = _ask(server, ReadRanges(keyspace="ks", ranges=[RangeSpec(PARTS - 1, 0, 0, 3)]))
    err = reply.results[0].error
    assert err is not None and err.details["owner_hint"] == "node9"
    assert err.code == not_my_partition("ks", PARTS - 1, "absent").code.value
