"""How an idle stream asks for the high seqnos less often (``source/idle.py``, the read-ahead's
``next_pause`` and ``wake``) and still notices a write: the latestOffset cache grows while the
answers repeat and drops back at the first change; the read-ahead's idle pause stays within a
piece interval; a batch's ``wake`` ends a long pause at once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from shardex.core.timestamp import Timestamp
from shardex.pipeline.rounds.read_ahead import ReadAhead, next_pause
from shardex.pipeline.source import stream as source_stream
from shardex.pipeline.source.idle import IdlePoll
from shardex.pipeline.source.options import SourceOptions
from shardex.pipeline.source.stream import _OffsetSource
from tests.unit.pipeline.test_read_ahead import Log

A = Timestamp({0: (5, 7), 1: (3, 7)})
B = Timestamp({0: (6, 7), 1: (3, 7)})


def test_interval_grows_while_unchanged_and_snaps_back_on_a_change() -> None:
    poll = IdlePoll(0.02, 0.25, idle_after=0.5)
    poll.observe(A, 0.0)
    poll.observe(A, 0.3)  # unchanged, but not for idle_after yet: a burst's pace
    assert poll.interval == 0.02
    seen = []
    for t in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        poll.observe(A, t)
        seen.append(poll.interval)
    assert seen == [0.04, 0.08, 0.16, 0.25, 0.25, 0.25]
    poll.observe(B, 1.1)  # a seqno moved: back to the base at once
    assert poll.interval == 0.02
    poll.observe(B, 1.2)
    assert poll.interval == 0.02  # and idle_after counts from the change


def test_a_maximum_at_the_base_turns_the_back_off_off() -> None:
    poll = IdlePoll(0.02, 0.0)
    for t in range(10):
        poll.observe(A, float(t))
    assert poll.interval == 0.02


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


class _SeqnoClient:
    def __init__(self) -> None:
        self.high = A
        self.asks = 0

    def high_seqnos(self, keyspace: str) -> Timestamp:
        self.asks += 1
        return self.high


def test_latest_offset_asks_less_while_idle_and_at_the_base_after_a_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opts = SourceOptions.parse(
        {"addresses": "127.0.0.1:1", "secret": "s", "keyspace": "ks", "high_seqnos": "gather"}
    )
    assert (opts.latest_offset_interval, opts.idle_offset_interval) == (0.02, 0.25)
    clock = _Clock()
    monkeypatch.setattr(source_stream, "time", clock)
    src = _OffsetSource(opts)
    client = _SeqnoClient()
    src._client = client  # type: ignore[assignment]

    def asks_in(seconds: float, step: float = 0.005) -> int:
        before = client.asks
        end = clock.now + seconds
        while clock.now < end:
            src.high_seqnos()
            clock.now += step
        return client.asks - before

    busy = asks_in(0.5)  # the first half second: the base interval (~25 asks)
    assert busy >= 20
    idle = asks_in(10.0)  # then at most one ask per 250 ms
    assert idle <= 10.0 / 0.25 + 5
    client.high = B  # a write: the next ask sees it, and the pace is the base again
    clock.now += 0.25
    assert src.high_seqnos() == B
    assert src.poll.interval == 0.02


@pytest.mark.parametrize(
    ("pause", "held", "since", "expected"),
    [
        (0.05, 0, 0.0, 0.1),  # idle: doubling ...
        (0.1, 0, 5.0, 0.1),  # ... to the piece interval, however long idle (never 10 ms)
        (0.05, 3, 0.06, 0.04),  # changes held: not past their piece's due
        (0.05, 3, 0.5, 0.01),  # overdue: look again soon
    ],
)
def test_next_pause(pause: float, held: int, since: float, expected: float) -> None:
    assert next_pause(pause, 0.4, 0.1, held, since) == pytest.approx(expected)


def test_a_batch_wakes_an_idle_read_ahead_at_once() -> None:
    """A rolling read-ahead with an hour-long pause: a write reaches it only by ``wake``."""
    log = Log()
    log.write(0, 2)
    ra = ReadAhead(
        log.read, log.latest, 0, rolling=True, pause=3600.0, max_pause=3600.0, min_piece=1
    )
    ra.start([], Timestamp({0: (0, 7), 1: (0, 7)}))
    try:
        _until(lambda: ra.pieces == 1, "the first piece")
        log.write(1, 4)
        ra.wake()
        _until(lambda: ra.pieces == 2, "the piece after the wake")
        assert log.reads[-1][1] == Timestamp({0: (2, 7), 1: (4, 7)})
    finally:
        ra.discard()


def _until(cond: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        threading.Event().wait(0.01)
