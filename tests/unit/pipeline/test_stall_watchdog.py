"""The maintenance stream's stall watchdog (``pipeline/watchdog.py``) on a fake clock: a stall
is reported only when no maintained index advanced for ``stall_after`` seconds while the high
seqnos are ahead of one of them; an idle keyspace is not a stall and costs one high-seqnos
ask per ``stall_after``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardex.core.timestamp import Timestamp
from shardex.pipeline.watchdog import StallWatchdog, source_latest, stream_text


@dataclass
class _Def:
    name: str


@dataclass
class _View:
    id: str
    definition: _Def


@dataclass
class _Registry:
    keyspace: str = "ks"
    joined: dict[str, Timestamp] = field(default_factory=dict)

    def maintained(self) -> list[Any]:
        return [_View(i, _Def(f"name_{i}")) for i in sorted(self.joined)]

    def applied(self, index_id: str) -> Timestamp:
        return self.joined[index_id]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _ts(**parts: int) -> Timestamp:
    return Timestamp.from_wire({int(p[1:]): (s, 7) for p, s in parts.items()})


def _watchdog(reg: _Registry, high: list[Timestamp], asks: list[int]) -> tuple[Any, _Clock]:
    clock = _Clock()

    def high_seqnos() -> Timestamp:
        asks.append(1)
        return high[0]

    dog = StallWatchdog(reg, high_seqnos, stall_after=10.0, clock=clock, catch_up_after=5.0)  # type: ignore[arg-type]
    dog.reset()
    return dog, clock


def test_pending_changes_without_progress_is_a_stall_naming_index_and_lag() -> None:
    reg = _Registry(joined={"i1": _ts(p0=5, p1=9), "i2": _ts(p0=5, p1=9)})
    high = [_ts(p0=22, p1=9)]
    dog, clock = _watchdog(reg, high, [])
    clock.now += 9.0
    assert dog.check() is None  # not yet stall_after
    clock.now += 1.5
    stall = dog.check()
    assert stall is not None
    assert stall.keyspace == "ks"
    assert stall.behind == {"name_i1": {0: 17}, "name_i2": {0: 17}}
    assert stall.total == 34
    assert "index name_i1 behind the high seqnos in partitions {0: 17}" in stall.describe()
    assert "[applied -> target: 0: 5@7 -> 22@7]" in stall.describe()
    assert dog.stalls == 1
    # Reported once per stall_after while it lasts, not at every supervisor poll.
    clock.now += 1.0
    assert dog.check() is None
    clock.now += 10.0
    assert dog.check() is not None


def test_progress_restarts_the_clock() -> None:
    reg = _Registry(joined={"i1": _ts(p0=5)})
    dog, clock = _watchdog(reg, [_ts(p0=50)], [])
    for seqno in (10, 20, 30):
        clock.now += 9.0
        reg.joined["i1"] = _ts(p0=seqno)  # a round published: the index advanced
        assert dog.check() is None
    clock.now += 9.0
    assert dog.check() is None
    clock.now += 2.0
    assert dog.check() is not None


def test_idle_keyspace_is_no_stall_and_asks_once_per_period() -> None:
    reg = _Registry(joined={"i1": _ts(p0=5, p1=3)})
    asks: list[int] = []
    dog, clock = _watchdog(reg, [_ts(p0=5, p1=3)], asks)
    for _ in range(100):  # 100 supervisor polls, 0.5 s apart: 50 s idle
        clock.now += 0.5
        assert dog.check() is None
    assert dog.stalls == 0
    assert len(asks) == 5  # once per stall_after, not once per poll


def test_other_branch_counts_as_pending() -> None:
    reg = _Registry(joined={"i1": _ts(p0=5)})
    moved = Timestamp.from_wire({0: (5, 8)})  # same seqno, a failover's new uuid
    dog, clock = _watchdog(reg, [moved], [])
    clock.now += 11.0
    stall = dog.check()
    assert stall is not None and stall.behind == {"name_i1": {0: 1}}
    # The report tells a new branch from one pending change, and what the stream saw.
    assert "[applied -> target: 0: 5@7 -> 5@8 (new branch)]" in stall.describe()
    stream = stream_text(stall, "the stream's last committed end", Timestamp.from_wire({0: (5, 7)}))
    assert stream == "the stream's last committed end {0: 5@7}"
    assert stream_text(stall, "its source's last latest offset", None).endswith(": unknown")


def test_turned_off_and_no_index() -> None:
    asks: list[int] = []
    dog, clock = _watchdog(_Registry(), [_ts(p0=9)], asks)
    clock.now += 100.0
    assert dog.check() is None  # nothing maintained: nothing to stall
    reg = _Registry(joined={"i1": _ts(p0=1)})
    off = StallWatchdog(reg, lambda: _ts(p0=9), stall_after=0.0, clock=clock)  # type: ignore[arg-type]
    clock.now += 100.0
    assert off.check() is None
    assert asks == []


def test_a_failed_ask_is_tried_again_a_period_later() -> None:
    from shardex.errors import ErrorCode, ShardexError

    reg = _Registry(joined={"i1": _ts(p0=5)})
    asks: list[int] = []
    clock = _Clock()

    def down() -> Timestamp:
        asks.append(1)
        raise ShardexError("node down", code=ErrorCode.NODE_UNAVAILABLE)

    dog = StallWatchdog(reg, down, stall_after=10.0, clock=clock)  # type: ignore[arg-type]
    dog.reset()
    failed = 0
    for _ in range(40):  # 20 s of supervisor polls while the ask fails
        clock.now += 0.5
        try:
            dog.check()
        except ShardexError:
            failed += 1
    assert failed == len(asks) == 2


def test_an_index_behind_the_idle_streams_position_is_a_stall_without_asking() -> None:
    # Rebuilt under writes that stopped before it joined: the stream read past its T0.
    reg = _Registry(joined={"i1": _ts(p0=5, p1=9)})
    asks: list[int] = []
    dog, clock = _watchdog(reg, [_ts(p0=17, p1=9)], asks)
    position = _ts(p0=17, p1=9)
    clock.now += 0.5
    assert dog.check(position) is None  # behind: the clock starts
    clock.now += 3.0
    assert dog.check(None) is None  # a batch or round runs: not idle, the clock stops
    clock.now += 0.5
    assert dog.check(position) is None
    clock.now += 4.0
    assert dog.check(position) is None  # 4 s of catch_up_after's 5
    clock.now += 1.5
    stall = dog.check(position)
    assert stall is not None
    assert stall.behind == {"name_i1": {0: 12}}
    assert "behind the stream's position" in stall.describe()
    assert asks == []  # the stream's own position: no HighSeqnos


def test_progress_or_another_branch_is_no_position_stall() -> None:
    reg = _Registry(joined={"i1": _ts(p0=5)})
    dog, clock = _watchdog(reg, [_ts(p0=5)], [])
    other = Timestamp.from_wire({0: (17, 8)})  # the position on another uuid
    for _ in range(20):
        clock.now += 0.5
        assert dog.check(other) is None
    position = _ts(p0=17)
    for seqno in range(6, 16):  # a slow catch-up that advances: never a stall
        clock.now += 1.0
        reg.joined["i1"] = _ts(p0=seqno)
        assert dog.check(position) is None


@dataclass
class _Query:
    lastProgress: Any  # Spark's name


def test_the_sources_latest_offset_from_the_last_progress() -> None:
    """Spark's progress holds the offset as JSON text; anything else is "unknown"."""
    progress = {"sources": [{"latestOffset": '{"0": [5, 7], "3": [2, 8]}'}]}
    assert source_latest(_Query(progress)) == Timestamp.from_wire({0: (5, 7), 3: (2, 8)})
    parsed = {"sources": [{"latestOffset": {"0": [5, 7]}}]}
    assert source_latest(_Query(parsed)) == Timestamp.from_wire({0: (5, 7)})
    assert source_latest(_Query(None)) is None
    assert source_latest(_Query({"sources": []})) is None
    assert source_latest(_Query({"sources": [{"latestOffset": "not json"}]})) is None
    assert source_latest(None) is None
