"""The ReadRanges reader's rules (``pipeline/source/ranges.py``) against scripted replies:
continuing cut ranges, resuming after NOT_MY_PARTITION within the deadline and failing past
it, handing a backfill to the stream reader, and refusing replies that would skip, double
or change branch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import shardex.pipeline.source.ranges as source_ranges
from shardex.api.data import RangeChanges, RangeSpec
from shardex.api.errors import WireError
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.source.checks import Chunk
from shardex.pipeline.source.types import PartitionRange, parse_rollback

UUID = 77


class FakeRouter:
    def __init__(self) -> None:
        self.refreshes = 0

    async def keyspace(self, name: str, *, refresh: bool = False) -> tuple[None, Topology]:
        return None, Topology(seq_num=1, assignment={p: f"n{p % 2}" for p in range(8)})

    async def refresh(self) -> None:
        self.refreshes += 1


def _change(seqno: int) -> tuple:
    return (seqno, f"d{seqno}", "upsert", seqno, b"{}", 0, 0)


def _ok(spec: RangeSpec, upto: int, uuid: int = UUID) -> RangeChanges:
    return RangeChanges(
        partition=spec.partition,
        uuid=uuid,
        reached=upto,
        changes=[_change(s) for s in range(spec.from_seqno + 1, upto + 1)],
    )


def _err(spec: RangeSpec, code: ErrorCode, **details: Any) -> RangeChanges:
    return RangeChanges(
        partition=spec.partition,
        uuid=spec.uuid,
        reached=spec.from_seqno,
        error=WireError(code.value, f"{code.value} for the test", details),
    )


Script = Callable[[RangeSpec, int], RangeChanges]  # (spec, how many times asked) -> answer


def _run(
    ranges: list[PartitionRange], script: Script, monkeypatch: Any, **kw: Any
) -> tuple[dict[int, list[int]], list[PartitionRange], list[list[RangeSpec]], FakeRouter]:
    asked: dict[int, int] = {}
    requests: list[list[RangeSpec]] = []

    async def fake_round(router: Any, keyspace: str, specs: list[RangeSpec], **_: Any) -> list:
        requests.append(list(specs))
        out = []
        for s in specs:
            asked[s.partition] = asked.get(s.partition, 0) + 1
            out.append(script(s, asked[s.partition]))
        return out

    monkeypatch.setattr(source_ranges, "read_round", fake_round)
    got: dict[int, list[int]] = {}
    streamed: list[PartitionRange] = []

    async def put(ch: Chunk) -> None:
        assert ch.uuid == UUID
        got.setdefault(ch.partition, []).extend(c.seqno for c in ch.changes)

    async def stream_range(r: PartitionRange) -> None:
        streamed.append(r)

    router = FakeRouter()
    kw.setdefault("resume_timeout", 5.0)
    asyncio.run(
        source_ranges.read_small_ranges(router, "ks", ranges, put, stream_range, **kw)  # type: ignore[arg-type]
    )
    return got, streamed, requests, router


def _r(p: int, start: int, end: int) -> PartitionRange:
    return PartitionRange(p, start, UUID if start else 0, end, UUID)


def test_cut_ranges_continue_from_where_they_stopped(monkeypatch: Any) -> None:
    def script(s: RangeSpec, n: int) -> RangeChanges:
        return _ok(s, min(s.end_seqno, s.from_seqno + 3))  # 3 changes per answer

    got, streamed, requests, _ = _run([_r(0, 0, 7), _r(1, 2, 4), _r(2, 5, 5)], script, monkeypatch)
    assert got == {0: list(range(1, 8)), 1: [3, 4]} and not streamed
    assert all(s.partition != 2 for req in requests for s in req)  # empty: never asked
    asked = [(s.partition, s.from_seqno, s.uuid) for req in requests for s in req]
    assert sorted(asked) == [(0, 0, 0), (0, 3, UUID), (0, 6, UUID), (1, 2, UUID)]


def test_not_my_partition_resumes_after_a_refresh(monkeypatch: Any) -> None:
    def script(s: RangeSpec, n: int) -> RangeChanges:
        if s.partition == 1 and n == 2:  # moved between two answers
            return _err(s, ErrorCode.NOT_MY_PARTITION, partition=1)
        return _ok(s, min(s.end_seqno, s.from_seqno + 4))

    got, _, requests, router = _run([_r(0, 0, 6), _r(1, 0, 10)], script, monkeypatch)
    assert got == {0: list(range(1, 7)), 1: list(range(1, 11))}
    assert router.refreshes == 1
    assert [s.from_seqno for req in requests for s in req if s.partition == 1] == [0, 4, 4, 8]


def test_resuming_stops_at_the_deadline(monkeypatch: Any) -> None:
    def script(s: RangeSpec, n: int) -> RangeChanges:
        if s.partition == 1 and n > 1:
            return _err(s, ErrorCode.NODE_UNAVAILABLE, node="n1")
        return _ok(s, min(s.end_seqno, s.from_seqno + 2))

    with pytest.raises(ShardexError) as err:
        _run([_r(0, 0, 2), _r(1, 0, 10)], script, monkeypatch, resume_timeout=0.3)
    assert err.value.code is ErrorCode.NODE_UNAVAILABLE
    assert err.value.details["partition"] == 1 and err.value.details["resumed_from"] == 2


def test_a_backfill_goes_to_the_stream_reader(monkeypatch: Any) -> None:
    def script(s: RangeSpec, n: int) -> RangeChanges:
        if s.partition == 3:
            return RangeChanges(partition=3, uuid=UUID, reached=0, use_stream=True)
        return _ok(s, s.end_seqno)

    got, streamed, _, _ = _run([_r(3, 0, 9), _r(4, 0, 2)], script, monkeypatch)
    assert got == {4: [1, 2]} and streamed == [_r(3, 0, 9)]


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        (lambda s: _ok(s, s.end_seqno, uuid=UUID + 1), ErrorCode.ROLLBACK),  # other branch
        (  # a gap in the seqnos
            lambda s: RangeChanges(s.partition, UUID, 3, [_change(1), _change(3)]),
            ErrorCode.INTERNAL,
        ),
        (  # reached disagrees with the changes
            lambda s: RangeChanges(s.partition, UUID, 5, [_change(1), _change(2)]),
            ErrorCode.INTERNAL,
        ),
        (lambda s: RangeChanges(s.partition, UUID, 2), ErrorCode.INTERNAL),  # claims, no rows
        (lambda s: _err(s, ErrorCode.BAD_REQUEST), ErrorCode.BAD_REQUEST),
        (lambda s: _err(s, ErrorCode.INTERNAL), ErrorCode.INTERNAL),
    ],
)
def test_answers_that_would_skip_double_or_switch_branch_fail(
    monkeypatch: Any, answer: Callable[[RangeSpec], RangeChanges], code: ErrorCode
) -> None:
    with pytest.raises(ShardexError) as err:
        _run([_r(5, 0, 4)], lambda s, n: answer(s), monkeypatch)
    assert err.value.code is code
    if code is ErrorCode.BAD_REQUEST:
        assert err.value.details["partition"] == 5


def test_rollback_answers_are_tagged(monkeypatch: Any) -> None:
    def refused(s: RangeSpec, n: int) -> RangeChanges:
        return _err(s, ErrorCode.ROLLBACK, partition=5, rollback_seqno=2, uuid=9, high_seqno=3)

    with pytest.raises(ShardexError) as err:
        _run([_r(5, 3, 6)], refused, monkeypatch)
    info = parse_rollback(str(err.value))  # as Spark hands it over: text only
    assert info is not None and (info.partition, info.rollback_seqno) == (5, 2)
    assert err.value.details["high_seqno"] == 3

    def short(s: RangeSpec, n: int) -> RangeChanges:
        return _err(s, ErrorCode.ROLLBACK, rollback_seqno=4, planned_end=6)

    with pytest.raises(ShardexError) as err:
        _run([_r(5, 3, 6)], short, monkeypatch)
    info = parse_rollback(str(err.value))
    assert info is not None and info.rollback_seqno == 4
    assert err.value.details["planned_end"] == 6 and "below the planned end" in str(err.value)
