"""``Tally`` (``core/tally.py``): the first occurrence of an event is reported, later ones are
counted and reported together at most once per interval, per key."""

from __future__ import annotations

from shardex.core.tally import Tally


def test_first_then_at_most_once_per_interval_with_the_count() -> None:
    now = [0.0]
    tally = Tally(interval=10.0, clock=lambda: now[0])
    assert tally.hit("n1") == 1  # the first: at once
    assert [tally.hit("n1") for _ in range(5)] == [0] * 5
    assert tally.hit("n2") == 1  # per key
    now[0] = 9.9
    assert tally.hit("n1") == 0
    now[0] = 10.0
    assert tally.hit("n1") == 7  # the five quiet ones, the one at 9.9 and this one
    now[0] = 25.0
    assert tally.hit("n1") == 1
