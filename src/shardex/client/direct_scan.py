"""Scans over a blocking socket in the calling thread: the sync client's default scan path.

``Client.scan`` (``open_scan``) sends a scan here first. The calling thread keeps one
``DirectConn`` per node it has scanned (opened lazily, thread-local), sends the very
``IndexScan`` the loop path sends, reads the ``IndexScanStarted`` reply itself and, while
the caller iterates, reads each ``ScanBlock`` and returns its ``ScanCredit``: the same
protocol and back-pressure as the loop path, without the hand-off to the client's event-loop
thread (two wake-ups, a send from another thread and context switches per scan: most of the
client's CPU outside the rows, docs/decisions/0068-scans-in-the-calling-thread.md).

What stays on the loop path (``open` returns None, or the client has no ``DirectScans``):
* a scan started while another scan of this thread still streams on the same socket
  (nested scans: the socket carries one stream at a time);
* clients on any transport other than TCP (the simulator's deterministic network);
* clients built with ``direct_scans=False`` (benches compare the two).

Failover is ``ScanTargets``' (``client/scan.py``), as on the loop path: NodeUnavailable or
ConnectionClosed before the reply sends the scan to the next node; a socket kept from an
earlier scan that turns out dead (the node restarted) is first replaced once. Errors and
their messages are the loop path's: the reply's wait is a ``RequestTimeout``, a block's wait
SCAN_TIMEOUT, a socket that ends mid-stream CONNECTION_CLOSED, a closed client "client is
closed". A scan abandoned half-read is cancelled on the node (``CancelScan``, from the
thread that owns the socket, else by that thread before its next scan); frames of it still
on the way are skipped by scan id.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import msgspec

from shardex.api.scan import (
    CancelScan,
    IndexScan,
    IndexScanStarted,
    ScanBlock,
    ScanCredit,
    ScanEnd,
)
from shardex.api.scan_streams import ReplyHead
from shardex.client.direct_conn import DirectConn, DirectConns
from shardex.client.rpc_session import client_closed
from shardex.client.scan import (
    FAILOVER,
    ScanResult,
    reply_timeout,
    scan_timed_out,
)
from shardex.errors import ConnectionClosed, ProtocolError, RequestTimeout, ShardexError
from shardex.net.messages import (
    Envelope,
    ErrorReply,
    Kind,
    Message,
    encode_frame,
    message_type_name,
)

if TYPE_CHECKING:
    from shardex.client.rpc_session import RpcSession
    from shardex.client.scan import ScanTargets

__all__ = ["DirectScanResult", "DirectScans", "DirectStream", "open_on", "open_stream"]


class DirectStream(ReplyHead):
    """One scan's blocks, read from its socket by whichever thread iterates the result."""

    __slots__ = (
        "_credit",
        "_early",
        "_ends_at_head",
        "_head",
        "_owner",
        "conn",
        "done",
        "index_id",
        "rows",
        "rpc",
        "scan_id",
    )

    def __init__(self, rpc: RpcSession, conn: DirectConn, scan_id: int) -> None:
        self.rpc = rpc
        self.conn = conn
        self.scan_id = scan_id
        self.index_id = "?"  # named by the reply (SCAN_TIMEOUT names it)
        self._owner = threading.get_ident()  # the thread whose socket this is
        self.done = False
        self.rows = 0
        self._head: list[bytes] | None = None
        self._ends_at_head = False
        self._early: deque[ScanBlock | ScanEnd] | None = None  # frames ahead of the reply
        self._credit: bytes | None = None  # this scan's ScanCredit frame, encoded once

    # -- the head (``ScanResult.blocks`` polls it without any I/O) --

    def put_head(self, entries: list[bytes], done: bool) -> None:
        self._head = entries if entries else None
        if done:
            self._ends_at_head = True
            self.release()

    @property
    def complete(self) -> bool:
        return self._ends_at_head

    def early(self, msg: ScanBlock | ScanEnd) -> None:
        """A block or end that overtook the reply."""
        if self._early is None:
            self._early = deque()
        self._early.append(msg)

    # -- the rest, from the socket --

    def read(self, timeout: float | None) -> list[bytes] | None:
        """The next block (None at the end), its credit returned; raises the sender's
        error, SCAN_TIMEOUT past ``timeout`` (the loop path's words), CONNECTION_CLOSED if
        the socket ends, "client is closed" once the client is."""
        if self.done:
            return None
        if self.rpc.closed:
            raise client_closed()
        conn = self.conn
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        sid = self.scan_id
        early = self._early
        while True:
            if early:
                msg = early.popleft()
            else:
                try:
                    env = conn.read(deadline)
                except TimeoutError:
                    raise scan_timed_out(self.index_id, timeout) from None
                except ShardexError:
                    self.release()
                    if self.rpc.closed:
                        raise client_closed() from None
                    raise
                msg = env.body
                kind = type(msg)
                if (kind is not ScanBlock and kind is not ScanEnd) or msg.scan_id != sid:
                    continue  # a late reply, or a frame of a scan this socket left behind
            if type(msg) is ScanEnd:
                return self._end(msg)
            self.rows += len(msg.entries)
            frame = self._credit
            if frame is None:
                credit = ScanCredit(scan_id=sid, blocks=1)
                frame = self._credit = encode_frame(Envelope(Kind.ONEWAY, 0, credit))
            # Not ``contextlib.suppress``: an object per block. A dead socket: the next read
            # says so, after this block's rows.
            try:  # noqa: SIM105
                conn.send_frame(frame)
            except ShardexError:
                pass
            return msg.entries

    def _end(self, msg: ScanEnd) -> None:
        self.release()
        msg.check(self.rows)

    def cancel(self) -> None:
        """Stop the sender (nothing once the stream ended). The ``CancelScan`` goes out now
        from the socket's own thread; from another thread (a result dropped elsewhere) it
        is left to the owner, which sends it before its next scan on that socket."""
        if self.done:
            return
        ends_at_head = self._ends_at_head
        self.release()
        conn = self.conn
        if ends_at_head or conn.closed:
            return
        if threading.get_ident() == self._owner:
            with contextlib.suppress(ShardexError):  # gone: the stream ends with it
                conn.send(CancelScan(scan_id=self.scan_id), 0)
        else:
            conn.pending_cancels.append(self.scan_id)

    def release(self) -> None:
        """The stream is over: its socket is free for this thread's next scan."""
        self.done = True
        if self.conn.busy is self:
            self.conn.busy = None


class DirectScanResult(ScanResult):
    """A ``ScanResult`` whose blocks come from the calling thread's socket."""

    _stream: DirectStream

    def _next(self) -> list[bytes] | None:
        return self._stream.read(self._block_timeout)

    def close(self) -> None:
        stream = self._stream
        if not stream.done and not stream.complete:
            if stream.rpc.closed:
                # Nothing to cancel: ``Client.close`` closed the socket, and the node ends
                # the stream with it. Reading raises "client is closed", as the loop path.
                stream.release()
                return
            stream.cancel()


class DirectScans:
    """Scans over the client's calling-thread sockets (``DirectConns``, shared with its
    single-document requests)."""

    def __init__(self, rpc: RpcSession, targets: ScanTargets, conns: DirectConns) -> None:
        self._rpc = rpc
        self._targets = targets
        self._sockets = conns

    def open(self, msg: IndexScan, covering: bool) -> ScanResult | None:
        """Start the scan on this thread's socket to the first node that answers (the
        failover of ``ScanTargets``); None when it must take the loop path (nested)."""
        rpc = self._rpc
        if rpc.closed:
            raise client_closed()
        conns = self._sockets.mine()
        targets = self._targets
        key = (msg.keyspace, msg.index)
        order, hint = targets.order(rpc, key)
        timeout = reply_timeout(rpc, msg)
        last: ShardexError | None = None
        for address in order:
            conn = conns.get(address)
            if conn is not None and conn.busy is not None:
                return None  # this socket streams a scan the caller still reads
            try:
                started, stream = self._start(conns, address, conn, msg, timeout)
            except FAILOVER as exc:
                if rpc.closed:
                    raise client_closed() from None
                targets.failed(key, address, hint)
                last = exc
                continue
            targets.answered(key, address, hint, started)
            stream.index_id = started.index_id
            return DirectScanResult(None, stream, started, covering, timeout)
        assert last is not None
        raise last

    def _start(
        self,
        conns: dict[str, DirectConn],
        address: str,
        conn: DirectConn | None,
        msg: IndexScan,
        timeout: float,
    ) -> tuple[IndexScanStarted, DirectStream]:
        def send(c: DirectConn) -> tuple[IndexScanStarted, DirectStream]:
            return open_stream(
                self._rpc,
                c,
                lambda sid: msgspec.structs.replace(msg, scan_id=sid),
                IndexScanStarted,
                lambda started: (started.entries, started.done),
                timeout,
            )

        return open_on(self._sockets, conns, address, conn, send)


R = TypeVar("R", bound=Message)


def open_on(
    sockets: DirectConns,
    conns: dict[str, DirectConn],
    address: str,
    conn: DirectConn | None,
    send: Callable[[DirectConn], tuple[R, DirectStream]],
) -> tuple[R, DirectStream]:
    """``send`` on this thread's socket to ``address`` (``conn``, opened if None or closed);
    a kept socket found dead (the node restarted, or dropped it) is replaced once, as the
    loop path's pool would reconnect."""
    if conn is None or conn.closed:
        return send(sockets.connect(conns, address))
    try:
        return send(conn)
    except FAILOVER:
        if not conn.closed:
            raise
    return send(sockets.connect(conns, address))


def open_stream(
    rpc: RpcSession,
    conn: DirectConn,
    with_id: Callable[[int], Message],
    expect: type[R],
    head: Callable[[R], tuple[list[bytes] | None, bool]],
    timeout: float,
) -> tuple[R, DirectStream]:
    """Send the stream-opening request ``with_id(stream id)`` on ``conn`` and read its reply
    of type ``expect`` (blocks that overtake it are kept for the stream); ``head`` names
    the rows the reply carries and whether they are all."""
    conn.send_pending_cancels()  # abandoned from another thread: stop them now
    sid = conn.new_scan_id()
    rid = conn.new_request_id()
    stream = DirectStream(rpc, conn, sid)
    msg = with_id(sid)
    name = message_type_name(msg)
    conn.send(msg, rid, Kind.REQUEST)
    conn.busy = stream
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                env = conn.read(deadline)
            except TimeoutError:
                raise RequestTimeout(
                    f"{name} to {conn.peer_label} timed out after {timeout}s",
                    details={"type": name, "peer": conn.peer_label, "timeout": timeout},
                ) from None
            body = env.body
            if env.kind is Kind.ONEWAY:
                kind = type(body)
                if (kind is ScanBlock or kind is ScanEnd) and body.scan_id == sid:
                    stream.early(body)
                continue
            if env.id != rid or env.kind is Kind.REQUEST:
                continue  # the late reply of a request this socket gave up on
            if env.kind is Kind.ERROR:
                if isinstance(body, ErrorReply):
                    raise ShardexError.from_wire(body.code, body.message, body.details)
                raise ProtocolError(
                    f"{conn.peer_label} sent an error of type {message_type_name(body)}",
                    details={"type": name},
                )
            if type(body) is not expect:
                raise ProtocolError(
                    f"{conn.peer_label} answered {name} with "
                    f"{message_type_name(body)}, expected {expect.__name__}",
                    details={"type": name, "got": message_type_name(body)},
                )
            rows, done = head(body)
            stream.put_head(rows or [], done)
            return body, stream
    except ConnectionClosed:
        stream.release()
        raise
    except BaseException:
        stream.cancel()  # as the loop path: the node stops whatever it started
        raise
