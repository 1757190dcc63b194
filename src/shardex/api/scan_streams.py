"""Credit-based block streams for any scan hop: the scans' messages on ``net.credit_stream``.

The opener registers an inbox, sends the opening request, and then receives ``ScanBlock``
one-way messages and one ``ScanEnd``; it returns a ``ScanCredit`` per block it consumed. The
sender spends one credit per block and waits when it has none, so a slow consumer costs the
sender O(credit x block) memory, never an unbounded queue. Credit is counted in blocks, at
most ``MAX_CREDIT`` at hand, as the change streams count batches.

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
from collections.abc import AsyncIterator, Awaitable, Callable
from operator import attrgetter
from typing import Final, Protocol

from shardex.api.errors import WireError
from shardex.api.scan import CancelScan, ScanBlock, ScanCredit, ScanEnd
from shardex.errors import ErrorCode, ShardexError
from shardex.net import Connection, Router
from shardex.net import credit_stream as cs

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

MAX_CREDIT: Final = 64
CANCEL_TIMEOUT: Final = 5.0


class OutStream(cs.OutStream):
    """One outgoing scan: ``send`` a block (waits for credit)."""

    def __init__(self, conn: Connection, scan_id: int, credit: int) -> None:
        super().__init__(conn, scan_id, credit, MAX_CREDIT)
        self.scan_id = scan_id
        self.rows = 0
        self.blocks = 0

    async def send(self, entries: list[bytes]) -> None:
        credit = self.credit
        if not credit.take(1):
            await credit.spend(1)
        self.rows += len(entries)
        self.blocks += 1
        await self.conn.send(ScanBlock(scan_id=self.scan_id, entries=entries))


Producer = Callable[[OutStream], Awaitable[None]]


def _scan_end(stream: OutStream, error: ShardexError | None) -> ScanEnd:
    wire = None if error is None else WireError(*error.to_wire())
    return ScanEnd(scan_id=stream.scan_id, error=wire, rows=stream.rows)


def _duplicate(scan_id: int) -> ShardexError:
    return ShardexError(
        f"scan {scan_id} is already open on this connection",
        code=ErrorCode.BAD_REQUEST,
        details={"scan_id": scan_id, "hint": "use a new scan id per scan"},
    )


class OutStreams(cs.OutStreams[OutStream]):
    """The node's outgoing scan streams (the indexer's, the coordinator's, SQL results)."""

    def __init__(self) -> None:
        super().__init__(end=_scan_end, duplicate=_duplicate)

    def install(self, router: Router) -> None:
        router.route(ScanCredit, self.on_credit)
        router.route(CancelScan, self.on_cancel)

    def start(self, conn: Connection, scan_id: int, credit: int, producer: Producer) -> OutStream:
        """Run ``producer(stream)`` in a task; the stream ends with one ``ScanEnd``."""
        stream = OutStream(conn, scan_id, credit)
        return self.start_stream(
            stream, producer, name=f"scan-out {scan_id}", label=f"scan {scan_id}"
        )

    async def on_credit(self, msg: ScanCredit, conn: Connection) -> None:
        self.grant(conn, msg.scan_id, msg.blocks)

    async def on_cancel(self, msg: CancelScan, conn: Connection) -> None:
        self.cancel(conn, msg.scan_id)


def _lost(scan_id: int, reason: ShardexError) -> ScanEnd:
    return ScanEnd(scan_id=scan_id, error=WireError(*reason.to_wire()))


class Inboxes(cs.Inboxes["InStream"]):
    """Receiver side: the open scans of one connection pool, by scan id, and the
    connections each listens on."""

    def __init__(self) -> None:
        super().__init__(new=InStream, key=attrgetter("scan_id"), lost=_lost)

    def handlers(self) -> Router:
        """Routes to give the pool whose connections carry the blocks."""
        return self.route(ScanBlock, ScanEnd)


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


class InStream(cs.InStream[ScanBlock | ScanEnd], ReplyHead):
    """One scan being received. Open it (``inboxes.open()``) *before* sending the opening
    request: blocks may overtake the request's reply."""

    def __init__(
        self, inboxes: Inboxes, scan_id: int, loop: asyncio.AbstractEventLoop | None
    ) -> None:
        super().__init__(inboxes, scan_id, loop)
        self.scan_id = scan_id
        self.rows = 0
        # Entries the opening request's reply carried (``SlicesOpened`` / ``IndexScanStarted``
        # with ``entries``): they come first, whatever blocks overtook the reply, and need no
        # credit back (the sender spent none). ``_ends_at_head``: the reply said nothing follows.
        self._head: list[bytes] | None = None
        self._ends_at_head = False

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
            self.finish()
            msg.check(self.rows)
            return None
        self.rows += len(msg.entries)
        blocks = self.credit_due()
        conn = self.conn
        if blocks and conn is not None and not conn.closed:
            with contextlib.suppress(ShardexError):
                await conn.send(ScanCredit(scan_id=self.scan_id, blocks=blocks))
        return msg.entries

    async def cancel(self) -> None:
        """Stop the sender (a no-op once the stream ended, or when the reply was all)."""
        if self.done or self._ends_at_head:
            self.finish()
            return
        await self.cancel_with(CancelScan(scan_id=self.scan_id))


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
