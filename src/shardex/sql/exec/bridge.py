"""Run a synchronous row pipeline in a thread of its own, fed by async sources and feeding an
async consumer: the operators stay plain generators, and a long sort or aggregation never
holds the node's event loop (heartbeats, other queries' batches) for its whole duration.

The thread pulls each source's next chunk through ``run_coroutine_threadsafe`` and hands
each output batch back the same way into a queue of ``QUEUE_BATCHES``, so a slow consumer
stops the thread (backpressure). Closing the consumer early (a LIMIT satisfied, a cancel)
cancels whatever the thread waits on, and the thread ends with ``_Stopped``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from typing import Any, Final

import pyarrow as pa

from shardex.sql.exec.rows import to_batches

__all__ = ["run_pipeline"]

QUEUE_BATCHES: Final = 2


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
            raise _Stopped from None
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


def _pull(link: _Link, source: AsyncIterator[list[Any]]) -> Iterator[Any]:
    while True:
        chunk = link.call(_next_chunk(source))
        if chunk is None:
            return
        yield from chunk


async def run_pipeline(
    fn: Callable[[list[Iterator[Any]]], Iterable[Any]],
    sources: list[AsyncIterator[list[Any]]],
    *,
    name: str,
) -> AsyncIterator[pa.RecordBatch]:
    """Batches of ``fn(inputs)``'s rows, ``fn`` running in a new thread over one blocking
    iterator per async source (each yields lists of rows)."""
    loop = asyncio.get_running_loop()
    link = _Link(loop)
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(QUEUE_BATCHES)

    def work() -> None:
        try:
            inputs = [_pull(link, s) for s in sources]
            for batch in to_batches(fn(inputs)):
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
        for s in sources:
            aclose = getattr(s, "aclose", None)
            if aclose is not None:
                # RuntimeError: a generator the thread is inside of; cancelling its wait ends it.
                with contextlib.suppress(RuntimeError, asyncio.CancelledError):
                    await aclose()
