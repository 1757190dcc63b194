"""Run a synchronous row pipeline in a thread of its own, fed by async sources and feeding an
async consumer: the operators stay plain generators, and a long sort or aggregation never
holds the node's event loop (heartbeats, other queries' batches) for its whole duration.

The thread pulls each source's next chunk through ``run_coroutine_threadsafe`` and hands
each output batch back the same way into a queue of ``QUEUE_BATCHES``, so a slow consumer
stops the thread (backpressure). Closing the consumer early (a LIMIT satisfied, a cancel)
cancels whatever the thread waits on, and the thread ends with ``_Stopped``; a wait that
ends cancelled without that stop is the pipeline's error, never a quiet end the consumer
would wait on for ever.

``inline``: most queries a user waits on are tiny (a point lookup reads one row), and for
them the thread costs more than the work: its start and one loop round trip per chunk.
So the first chunk of every source is read on the loop and ``fn`` runs on the loop over
what was read; an input that runs dry before its source ended raises ``_NeedMore``, the
loop reads one more chunk and ``fn`` starts again from scratch (a function of its input
rows: the same prefix gives the same rows and the same errors; inputs it changes in place,
the root's partial aggregate states, are decoded afresh for each run by ``decode``). Past
``INLINE_ROWS`` rows read or ``INLINE_TRIES`` restarts, the thread takes over from the
chunks already read: the loop is never held for more than a small input's work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from typing import Any, Final

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.rows import to_batches

__all__ = ["close_all", "run_pipeline"]

log = logging.getLogger(__name__)

QUEUE_BATCHES: Final = 2
INLINE_ROWS: Final = 256  # rows read on the loop at most before the thread takes over
INLINE_TRIES: Final = 4  # runs of ``fn`` on the loop at most
Decode = Callable[[Any], Any]
# How output rows leave: Arrow batches for an exchange, or encoded cells in lists
# (``rows.cell_chunks``) for a consumer in the same process.
Pack = Callable[[Iterable[Any]], Iterator[Any]]


class _Stopped(Exception):
    """The consumer went away: the thread unwinds."""


class _Link:
    """The thread's way back to the loop; every wait it starts can be cancelled at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.stopped = False
        self.pending: set[concurrent.futures.Future[Any]] = set()

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        with self.lock:
            if self.stopped:
                coro.close()
                raise _Stopped
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self.pending.add(fut)
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            if self.stopped:
                raise _Stopped from None
            # Not ``stop``: the wait ended cancelled on its own (a CancelledError from a
            # source). Unwinding quietly would leave the consumer waiting for an end that
            # never comes; it is the pipeline's error instead.
            log.error("a source of the row pipeline ended cancelled without a stop")
            raise ShardexError(
                "a source of the row pipeline was cancelled while the pipeline ran",
                code=ErrorCode.INTERNAL,
                details={"reason": "source_cancelled", "hint": "a bug: see the node's log"},
            ) from None
        finally:
            with self.lock:
                self.pending.discard(fut)

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            for fut in self.pending:
                fut.cancel()


async def _next_chunk(source: AsyncIterator[list[Any]]) -> list[Any] | None:
    try:
        return await anext(source)
    except StopAsyncIteration:
        return None


def _pull(link: _Link, source: AsyncIterator[list[Any]], decode: Decode | None) -> Iterator[Any]:
    while True:
        chunk = link.call(_next_chunk(source))
        if chunk is None:
            return
        yield from chunk if decode is None else map(decode, chunk)


class _NeedMore(BaseException):
    """An inline run of ``fn`` read all that was read of source ``index``, which has more.
    A ``BaseException``: no operator's ``except Exception`` may swallow it."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


def _read_so_far(
    chunks: list[list[Any]], ended: bool, index: int, decode: Decode | None
) -> Iterator[Any]:
    for chunk in chunks:
        yield from chunk if decode is None else map(decode, chunk)
    if not ended:
        raise _NeedMore(index)


async def _replay(
    chunks: list[list[Any]], ended: bool, source: AsyncIterator[list[Any]]
) -> AsyncIterator[list[Any]]:
    """The chunks already read, then the rest of ``source``."""
    for chunk in chunks:
        yield chunk
    if not ended:
        while (chunk := await _next_chunk(source)) is not None:
            yield chunk


async def run_pipeline(
    fn: Callable[[list[Iterator[Any]]], Iterable[Any]],
    sources: list[AsyncIterator[list[Any]]],
    *,
    name: str,
    inline: bool = False,
    decode: Decode | None = None,
    pack: Pack = to_batches,
    reads_all: bool = False,
) -> AsyncIterator[Any]:
    """``pack``ed chunks (Arrow batches by default) of ``fn(inputs)``'s rows over one
    blocking iterator per async source (each yields lists of rows): on the loop when
    ``inline`` and the input is small, else in a new thread. ``fn`` may be called more
    than once (inline restarts): it must make its state (a ``Budget``) afresh on each call,
    and must not change the rows it reads unless ``decode`` makes them afresh from what
    the sources yield (each run decodes again). ``reads_all``: ``fn`` reads every input
    row whatever it finds (no limit to stop it early), so an inline run reads the sources
    to their end (up to ``INLINE_ROWS``) before calling it: one run, not one per chunk
    read (a point query's leaf ran twice, the second time only to learn its one chunk was
    the last)."""
    if not inline:
        async for batch in _threaded(fn, sources, name=name, decode=decode, pack=pack):
            yield batch
        return
    read: list[list[list[Any]]] = [[] for _ in sources]
    ended = [False] * len(sources)
    rows = 0
    try:
        for i, s in enumerate(sources):
            chunk = await _next_chunk(s)
            ended[i] = chunk is None
            if chunk is not None:
                read[i].append(chunk)
                rows += len(chunk)
            while reads_all and not ended[i] and rows <= INLINE_ROWS:
                chunk = await _next_chunk(s)
                ended[i] = chunk is None
                if chunk is not None:
                    read[i].append(chunk)
                    rows += len(chunk)
        for _ in range(INLINE_TRIES):
            if rows > INLINE_ROWS:
                break
            try:
                inputs = [_read_so_far(read[i], ended[i], i, decode) for i in range(len(sources))]
                out = list(fn(inputs))
            except _NeedMore as more:
                chunk = await _next_chunk(sources[more.index])
                ended[more.index] = chunk is None
                if chunk is not None:
                    read[more.index].append(chunk)
                    rows += len(chunk)
                continue
            for batch in pack(out):
                yield batch
            return
        replays = [_replay(read[i], ended[i], s) for i, s in enumerate(sources)]
        async for batch in _threaded(fn, replays, name=name, decode=decode, pack=pack):
            yield batch
    finally:
        await close_all(sources)


async def close_all(sources: list[AsyncIterator[list[Any]]]) -> None:
    for s in sources:
        aclose = getattr(s, "aclose", None)
        if aclose is not None:
            # RuntimeError: a generator the thread is inside of; cancelling its wait ends it.
            with contextlib.suppress(RuntimeError, asyncio.CancelledError):
                await aclose()


async def _threaded(
    fn: Callable[[list[Iterator[Any]]], Iterable[Any]],
    sources: list[AsyncIterator[list[Any]]],
    *,
    name: str,
    decode: Decode | None,
    pack: Pack,
) -> AsyncIterator[Any]:
    loop = asyncio.get_running_loop()
    link = _Link(loop)
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(QUEUE_BATCHES)

    def work() -> None:
        try:
            inputs = [_pull(link, s, decode) for s in sources]
            for batch in pack(fn(inputs)):
                link.call(queue.put(("batch", batch)))
            link.call(queue.put(("end", None)))
        except _Stopped:
            return
        except BaseException as exc:
            try:
                link.call(queue.put(("error", exc)))
            except _Stopped:
                return

    thread = threading.Thread(target=work, name=f"sql {name}", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = await queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        link.stop()
        await close_all(sources)
