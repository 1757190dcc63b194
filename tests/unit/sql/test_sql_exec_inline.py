"""Small queries skip the machinery sized for large ones: ``run_pipeline(inline=True)`` runs
the operators on the event loop over what it read (restarting when an input runs dry, the
thread taking over past a bound), and gives the same rows and errors as the thread."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec import bridge
from shardex.sql.exec.bridge import INLINE_ROWS, run_pipeline
from shardex.sql.exec.rows import decode_rows
from shardex.sql.exec.tuning import SWITCHES, check_tuning


class Source:
    """An async source of chunks that counts how many chunks were read."""

    def __init__(self, chunks: list[list[Any]]) -> None:
        self.chunks = chunks
        self.read = 0
        self.closed = False

    async def gen(self) -> AsyncIterator[list[Any]]:
        try:
            for chunk in self.chunks:
                self.read += 1
                yield chunk
        finally:
            self.closed = True


def chunked(rows: list[int], size: int) -> list[list[int]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


async def collect(fn: Any, sources: list[Source], inline: bool) -> list[Any]:
    out: list[Any] = []
    gens = [s.gen() for s in sources]
    async for batch in run_pipeline(fn, gens, name="t", inline=inline):
        out += decode_rows(batch)
    return out


def merged(inputs: list[Iterator[int]]) -> Iterable[int]:
    return sorted(itertools.chain(*inputs))


@pytest.mark.parametrize("size", [1, 3, 50, 400])
@pytest.mark.parametrize("n_sources", [1, 3])
def test_inline_gives_the_threads_rows(size: int, n_sources: int) -> None:
    rows = list(range(120 * n_sources))
    parts = [rows[i::n_sources] for i in range(n_sources)]

    async def both() -> tuple[list[Any], list[Any]]:
        a = await collect(merged, [Source(chunked(p, size)) for p in parts], inline=True)
        b = await collect(merged, [Source(chunked(p, size)) for p in parts], inline=False)
        return a, b

    inline, threaded = asyncio.run(both())
    assert inline == threaded == rows


def test_a_small_input_runs_on_the_loop_thread() -> None:
    seen: list[threading.Thread] = []

    def fn(inputs: list[Iterator[int]]) -> Iterable[int]:
        seen.append(threading.current_thread())
        return [x * 2 for x in inputs[0]]

    out = asyncio.run(collect(fn, [Source([[1, 2, 3]])], inline=True))
    assert out == [2, 4, 6]
    # First run stops at the end of what was read (the source had not said it ended), the
    # second knows it ended: both on the loop's thread, never a new one.
    assert seen == [threading.main_thread()] * 2


def test_an_operator_reading_every_row_runs_once_over_the_whole_input() -> None:
    """``reads_all``: the sources are read to their end first, so ``fn`` runs once (not once
    to find the first chunk's end and again when the source says it ended), on the loop,
    with the rows it gives without it; many small chunks stay on the loop too."""
    for chunks in ([[1, 2, 3]], [[i] for i in range(2 * bridge.INLINE_TRIES)]):
        for reads_all in (True, False):
            seen: list[threading.Thread] = []

            def fn(inputs: list[Iterator[int]], seen: list[threading.Thread] = seen) -> Any:
                seen.append(threading.current_thread())
                return [x * 2 for x in inputs[0]]

            async def run(src: Source, reads_all: bool = reads_all) -> list[Any]:
                gen = run_pipeline(fn, [src.gen()], name="t", inline=True, reads_all=reads_all)
                return [r async for batch in gen for r in decode_rows(batch)]

            rows = [x * 2 for chunk in chunks for x in chunk]
            assert asyncio.run(run(Source(chunks))) == rows
            if reads_all:
                assert seen == [threading.main_thread()]


def test_a_satisfied_limit_reads_no_further_chunk() -> None:
    src = Source([[1, 2, 3, 4], [5, 6, 7, 8]])
    out = asyncio.run(collect(lambda ins: itertools.islice(ins[0], 3), [src], inline=True))
    assert out == [1, 2, 3]
    assert src.read == 1 and src.closed  # the second chunk was never read


def test_a_large_input_goes_to_the_thread_from_what_was_read() -> None:
    seen: list[threading.Thread] = []
    rows = list(range(3 * INLINE_ROWS))
    src = Source(chunked(rows, INLINE_ROWS // 2))

    def fn(inputs: list[Iterator[int]]) -> Iterable[int]:
        seen.append(threading.current_thread())
        return list(inputs[0])

    out = asyncio.run(collect(fn, [src], inline=True))
    assert out == rows and src.read == len(src.chunks)
    assert seen[-1] is not threading.main_thread()


def test_many_small_chunks_stop_restarting_and_use_the_thread() -> None:
    runs: list[threading.Thread] = []
    src = Source([[i] for i in range(2 * bridge.INLINE_TRIES)])

    def fn(inputs: list[Iterator[int]]) -> Iterable[int]:
        runs.append(threading.current_thread())
        return list(inputs[0])

    out = asyncio.run(collect(fn, [src], inline=True))
    assert out == list(range(2 * bridge.INLINE_TRIES))
    assert len(runs) == bridge.INLINE_TRIES + 1 and runs[-1] is not threading.main_thread()


def test_errors_are_the_same_inline() -> None:
    def fn(inputs: list[Iterator[int]]) -> Iterable[int]:
        for x in inputs[0]:
            if x == 2:
                raise ShardexError("two", code=ErrorCode.QUERY_MEMORY_LIMIT)
            yield x

    for inline in (True, False):
        with pytest.raises(ShardexError) as info:
            asyncio.run(collect(fn, [Source([[1, 2, 3]])], inline=inline))
        assert info.value.code is ErrorCode.QUERY_MEMORY_LIMIT


def test_the_inline_switch_is_on_by_default() -> None:
    assert "inline" in SWITCHES and check_tuning(None)["inline"] is True
    assert check_tuning({"inline": False})["inline"] is False


def test_a_restarted_run_gets_untouched_rows_through_decode() -> None:
    """The root's final aggregate merges into the partial states it reads: a restarted run
    must not see the first run's merges, so the root's rows are decoded afresh per run."""

    def merge_into_first(inputs: list[Iterator[dict[str, int]]]) -> Iterable[int]:
        rows = [r for inp in inputs for r in inp]
        first = rows[0]
        for r in rows[1:]:
            first["n"] += r["n"]  # in place, as a partial state merge does
        return [first["n"]]

    chunks = [[{"n": 1}], [{"n": 2}], [{"n": 3}]]
    encoded = [[str(r["n"]) for r in c] for c in chunks]

    async def run() -> tuple[list[Any], list[Any]]:
        def src() -> AsyncIterator[list[Any]]:
            return Source([list(c) for c in encoded]).gen()

        def dec(cell: str) -> dict[str, int]:
            return {"n": int(cell)}

        out_inline: list[Any] = []
        async for b in run_pipeline(merge_into_first, [src()], name="t", inline=True, decode=dec):
            out_inline += decode_rows(b)
        out_thread: list[Any] = []
        async for b in run_pipeline(merge_into_first, [src()], name="t", decode=dec):
            out_thread += decode_rows(b)
        return out_inline, out_thread

    assert asyncio.run(run()) == ([6], [6])


def test_a_source_ending_cancelled_fails_the_pipeline_in_the_thread() -> None:
    """A source whose read ends in a CancelledError that no consumer asked for (the
    consumer still waits): the thread reports it as the pipeline's error instead of
    unwinding as if stopped, which would leave the consumer waiting for ever."""

    async def source() -> AsyncIterator[list[Any]]:
        yield [1, 2]
        raise asyncio.CancelledError

    async def main() -> None:
        out = run_pipeline(lambda ins: list(ins[0]), [source()], name="t", inline=False)
        # The bound only catches the defect (a wait for ever); the run takes milliseconds.
        with pytest.raises(ShardexError) as info:
            await asyncio.wait_for(anext(out), 30)
        assert info.value.code is ErrorCode.INTERNAL
        assert info.value.details["reason"] == "source_cancelled"

    asyncio.run(main())
