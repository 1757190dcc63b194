"""Credit-based block streams over a ``Connection``, both ends, for any scan hop.

The shape is the change streams' (``shardex.data.streaming`` / ``shardex.client.streams``)
made generic: the opener registers an inbox, sends the opening request, and then receives
``ScanBlock`` one-way messages and one ``ScanEnd``; it returns a ``ScanCredit`` per block it
consumed. The sender spends one credit per block and waits when it has none, so a slow
consumer costs the sender O(credit x block) memory, never an unbounded queue.

* ``OutStreams`` (sender side, one per node): the open outgoing streams by (connection,
  scan id); ``start`` runs a producer coroutine in a task and always ends the stream with
  one ``ScanEnd`` (with the error, if any) unless it was cancelled or its connection closed.
* ``Inboxes`` (receiver side, one per connection pool): routes blocks to per-scan inboxes and
  turns a dead connection into a failed end; ``InStream`` is one scan being received.
* ``LocalStream``: the same receiving end over an in-process reader (a scan coordinator
  reading its own node's slices needs no connection to itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, Protocol

from shardex.api.errors import WireError
from shardex.api.scan import CancelScan, ScanBlock, ScanCredit, ScanEnd
from shardex.errors import ConnectionClosed, ErrorCode, ShardexError
from shardex.net import Connection, Router

__all__ = [
    "MAX_CREDIT",
    "InStream",
    "Inboxes",
    "LocalStream",
    "OutStream",
    "OutStreams",
    "ReplyHead",
    "Source",
    "cancel_all",
]

log = logging.getLogger(__name__)

MAX_CREDIT: Final = 64
CANCEL_TIMEOUT: Final = 5.0


class OutStream:
    """One outgoing scan: ``send`` a block (waits for credit)."""

    def __init__(self, conn: Connection, scan_id: int, credit: int) -> None:
        self.conn = conn
        self.scan_id = scan_id
        self.credit = max(1, min(credit, MAX_CREDIT))
        self.credit_changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.rows = 0
        self.blocks = 0

    async def send(self, entries: list[bytes]) -> None:
        while self.credit <= 0:
            self.credit_changed.clear()
            await self.credit_changed.wait()
        self.credit -= 1
        self.rows += len(entries)
        self.blocks += 1
        await self.conn.send(ScanBlock(scan_id=self.scan_id, entries=entries))

    def grant(self, blocks: int) -> None:
        if blocks > 0:
            self.credit = min(self.credit + blocks, MAX_CREDIT)
            self.credit_changed.set()


Producer = Callable[[OutStream], Awaitable[None]]


class OutStreams:
    """The node's outgoing scan streams (both the indexer's and the coordinator's)."""

    def __init__(self) -> None:
        self._streams: dict[tuple[Connection, int], OutStream] = {}
        self._watched: dict[Connection, None] = {}

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def install(self, router: Router) -> None:
        router.route(ScanCredit, self.on_credit)
        router.route(CancelScan, self.on_cancel)

    def check_new(self, conn: Connection, scan_id: int) -> None:
        if (conn, scan_id) in self._streams:
            raise ShardexError(
                f"scan {scan_id} is already open on this connection",
                code=ErrorCode.BAD_REQUEST,
                details={"scan_id": scan_id, "hint": "use a new scan id per scan"},
            )

    def start(self, conn: Connection, scan_id: int, credit: int, producer: Producer) -> OutStream:
        """Run ``producer(stream)`` in a task; the stream ends with one ``ScanEnd``."""
        self.check_new(conn, scan_id)
        stream = OutStream(conn, scan_id, credit)
        self._streams[(conn, scan_id)] = stream
        if conn not in self._watched:
            self._watched[conn] = None
            conn.add_close_callback(self._on_conn_closed)
        stream.task = asyncio.get_running_loop().create_task(
            self._serve(stream, producer), name=f"scan-out {scan_id}"
        )
        return stream

    async def _serve(self, stream: OutStream, producer: Producer) -> None:
        error: ShardexError | None = None
        try:
            await producer(stream)
        except asyncio.CancelledError:
            self._streams.pop((stream.conn, stream.scan_id), None)
            raise
        except ShardexError as exc:
            error = exc
        except Exception as exc:
            log.exception("scan %d failed", stream.scan_id)
            error = ShardexError(f"{type(exc).__name__}: {exc}", code=ErrorCode.INTERNAL)
        self._streams.pop((stream.conn, stream.scan_id), None)
        wire = None if error is None else WireError(*error.to_wire())
        with contextlib.suppress(ShardexError):  # a closed connection: nobody is listening
            await stream.conn.send(ScanEnd(scan_id=stream.scan_id, error=wire, rows=stream.rows))

    async def on_credit(self, msg: ScanCredit, conn: Connection) -> None:
        stream = self._streams.get((conn, msg.scan_id))
        if stream is not None:
            stream.grant(msg.blocks)

    async def on_cancel(self, msg: CancelScan, conn: Connection) -> None:
        stream = self._streams.pop((conn, msg.scan_id), None)
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


class Inboxes:
    """Receiver side: the open scans of one connection pool, by scan id, and the
    connections each listens on."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._queues: dict[int, InStream] = {}  # the scans still listening, by scan id
        self._by_conn: dict[Connection, set[int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the scans run on

    def handlers(self) -> Router:
        """Routes to give the pool whose connections carry the blocks."""
        return Router({ScanBlock: self._on_msg, ScanEnd: self._on_msg})

    def open(self) -> InStream:
        """A new scan's inbox; call it on the loop that receives the blocks."""
        loop = self._loop
        if loop is None:
            # Once per ``Inboxes``: ``get_running_loop`` is a ``getpid`` on Python 3.11.
            loop = self._loop = asyncio.get_running_loop()
        scan_id = next(self._ids)
        stream = InStream(self, scan_id, loop)
        self._queues[scan_id] = stream
        return stream

    def attach(self, scan_id: int, conn: Connection) -> None:
        """Route ``conn``'s death to the scan as a failed end."""
        ids = self._by_conn.get(conn)
        if ids is None:
            ids = self._by_conn[conn] = set()
            conn.add_close_callback(self._on_conn_closed)
        ids.add(scan_id)

    def detach(self, scan_id: int, conn: Connection | None = None) -> None:
        """Stop routing to the scan (``conn``: the one it was attached to, if any)."""
        if self._queues.pop(scan_id, None) is None:
            return  # detached already (or never opened)
        if conn is not None:
            ids = self._by_conn.get(conn)
            if ids is not None:
                ids.discard(scan_id)
            return
        for ids in self._by_conn.values():
            ids.discard(scan_id)

    def _on_conn_closed(self, conn: Connection) -> None:
        reason = conn.close_reason or ConnectionClosed("connection closed")
        for scan_id in sorted(self._by_conn.pop(conn, ())):
            stream = self._queues.get(scan_id)
            if stream is not None:
                stream.deliver(ScanEnd(scan_id=scan_id, error=WireError(*reason.to_wire())))

    async def _on_msg(self, msg: ScanBlock | ScanEnd, conn: Connection) -> None:
        stream = self._queues.get(msg.scan_id)
        if stream is not None:  # unknown: a scan we already closed; credits bound the rest
            stream.deliver(msg)


class ReplyHead:
    """The entries a scan's opening reply carried, as both receiving ends (``InStream`` here,
    the client's ``DirectStream``) hold them: ``_head`` comes first, ``_ends_at_head`` says
    nothing follows it."""

    __slots__ = ()
    _head: list[bytes] | None
    _ends_at_head: bool
    done: bool

    def poll(self) -> tuple[bool, list[bytes] | None]:
        """``next_block`` without a loop when the reply's entries answer it: (True, the
        block or None at the end), else (False, None). Touches nothing the event loop
        writes, so a synchronous caller may use it from its own thread."""
        if self._head is not None:
            head, self._head = self._head, None
            return True, head
        if self._ends_at_head:
            self.done = True
            return True, None
        return False, None


class InStream(ReplyHead):
    """One scan being received. Open it (``inboxes.open()``) *before* sending the opening
    request: blocks may overtake the request's reply.

    Its inbox is a deque and, while the reader waits, one future: no ``asyncio.Queue`` (with
    its ``Event`` and two more deques) per scan, which most scans - answered in their
    reply - never read (the client's CPU per scan)."""

    def __init__(self, inboxes: Inboxes, scan_id: int, loop: asyncio.AbstractEventLoop) -> None:
        self._inboxes = inboxes
        self.scan_id = scan_id
        self._loop = loop
        self._msgs: deque[ScanBlock | ScanEnd] = deque()
        self._waiter: asyncio.Future[None] | None = None  # the reader, waiting for a message
        self.conn: Connection | None = None
        self.done = False
        self.rows = 0
        # Entries the opening request's reply carried (``SlicesOpened`` / ``IndexScanStarted``
        # with ``entries``): they come first, whatever blocks overtook the reply, and need no
        # credit back (the sender spent none). ``_ends_at_head``: the reply said nothing follows.
        self._head: list[bytes] | None = None
        self._ends_at_head = False

    def attach(self, conn: Connection) -> None:
        self.conn = conn
        self._inboxes.attach(self.scan_id, conn)

    def deliver(self, msg: ScanBlock | ScanEnd) -> None:
        """A message for this scan (on the loop): queue it and wake the reader."""
        self._msgs.append(msg)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def put_head(self, entries: list[bytes] | None, done: bool) -> None:
        """What the opening reply carried: ``entries`` to deliver first, and ``done`` when
        the sender opened no stream (no ``ScanBlock``/``ScanEnd`` follow). Call it before
        the first ``next_block``."""
        self._head = entries if entries else None
        if done:
            self._ends_at_head = True
            self._inboxes.detach(self.scan_id, self.conn)  # nothing more comes; nothing to cancel

    @property
    def complete(self) -> bool:
        """The opening reply carried every entry (``put_head`` with ``done``)."""
        return self._ends_at_head

    def take_head(self) -> list[bytes]:
        """Every entry of a ``complete`` stream at once (the reply's), ending it."""
        assert self._ends_at_head, "take_head needs a complete stream"
        head, self._head = self._head, None
        self.done = True
        return head or []

    def ready(self) -> bool:
        """True when ``next_block`` answers without waiting for the network."""
        return self.done or self._head is not None or self._ends_at_head or bool(self._msgs)

    async def _next_msg(self) -> ScanBlock | ScanEnd:
        msgs = self._msgs
        while not msgs:
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return msgs.popleft()

    async def next_block(self) -> list[bytes] | None:
        """The next block of entries; None at the end; raises the sender's error."""
        if self.done:
            return None
        answered, block = self.poll()
        if answered:
            return block
        msgs = self._msgs
        msg = msgs.popleft() if msgs else await self._next_msg()
        if isinstance(msg, ScanEnd):
            self._finish()
            msg.check(self.rows)
            return None
        self.rows += len(msg.entries)
        conn = self.conn
        if conn is not None and not conn.closed:
            with contextlib.suppress(ShardexError):
                await conn.send(ScanCredit(scan_id=self.scan_id, blocks=1))
        return msg.entries

    async def cancel(self) -> None:
        """Stop the sender (a no-op once the stream ended)."""
        if self.done or self._ends_at_head:
            self._finish()
            return
        self._finish()
        conn = self.conn
        if conn is not None and not conn.closed:
            with contextlib.suppress(ShardexError):
                await conn.send(CancelScan(scan_id=self.scan_id))

    def _finish(self) -> None:
        self.done = True
        self._inboxes.detach(self.scan_id, self.conn)


class Source(Protocol):
    """What a scan coordinator reads a slice stream through (``InStream``, ``LocalStream``)."""

    @property
    def complete(self) -> bool: ...

    def take_head(self) -> list[bytes]: ...

    def ready(self) -> bool: ...

    async def next_block(self) -> list[bytes] | None: ...

    async def cancel(self) -> None: ...


async def cancel_all(sources: list[Source]) -> None:
    """Cancel every source at once; one failing cancel does not stop the others."""
    await asyncio.gather(*(s.cancel() for s in sources), return_exceptions=True)


class LocalStream:
    """A stream read in-process: the opening reply's ``head`` entries, then the blocks of
    ``rest`` (None: the head was all). Pulled by its reader, so no credit is needed."""

    def __init__(self, head: list[bytes], rest: AsyncIterator[list[bytes]] | None) -> None:
        self._head: list[bytes] | None = head if head else None
        self._rest = rest
        self._complete = rest is None
        self.done = False

    @property
    def complete(self) -> bool:
        return self._complete

    def take_head(self) -> list[bytes]:
        """Every entry of a ``complete`` stream at once, ending it."""
        assert self._complete, "take_head needs a complete stream"
        head, self._head = self._head, None
        self.done = True
        return head or []

    def ready(self) -> bool:
        return self.done or self._head is not None or self._rest is None

    async def next_block(self) -> list[bytes] | None:
        if self._head is not None:
            head, self._head = self._head, None
            return head
        if self.done or self._rest is None:
            self.done = True
            return None
        try:
            return await anext(self._rest)
        except StopAsyncIteration:
            self.done = True
            return None

    async def cancel(self) -> None:
        self.done = True
        rest, self._rest = self._rest, None
        if rest is not None and hasattr(rest, "aclose"):
            await rest.aclose()
