"""Credit-based streams over a ``Connection``: the one flow-control layer of every stream.

A stream is a run of one-way messages from a sender to the peer that opened it (a change
stream's batches, a scan's blocks, a SQL exchange's Arrow batches), ended by one end message.
The receiver grants credit; the sender spends it per message and waits when it has none, so a
slow consumer costs the sender O(window) memory, never an unbounded queue. The messages are
the callers': this module knows none of them, and callers pass in how to build the ones it
sends on their behalf (the end of a stream, the end a dead connection stands for).

* ``SendWindow`` / ``ReceiveWindow``: the credit accounting of one stream, each side's half.
  Credit is counted in the stream's unit: messages for change streams and scans (a batch is
  bounded by its producer, so a count bounds memory), bytes for the SQL exchanges (Arrow
  batches vary in size by orders of magnitude; a byte window is what bounds memory there).
  Both are kept as a running total sent against a running limit, so a grant may be relative
  (``grant``: "n more", capped) or cumulative (``raise_limit``: "up to n in all", idempotent
  when a grant is repeated or reordered).
* ``OutStream`` / ``OutStreams`` (sender): one outgoing stream and a node's table of them by
  (connection, stream id); ``start_stream`` runs a producer in a task and always ends the
  stream with one end message (with the error, if any) unless it was cancelled or its
  connection closed.
* ``InStream`` / ``Inboxes`` (receiver): one incoming stream's inbox - a deque and, while the
  reader waits, one future - and a pool's table of them, which turns a dead connection into
  a failed end for every stream it carried.

Nothing here adds a task or a loop round to a message's path: a sender with credit sends at
once (``SendWindow.take``), a receiver's message is queued in the connection's receive
callback, and a reader with messages queued takes them without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from shardex.errors import ConnectionClosed, ErrorCode, ShardexError
from shardex.net.connection import Connection
from shardex.net.messages import Message
from shardex.net.router import Router

__all__ = [
    "InStream",
    "Inboxes",
    "OutStream",
    "OutStreams",
    "ReceiveWindow",
    "SendWindow",
]

log = logging.getLogger(__name__)


class SendWindow:
    """The sender's half of one stream's credit: ``sent`` so far against ``limit``, the most
    it may have sent (both running totals, in the stream's unit)."""

    __slots__ = ("_wake", "cap", "limit", "sent")

    def __init__(self, initial: int, cap: int | None = None) -> None:
        self.sent = 0
        self.limit = initial
        # Relative grants never raise the credit at hand above ``cap`` (a peer cannot make
        # the sender buffer more than that, whatever it grants).
        self.cap = cap
        self._wake: asyncio.Event | None = None  # made on the first stall: most streams never

    @property
    def available(self) -> int:
        return self.limit - self.sent

    def take(self, cost: int = 1) -> bool:
        """Spend ``cost`` if the credit covers it (no wait): the hot path."""
        sent = self.sent + cost
        if sent > self.limit:
            return False
        self.sent = sent
        return True

    async def spend(self, cost: int = 1, on_stall: Callable[[], None] | None = None) -> None:
        """Spend ``cost``, waiting for grants until the credit covers it (``on_stall`` is
        called before each wait)."""
        while self.sent + cost > self.limit:
            if on_stall is not None:
                on_stall()
            wake = self._wake
            if wake is None:
                wake = self._wake = asyncio.Event()
            wake.clear()
            await wake.wait()
        self.sent += cost

    def grant(self, amount: int) -> None:
        """``amount`` more (a relative grant, e.g. one per message consumed), the credit at
        hand capped at ``cap``; nothing for ``amount`` <= 0."""
        if amount <= 0:
            return
        limit = self.limit + amount
        cap = self.cap
        if cap is not None and limit > self.sent + cap:
            limit = self.sent + cap
        self.limit = limit
        if self._wake is not None:
            self._wake.set()

    def raise_limit(self, limit: int) -> None:
        """A cumulative grant: the sender may have sent ``limit`` in all. Limits only grow;
        an older, smaller one (reordered or repeated) changes nothing."""
        if limit > self.limit:
            self.limit = limit
            if self._wake is not None:
                self._wake.set()


class ReceiveWindow:
    """The receiver's half: what its consumer has taken (``consumed``) and the limit it has
    granted the sender (``limit`` = consumed at the last grant + ``window``).

    ``consume`` says when to grant again: once ``every`` has been consumed since the last
    grant. ``every`` = 1 returns credit per message (change streams, scans: the sender gets
    each one back as soon as the consumer read it); the SQL exchanges grant once half a
    window is consumed (fewer messages; deadlock-free because their senders cut batches to
    at most half a window, so a blocked sender always leaves that much to consume)."""

    __slots__ = ("consumed", "every", "limit", "window")

    def __init__(self, window: int, every: int = 1) -> None:
        self.window = window
        self.every = every
        self.consumed = 0
        self.limit = window

    def consume(self, cost: int = 1) -> int:
        """Count ``cost`` as consumed; the credit to grant now (the rise of ``limit``), or 0."""
        consumed = self.consumed = self.consumed + cost
        if consumed - (self.limit - self.window) < self.every:
            return 0
        old = self.limit
        self.limit = consumed + self.window
        return self.limit - old


# --- the sending side --------------------------------------------------------------------


class OutStream:
    """One outgoing stream on ``conn``: ``send_message`` spends one credit per message
    (waiting for it), counted in messages, at most ``cap`` at hand."""

    def __init__(self, conn: Connection, stream_id: int, credit: int, cap: int) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.credit = SendWindow(max(1, min(credit, cap)), cap)
        self.task: asyncio.Task[None] | None = None

    async def send_message(self, msg: Message) -> None:
        if not self.credit.take(1):
            await self.credit.spend(1)
        await self.conn.send(msg)

    def grant(self, amount: int) -> None:
        self.credit.grant(amount)


S = TypeVar("S", bound=OutStream)
Producer = Callable[[S], Awaitable[None]]


class OutStreams(Generic[S]):
    """A node's outgoing streams of one kind, by (connection, stream id).

    ``end(stream, error)`` builds the message that ends a stream (``error`` None: it ended
    well); ``duplicate(stream_id)`` the error for an id already open on the connection;
    ``enrich(error)`` may add to a producer's error before it is sent (owner hints)."""

    def __init__(
        self,
        *,
        end: Callable[[S, ShardexError | None], Message],
        duplicate: Callable[[int], ShardexError],
        enrich: Callable[[ShardexError], ShardexError] | None = None,
    ) -> None:
        self._end = end
        self._duplicate = duplicate
        self._enrich = enrich
        self._streams: dict[tuple[Connection, int], S] = {}
        self._watched: dict[Connection, None] = {}  # connections with our close callback

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def check_new(self, conn: Connection, stream_id: int) -> None:
        if (conn, stream_id) in self._streams:
            raise self._duplicate(stream_id)

    def start_stream(self, stream: S, producer: Producer[S], *, name: str, label: str) -> S:
        """Run ``producer(stream)`` in a task (``name``); the stream ends with one end
        message. ``label`` names the stream in the log if the producer fails."""
        conn = stream.conn
        self.check_new(conn, stream.stream_id)
        self._streams[(conn, stream.stream_id)] = stream
        if conn not in self._watched:
            self._watched[conn] = None
            conn.add_close_callback(self._on_conn_closed)
        stream.task = asyncio.get_running_loop().create_task(
            self._serve(stream, producer, label), name=name
        )
        return stream

    def _forget(self, stream: S) -> None:
        key = (stream.conn, stream.stream_id)
        if self._streams.get(key) is stream:  # not a later stream that reused the id
            del self._streams[key]

    async def _serve(self, stream: S, producer: Producer[S], label: str) -> None:
        error: ShardexError | None = None
        try:
            await producer(stream)
        except asyncio.CancelledError:
            self._forget(stream)  # cancelled: the canceller or the closed connection knows
            raise
        except ShardexError as exc:
            error = exc if self._enrich is None else self._enrich(exc)
        except Exception as exc:
            log.exception("%s failed", label)
            error = ShardexError(f"{type(exc).__name__}: {exc}", code=ErrorCode.INTERNAL)
        self._forget(stream)
        with contextlib.suppress(ShardexError):  # a closed connection: nobody is listening
            await stream.conn.send(self._end(stream, error))

    def grant(self, conn: Connection, stream_id: int, amount: int) -> None:
        stream = self._streams.get((conn, stream_id))
        if stream is not None:
            stream.grant(amount)

    def cancel(self, conn: Connection, stream_id: int) -> None:
        """The opener gave up on the stream: stop its producer, send nothing more."""
        stream = self._streams.pop((conn, stream_id), None)
        if stream is not None and stream.task is not None:
            stream.task.cancel()

    def _on_conn_closed(self, conn: Connection) -> None:
        self._watched.pop(conn, None)
        for key in [k for k in self._streams if k[0] is conn]:
            stream = self._streams.pop(key)
            if stream.task is not None:
                stream.task.cancel()

    async def close(self) -> None:
        tasks = [s.task for s in self._streams.values() if s.task is not None]
        self._streams.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --- the receiving side ------------------------------------------------------------------


M = TypeVar("M", bound=Message)


class InStream(Generic[M]):
    """One incoming stream: its messages as they arrive (``deliver``, on the loop) and the
    credit its reader returns (``credit_due``). Open it (``Inboxes.open``) *before* sending
    the opening request: messages may overtake the request's reply.

    The inbox is a deque and, while the reader waits, one future: no ``asyncio.Queue`` (with
    its ``Event`` and two more deques) per stream, which most scans - answered in their
    reply - never read."""

    def __init__(
        self, inboxes: Inboxes[Any], stream_id: int, loop: asyncio.AbstractEventLoop | None
    ) -> None:
        self._inboxes = inboxes
        self.stream_id = stream_id
        self._loop = loop
        self._msgs: deque[M] = deque()
        self._waiter: asyncio.Future[None] | None = None  # the reader, waiting for a message
        self.conn: Connection | None = None
        self.done = False
        # Credit back per message consumed; made when the first one is: most scans are
        # answered in their opening reply and never read a message.
        self._window: ReceiveWindow | None = None

    def attach(self, conn: Connection) -> None:
        """The connection the stream arrives on: its death ends the stream with an error."""
        self.conn = conn
        self._inboxes.attach(self.stream_id, conn)

    def deliver(self, msg: M) -> None:
        """A message for this stream (on the loop): queue it and wake the reader."""
        self._msgs.append(msg)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def credit_due(self, cost: int = 1) -> int:
        """The consumer took a message of ``cost``: the credit to return for it now."""
        window = self._window
        if window is None:
            window = self._window = ReceiveWindow(0)
        return window.consume(cost)

    @property
    def queued(self) -> int:
        """Messages arrived and not read yet."""
        return len(self._msgs)

    async def _next_msg(self) -> M:
        msgs = self._msgs
        loop = self._loop
        if loop is None:  # opened off the loop (a synchronous caller's thread)
            loop = self._loop = asyncio.get_running_loop()
        while not msgs:
            waiter = self._waiter = loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return msgs.popleft()

    async def next_msg(self) -> M:
        """The next message, waiting for one if none is queued."""
        msgs = self._msgs
        return msgs.popleft() if msgs else await self._next_msg()

    async def cancel_with(self, msg: Message | None) -> None:
        """End the stream here and, if it was still running, send ``msg`` (the cancel)."""
        was_done = self.done
        self.finish()
        conn = self.conn
        if not was_done and msg is not None and conn is not None and not conn.closed:
            with contextlib.suppress(ShardexError):
                await conn.send(msg)

    def finish(self) -> None:
        """The stream ended here (read to its end, or given up): stop routing to it."""
        self.done = True
        self._inboxes.detach(self.stream_id, self.conn)


In = TypeVar("In", bound=InStream[Any])


class Inboxes(Generic[In]):
    """Receiver side: the open streams of one connection pool, by stream id, and the
    connections each listens on.

    ``new(inboxes, stream_id, loop)`` makes a stream; ``key(msg)`` is a message's stream id;
    ``lost(stream_id, reason)`` the failed end a stream gets when its connection dies."""

    def __init__(
        self,
        *,
        new: Callable[[Inboxes[In], int, asyncio.AbstractEventLoop | None], In],
        key: Callable[[Any], int],
        lost: Callable[[int, ShardexError], Message],
    ) -> None:
        self._new = new
        self._key = key
        self._lost = lost
        self._ids = itertools.count(1)
        self._streams: dict[int, In] = {}  # the streams still listening, by id
        self._by_conn: dict[Connection, set[int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the streams run on

    def route(self, *msg_types: type[Message]) -> Router:
        """Routes for the pool whose connections carry the streams' messages."""
        return Router(dict.fromkeys(msg_types, self._on_msg))

    def new_id(self) -> int:
        return next(self._ids)

    def open(self) -> In:
        """A new stream's inbox, best opened on the loop that receives the messages (a
        stream opened in another thread looks its loop up when it first waits)."""
        loop = self._loop
        if loop is None:
            # Once per ``Inboxes``: ``get_running_loop`` is a ``getpid`` on Python 3.11.
            with contextlib.suppress(RuntimeError):
                loop = self._loop = asyncio.get_running_loop()
        stream_id = next(self._ids)
        stream = self._new(self, stream_id, loop)
        self._streams[stream_id] = stream
        return stream

    def get(self, stream_id: int) -> In | None:
        return self._streams.get(stream_id)

    def __len__(self) -> int:
        """Streams still listening: a finished or detached one leaves no trace."""
        return len(self._streams)

    def attach(self, stream_id: int, conn: Connection) -> None:
        """Route ``conn``'s death to the stream as a failed end."""
        ids = self._by_conn.get(conn)
        if ids is None:
            ids = self._by_conn[conn] = set()
            conn.add_close_callback(self._on_conn_closed)
        ids.add(stream_id)

    def detach(self, stream_id: int, conn: Connection | None = None) -> None:
        """Stop routing to the stream (``conn``: the one it was attached to, if any)."""
        if self._streams.pop(stream_id, None) is None:
            return  # detached already (or never opened)
        if conn is not None:
            ids = self._by_conn.get(conn)
            if ids is not None:
                ids.discard(stream_id)
            return
        for ids in self._by_conn.values():
            ids.discard(stream_id)

    def _on_conn_closed(self, conn: Connection) -> None:
        reason = conn.close_reason or ConnectionClosed("connection closed")
        for stream_id in sorted(self._by_conn.pop(conn, ())):
            stream = self._streams.get(stream_id)
            if stream is not None:
                stream.deliver(self._lost(stream_id, reason))

    async def _on_msg(self, msg: Message, conn: Connection) -> None:
        stream = self._streams.get(self._key(msg))
        if stream is not None:  # unknown: a stream we already closed; credits bound the rest
            stream.deliver(msg)
