"""A statement's rows back to its client: the first block inside the ``SqlStarted`` reply
(every row of a small result: no stream at all), the rest as credit-controlled blocks on the
client's stream (``OutStreams``, the scans' own)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import msgspec

from shardex.api.scan_streams import OutStream, OutStreams
from shardex.api.sql_exec import SqlQuery, SqlStarted
from shardex.net import Connection
from shardex.runtime.admission import Slot
from shardex.sql.exec.tuning import check_tuning

__all__ = ["BLOCK_BYTES", "BLOCK_ROWS", "cells_closing", "once", "respond"]

BLOCK_ROWS: Final = 500
BLOCK_BYTES: Final = 512 * 1024


async def respond(
    streams: OutStreams,
    conn: Connection,
    msg: SqlQuery,
    started: SqlStarted,
    chunks: AsyncIterator[list[bytes]],
    slot: Slot,
    on_end: Callable[[BaseException | None], None] | None = None,
) -> SqlStarted:
    """``started`` with the first block of rows (``inline``; ``done`` when that is all:
    no stream is opened), the rest on the result stream. An error while the first
    block is read ends the stream, as it would have after the reply: the reply means
    "the statement runs", whatever its rows turn out to be. ``slot`` is released when
    the rows end: here when they all fit the reply, else when the stream's task ends
    (a done callback runs even for a task cancelled before it started). ``on_end`` is
    called once when the rows end, with the error that ended them (None: all sent; a
    cancel when the task was cancelled before it started)."""
    ended = False

    def end(error: BaseException | None) -> None:
        nonlocal ended
        if not ended:
            ended = True
            if on_end is not None:
                on_end(error)

    head: list[bytes] = []
    rest: list[bytes] = []
    error: BaseException | None = None
    if check_tuning(msg.tuning)["inline"]:
        size = 0
        try:
            while not rest:
                chunk = await anext(chunks, None)
                if chunk is None:
                    slot.release()
                    end(None)
                    return msgspec.structs.replace(started, rows=head, done=True)
                for i, cell in enumerate(chunk):
                    if len(head) >= BLOCK_ROWS or size >= BLOCK_BYTES:
                        rest = chunk[i:]
                        break
                    head.append(cell)
                    size += len(cell)
        except Exception as exc:  # it ends the stream, as it would have later
            error, head = exc, []

    async def produce(out: OutStream) -> None:
        try:
            if error is not None:
                raise error
            async with contextlib.aclosing(chunks):
                for block in _blocks(rest):
                    await out.send(block)
                async for chunk in chunks:
                    for block in _blocks(chunk):
                        await out.send(block)
        except BaseException as exc:
            end(exc)
            raise
        end(None)

    stream = streams.start(conn, msg.stream_id, msg.credit, produce)
    assert stream.task is not None

    def done(_: asyncio.Task[None]) -> None:
        slot.release()
        end(asyncio.CancelledError())  # a no-op unless cancelled before ``produce`` ran

    stream.task.add_done_callback(done)
    return msgspec.structs.replace(started, rows=head or None)


async def once(cells: list[bytes]) -> AsyncIterator[list[bytes]]:
    yield cells


async def cells_closing(result: Any) -> AsyncIterator[list[bytes]]:
    """The result's rows (encoded), a batch at a time; closing early cancels the query
    everywhere."""
    try:
        async for batch in result:
            yield batch.column(0).to_pylist()
    finally:
        await result.aclose()


def _blocks(cells: list[bytes]) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    block: list[bytes] = []
    size = 0
    for cell in cells:
        block.append(cell)
        size += len(cell)
        if len(block) >= BLOCK_ROWS or size >= BLOCK_BYTES:
            out.append(block)
            block, size = [], 0
    if block:
        out.append(block)
    return out
