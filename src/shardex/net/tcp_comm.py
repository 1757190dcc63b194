"""One TCP connection moving whole frames: ``TcpComm``, the TCP transport's ``Comm``.

Frame = 4-byte big-endian unsigned payload length + payload (``framing.py``). ``TcpComm`` is
an ``asyncio`` protocol, not a pair of streams: every ``recv`` the loop makes is cut into
whole frames at once, in its callback. A ``Connection`` takes them there (``set_receiver``),
so a frame costs no reader-task wake-up, no ``readexactly`` coroutines and no extra loop
iteration; several frames that arrive in one ``recv`` are handled in one go. ``read()`` (the
handshake, the simulator-compatible path) takes them from a queue.

Made by ``TcpTransport`` (``tcp.py``): ``PlainComm`` in clear; under TLS the in-memory comm
of ``tcp_tls.py``. Encryption is the subclass's: this class only learns, once connected,
whether the stream is encrypted and which node a verified certificate names.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
from collections.abc import Callable

from shardex.errors import AuthFailed, ConnectionClosed, NodeUnavailable, ShardexError
from shardex.net.framing import HEADER, announced_too_large, sending_too_large
from shardex.net.tls import TLS_RECORD_HANDSHAKE, cert_refused, tls_failure
from shardex.net.transport import DEFAULT_MAX_FRAME, Comm, EndCallback, FrameCallback

log = logging.getLogger(__name__)

# Frames queued for ``read()`` (before a receiver takes over) past this many bytes pause the
# socket until read: a peer cannot make an unauthenticated connection buffer without bound.
_READ_LIMIT = 2 * 1024 * 1024
# Writes return without awaiting until this much is buffered in the kernel-side transport.
# Many small frames then coalesce into few syscalls; a slow reader still pushes back on us.
_WRITE_HIGH_WATER = 256 * 1024
# Frames this small are sent as one joined buffer; larger ones as two (no copy of the body).
_JOIN_BELOW = 64 * 1024
# A graceful close that cannot flush within this bound (peer not reading) becomes an abort.
_CLOSE_TIMEOUT = 5.0


def fmt_addr(addr: object) -> str:
    """``host:port`` of a socket address as ``getsockname`` / ``getpeername`` give it."""
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


class TcpComm(Comm, asyncio.BaseProtocol):
    """One TCP connection moving whole frames; also the connection's asyncio protocol: a
    plain one (``PlainComm``) in clear, one running TLS in memory (``tcp_tls.TlsMemoryComm``)
    under TLS."""

    def __init__(
        self,
        max_frame: int = DEFAULT_MAX_FRAME,
        on_connected: Callable[[TcpComm], None] | None = None,
        presents_cert: bool = False,
    ) -> None:
        self._max_frame = max_frame
        # An outgoing TLS comm that presented our certificate, and whether any byte came in:
        # a TLS 1.3 server checks a client's certificate after the client's handshake is
        # done, so its alert or a close before its first frame is its refusal of the
        # certificate.
        self._presents_cert = presents_cert
        self._got_data = False
        self._on_connected = on_connected
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._local = self._peer = "?"
        self._buf = bytearray()
        # Pull mode: frames waiting for read(), their bytes, and the reader waiting for one.
        self._frames: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._read_paused = False
        self._read_waiter: asyncio.Future[None] | None = None
        # Push mode (set_receiver): every frame goes to _on_frame as it is cut.
        self._on_frame: FrameCallback | None = None
        self._on_end: EndCallback | None = None
        # Why the byte stream ended (EOF, reset, oversized frame); None while it runs.
        self._end: ShardexError | None = None
        self._closing = False  # close() or abort() called here
        self._write_paused = False
        self._drain_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self._peer_node: str | None = None
        self._encrypted = False

    def __repr__(self) -> str:
        return f"<TcpComm {self._local} -> {self._peer}{' closed' if self.closed else ''}>"

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._attach(transport)
        self._connected(None, encrypted=False)  # in clear (TLS comms override this)

    def _attach(self, transport: asyncio.BaseTransport) -> None:
        """Take ``transport`` as this comm's byte stream (not yet ``_connected``)."""
        # uvloop's transports are not asyncio.Transport subclasses; both have its methods.
        self._transport = transport  # type: ignore[assignment]
        self._local = fmt_addr(transport.get_extra_info("sockname"))
        self._peer = fmt_addr(transport.get_extra_info("peername"))
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Loops enable TCP_NODELAY already; set it explicitly because request/response
            # latency depends on it (Nagle + delayed ACK would add ~40 ms per round trip).
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)

    def _connected(self, peer_node: str | None, encrypted: bool = True) -> None:
        """The stream carries frames from now on (over TLS: its handshake is done, and
        ``peer_node`` is what the peer's verified certificate names)."""
        self._encrypted = encrypted
        self._peer_node = peer_node
        if self._on_connected is not None:
            self._on_connected(self)

    def data_received(self, data: bytes) -> None:
        self._got_data = True
        buf = self._buf
        if buf:
            buf += data
            view: bytes | bytearray = buf
        else:
            view = data  # the common case: frames cut straight from what recv returned
        pos, end = 0, len(view)
        while end - pos >= HEADER and self._end is None and not self._closing:
            size = int.from_bytes(view[pos : pos + HEADER], "big")
            if size > self._max_frame:
                self._too_large(size)
                return
            stop = pos + HEADER + size
            if stop > end:
                break
            # memoryview: one copy out of a bytearray buffer, not two (the view is freed
            # at once, so the buffer can be resized below)
            frame = bytes(memoryview(view)[pos + HEADER : stop])
            pos = stop
            self._deliver(frame)
        if self._end is not None or self._closing:
            buf.clear()
        elif view is buf:
            del buf[:pos]
        elif pos < end:
            buf += memoryview(data)[pos:]

    def _refused_cert(self) -> AuthFailed | None:
        if not self._presents_cert or self._got_data or self._closing:
            return None
        return cert_refused(self._peer)

    def eof_received(self) -> bool | None:
        refused = self._refused_cert()
        if refused is not None:
            self._ended(refused)
            return None
        partial = max(len(self._buf) - HEADER, 0) if len(self._buf) >= HEADER else len(self._buf)
        self._ended(
            ConnectionClosed(
                f"connection to {self._peer} closed by peer",
                details={"peer": self._peer, "partial_bytes": partial},
            )
        )
        return None  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        refused_cert = self._refused_cert()
        if refused_cert is not None:
            err: ShardexError = refused_cert
        elif exc is None:
            err = ConnectionClosed(
                f"connection to {self._peer} closed " + ("locally" if self._closing else "by peer"),
                details={"peer": self._peer, "partial_bytes": len(self._buf)},
            )
        else:
            refused = tls_failure(self._peer, exc)
            # A peer that refused our certificate says so with an alert, which ends the
            # stream: the caller learns why, not only that it closed.
            err = (
                refused
                if isinstance(refused, AuthFailed)
                else ConnectionClosed(
                    f"connection to {self._peer} lost: {exc}", details={"peer": self._peer}
                )
            )
        self._ended(err)
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)  # write() sees the end and raises
        self._drain_waiters.clear()
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        while self._drain_waiters:
            w = self._drain_waiters.popleft()
            if not w.done():
                w.set_result(None)

    # --- frames in -------------------------------------------------------------------------

    def _deliver(self, frame: bytes) -> None:
        on_frame = self._on_frame
        if on_frame is not None:
            try:
                on_frame(frame)
            except Exception:  # the receiver handles its own errors; this is a bug
                log.exception("frame receiver of %r failed; aborting", self)
                self.abort()
            return
        self._frames.append(frame)
        self._queued += len(frame)
        if self._queued > _READ_LIMIT and not self._read_paused and self._transport is not None:
            self._read_paused = True
            self._transport.pause_reading()
        self._wake_reader()

    def _too_large(self, size: int) -> None:
        if size >> 24 == TLS_RECORD_HANDSHAKE and not self._encrypted:
            log.warning(
                "peer %s started a TLS handshake on this plaintext port; closing (turn TLS "
                "on here, or off at the peer)",
                self._peer,
            )
            self._ended(
                NodeUnavailable(
                    f"{self._peer} speaks TLS to a plaintext port", details={"peer": self._peer}
                )
            )
            self._buf.clear()
            if self._transport is not None:
                self._transport.abort()
            return
        log.error(
            "peer %s announced a frame of %d bytes (max_frame %d); closing connection",
            self._peer,
            size,
            self._max_frame,
        )
        self._ended(announced_too_large(self._peer, size, self._max_frame))
        self._buf.clear()
        if self._transport is not None:
            self._transport.abort()

    def _ended(self, err: ShardexError) -> None:
        if self._end is not None:
            return
        self._end = err
        self._wake_reader()
        on_end, self._on_end, self._on_frame = self._on_end, None, None
        if on_end is not None:
            on_end(err)

    def _wake_reader(self) -> None:
        w = self._read_waiter
        if w is not None:
            self._read_waiter = None
            if not w.done():
                w.set_result(None)

    def set_receiver(self, on_frame: FrameCallback, on_end: EndCallback) -> bool:
        """From now on hand every frame to ``on_frame`` as it arrives (frames already queued
        first), and the end of the stream to ``on_end`` (once; at once if it has ended)."""
        while self._frames:
            if self._closing:
                self._frames.clear()
                break
            frame = self._frames.popleft()
            on_frame(frame)
        self._queued = 0
        if self._read_paused and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()
        if self._end is not None:
            self._loop.call_soon(on_end, self._end)
        else:
            self._on_frame, self._on_end = on_frame, on_end
        return True

    @property
    def closed(self) -> bool:
        return self._closing or self._end is not None or self._transport is None

    @property
    def local_address(self) -> str:
        return self._local

    @property
    def peer_node(self) -> str | None:
        return self._peer_node

    @property
    def encrypted(self) -> bool:
        return self._encrypted

    @property
    def peer_address(self) -> str:
        return self._peer

    async def read(self) -> bytes:
        while True:
            if self._closing:
                raise ConnectionClosed("comm is closed", details={"peer": self._peer})
            if self._frames:
                frame = self._frames.popleft()
                self._queued -= len(frame)
                if self._read_paused and self._queued <= _READ_LIMIT // 2:
                    self._read_paused = False
                    if self._transport is not None:
                        self._transport.resume_reading()
                return frame
            if self._end is not None:
                err, self._end = self._end, None
                # Raised once; after that, like any closed comm.
                self._closing = True
                raise err
            if self._on_frame is not None:
                raise RuntimeError("read() on a comm whose frames go to a receiver")
            waiter = self._loop.create_future()
            self._read_waiter = waiter
            await waiter

    # --- frames out ------------------------------------------------------------------------

    def _check_writable(self, frame: bytes) -> None:
        size = len(frame)
        if size > self._max_frame:
            raise sending_too_large(self._peer, size, self._max_frame)
        if self.closed or self._transport is None or self._transport.is_closing():
            raise ConnectionClosed(
                f"connection to {self._peer} is closed", details={"peer": self._peer}
            )

    def _send(self, frame: bytes) -> None:
        transport = self._transport
        assert transport is not None
        size = len(frame)
        # ``framing.header(size)``, inlined: this runs once per frame on the loop.
        if size < _JOIN_BELOW:
            # One write call per frame: header and payload leave together (NODELAY would
            # otherwise send a 4-byte segment on its own).
            transport.write(size.to_bytes(HEADER, "big") + frame)
        else:
            transport.writelines((size.to_bytes(HEADER, "big"), frame))

    def write_nowait(self, frame: bytes) -> bool:
        """Send ``frame`` now if that needs no wait (the peer is keeping up); False leaves it
        to ``write``. Raises like ``write`` for an oversized frame or a closed comm."""
        self._check_writable(frame)
        if self._write_paused:
            return False
        self._send(frame)
        return True

    async def write(self, frame: bytes) -> None:
        self._check_writable(frame)
        while self._write_paused:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter
            if self._transport is None or self._transport.is_closing():
                raise ConnectionClosed(
                    f"connection to {self._peer} lost", details={"peer": self._peer}
                )
        self._send(frame)

    async def close(self) -> None:
        transport = self._transport
        if transport is None or (self._closing and self._lost.done()):
            self._closing = True
            return
        self._closing = True
        self._frames.clear()
        transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._lost), _CLOSE_TIMEOUT)
        except TimeoutError:
            transport.abort()

    def abort(self) -> None:
        self._closing = True
        self._frames.clear()
        if self._transport is not None:
            self._transport.abort()
        self._wake_reader()


class PlainComm(TcpComm, asyncio.Protocol):
    """A ``TcpComm`` in clear: the loop hands it each ``recv``'s bytes (``data_received``)."""


__all__ = ["PlainComm", "TcpComm", "fmt_addr"]
