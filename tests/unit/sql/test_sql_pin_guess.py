"""``pin_guess``: a request_plus run at the TS pinned last keeps its rows only when that TS
covers the high seqnos read meanwhile and the run's first chunk reads; else it is closed
unread and the caller pins; an index that missed is not guessed for a while."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.pin_guess import MISS_BACKOFF, PinGuesses, run_at_guess

U = 7


def ts(*seqnos: int) -> Timestamp:
    return Timestamp({p: (s, U) for p, s in enumerate(seqnos)})


class Run:
    """A run's chunks, recording whether it was closed before its end."""

    def __init__(self, chunks: list[list[bytes]], fail: ShardexError | None = None) -> None:
        self.chunks, self.fail, self.closed = chunks, fail, False

    async def rows(self) -> AsyncIterator[list[bytes]]:
        try:
            if self.fail is not None:
                raise self.fail
            for chunk in self.chunks:
                yield chunk
        finally:
            self.closed = True


async def _collect(chunks: AsyncIterator[list[bytes]] | None) -> list[list[bytes]] | None:
    return None if chunks is None else [c async for c in chunks]


def _at(guess: Timestamp, seqnos: Timestamp, run: Run) -> list[list[bytes]] | None:
    async def go() -> list[list[bytes]] | None:
        async def high() -> Timestamp:
            return seqnos

        async def start() -> AsyncIterator[list[bytes]]:
            return run.rows()

        return await _collect(await run_at_guess(guess, high, start))

    return asyncio.run(go())


def test_a_guess_that_covers_the_seqnos_keeps_every_row() -> None:
    run = Run([[b"a"], [b"b"]])
    assert _at(ts(5, 3), ts(5, 2), run) == [[b"a"], [b"b"]]


def test_a_guess_behind_a_write_is_dropped_unread() -> None:
    run = Run([[b"a"], [b"b"]])
    assert _at(ts(5, 3), ts(5, 4), run) is None
    assert run.closed
    other_branch = Timestamp({0: (5, U + 1), 1: (3, U)})
    assert _at(ts(5, 3), other_branch, Run([[b"a"]])) is None


def test_a_leaf_that_cannot_read_at_the_guess_drops_the_run() -> None:
    gone = ShardexError("no snapshot", code=ErrorCode.SNAPSHOT_TOO_OLD)
    run = Run([[b"a"]], fail=gone)
    assert _at(ts(5), ts(5), run) is None and run.closed


def test_guesses_back_off_after_a_miss() -> None:
    now = [100.0]
    g = PinGuesses(clock=lambda: now[0])
    assert g.guess("i") is None
    g.pinned("i", ts(4))
    assert g.guess("i") == ts(4)
    g.missed("i")
    assert g.guess("i") is None
    now[0] += MISS_BACKOFF
    assert g.guess("i") == ts(4)


@pytest.mark.parametrize(
    ("level", "tuning", "runs"),
    [
        ("request_plus", {"pin_guess": True}, True),
        ("request_plus", {"pin_guess": False}, False),
        ("not_bounded", {"pin_guess": True}, False),
        ("at_plus", {"pin_guess": True}, False),
    ],
)
def test_only_request_plus_with_the_switch_on_is_guessed(
    level: str, tuning: dict[str, bool], runs: bool
) -> None:
    g = PinGuesses()
    g.pinned("i", ts(1))
    plan = SimpleNamespace(leaves=[1], record=SimpleNamespace(id="i"), keyspace="ks", guessed=None)
    started: list[Timestamp] = []

    async def high(_: str) -> Timestamp:
        return ts(1)

    async def run(at: Timestamp) -> AsyncIterator[list[bytes]]:
        started.append(at)
        return Run([[b"x"]]).rows()

    async def go() -> list[list[bytes]] | None:
        return await _collect(await g.try_run(plan, level, tuning, high, run))  # type: ignore[arg-type]

    assert asyncio.run(go()) == ([[b"x"]] if runs else None)
    assert started == ([ts(1)] if runs else [])
    assert plan.guessed == (ts(1) if runs else None)
