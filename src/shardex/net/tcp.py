"""The real transport: length-prefixed frames over TCP, parsed in the loop's data callback.

Frame = 4-byte big-endian unsigned payload length + payload. Nothing else is on the wire at
this layer; encoding, authentication and request matching live in ``shardex.net.rpc``.

``TcpComm`` is an ``asyncio.Protocol``, not a pair of streams: every ``recv`` the loop makes
is cut into whole frames at once, in its callback. A ``Connection`` takes them there
(``set_receiver``), so a frame costs no reader-task wake-up, no ``readexactly`` coroutines and
no extra loop iteration; several frames that arrive in one ``recv`` are handled in one go.
``read()`` (the handshake, the simulator-compatible path) takes them from a queue.

With a ``TlsConfig`` (``shardex.net.tls``) every connection is TLS 1.3: outgoing ones through
the loop's own TLS (``create_connection(ssl=...)``), incoming ones through a listener of our
own (``_TlsListener``) that looks at each new connection's first byte before it upgrades: a
TLS ClientHello is handed to the loop's TLS, anything else - a plaintext client, which sends
nothing and waits for the server's challenge - gets one ``ErrorReply`` frame saying the port
requires TLS, and is closed. (A listener made by ``create_server`` reads the first bytes
itself; once read they cannot be handed to TLS.)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

from shardex.errors import AuthFailed, ConnectionClosed, ErrorCode, NodeUnavailable, ShardexError
from shardex.net.framing import HEADER, announced_too_large, header, sending_too_large
from shardex.net.messages import Envelope, ErrorReply, Kind, encode_frame
from shardex.net.tls import (
    REFUSAL_HINT,
    SNIFF_TIMEOUT,
    TLS_RECORD_HANDSHAKE,
    TlsConfig,
    cert_refused,
    peer_node_name,
    plaintext_refusal_message,
    tls_failure,
)
from shardex.net.transport import (
    DEFAULT_MAX_FRAME,
    Comm,
    CommHandler,
    EndCallback,
    FrameCallback,
    Listener,
    Transport,
    connect_failed,
    split_address,
)

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
# A TLS handshake (both ways) must complete within this; the RPC handshake has its own bound.
_TLS_HANDSHAKE_TIMEOUT = 5.0
_BACKLOG = 1024
# The buffer decrypted bytes are read into (one TLS record is at most 16 KiB).
_TLS_READ = 64 * 1024


def _fmt_addr(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


class TcpComm(Comm, asyncio.BaseProtocol):
    """One TCP connection moving whole frames; also the connection's asyncio protocol: a
    plain one (``_PlainComm``) in clear, a buffered one (``_TlsComm``) under TLS."""

    def __init__(
        self,
        max_frame: int = DEFAULT_MAX_FRAME,
        on_connected: Callable[[TcpComm], None] | None = None,
        presents_cert: bool = False,
    ) -> None:
        self._max_frame = max_frame
        # An outgoing TLS comm that presented our certificate, and whether any byte came in:
        # a TLS 1.3 server checks a client's certificate after the client's handshake is
        # done, and our loops drop its alert, so a close before its first byte is the only
        # sign that it refused the certificate.
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
        # uvloop's transports are not asyncio.Transport subclasses; both have its methods.
        self._transport = transport  # type: ignore[assignment]
        self._local = _fmt_addr(transport.get_extra_info("sockname"))
        self._peer = _fmt_addr(transport.get_extra_info("peername"))
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Loops enable TCP_NODELAY already; set it explicitly because request/response
            # latency depends on it (Nagle + delayed ACK would add ~40 ms per round trip).
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        # A TLS transport calls this once its handshake is done: the peer's certificate,
        # if it presented one, has been verified against the cluster CA.
        if transport.get_extra_info("sslcontext") is not None:
            self._encrypted = True
            self._peer_node = peer_node_name(transport.get_extra_info("peercert"))
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


class _PlainComm(TcpComm, asyncio.Protocol):
    """A ``TcpComm`` in clear: the loop hands it each ``recv``'s bytes (``data_received``)."""


class _TlsComm(TcpComm, asyncio.BufferedProtocol):
    """A ``TcpComm`` under the loop's TLS. As a buffered protocol it gets the decrypted bytes
    read into a buffer of its own: as a plain one, uvloop's TLS would allocate a 256 KiB
    ``bytes`` per read, most of a small request's TLS cost. It must not be an
    ``asyncio.Protocol`` too: uvloop takes any ``asyncio.Protocol`` for a plain one, even
    with ``get_buffer`` (hence no such base on ``TcpComm``)."""

    def __init__(
        self,
        max_frame: int = DEFAULT_MAX_FRAME,
        on_connected: Callable[[TcpComm], None] | None = None,
        presents_cert: bool = False,
    ) -> None:
        super().__init__(max_frame, on_connected, presents_cert)
        self._rbuf = memoryview(bytearray(_TLS_READ))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._rbuf

    def buffer_updated(self, nbytes: int) -> None:
        # ``data_received`` keeps nothing of what it is given without copying it (frames are
        # cut into bytes, a partial one appended to the comm's buffer): the view may be
        # reused by the next read.
        self.data_received(self._rbuf[:nbytes])  # type: ignore[arg-type]


class TcpListener(Listener):
    def __init__(self, server: asyncio.Server, address: str) -> None:
        self._server = server
        self._address = address

    @property
    def address(self) -> str:
        return self._address

    async def stop(self) -> None:
        self._server.close()
        # 3.11's wait_closed returns once the listening socket is closed (it does not wait
        # for accepted connections, which their owners close).
        await self._server.wait_closed()


class _TlsListener(Listener):
    """Accepts connections itself, sniffs each one's first byte, upgrades TLS clients with
    the loop's TLS and refuses plaintext ones with a frame they can read."""

    def __init__(
        self,
        sock: socket.socket,
        ctx: ssl.SSLContext,
        factory: Callable[[], TcpComm],
        tasks: set[asyncio.Task[None]],
    ) -> None:
        self._sock = sock
        self._ctx = ctx
        self._factory = factory
        self._tasks = tasks  # the serving tasks' set, shared with the transport's handler
        self._loop = asyncio.get_running_loop()
        self._address = _fmt_addr(sock.getsockname())
        self._admitting: set[asyncio.Task[None]] = set()
        self._accepting = self._loop.create_task(self._accept(), name=f"shardex-accept {self}")

    def __repr__(self) -> str:
        return f"<TLS listener {self._address}>"

    @property
    def address(self) -> str:
        return self._address

    async def _accept(self) -> None:
        while True:
            try:
                sock, _ = await self._loop.sock_accept(self._sock)
            except OSError as e:  # out of descriptors, a connection reset before accept...
                if self._sock.fileno() < 0:
                    return
                log.warning("accept on %s failed: %s", self._address, e)
                continue
            task = self._loop.create_task(self._admit(sock))
            self._admitting.add(task)
            task.add_done_callback(self._admitting.discard)

    async def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        try:
            peer = _fmt_addr(sock.getpeername())
            first = await self._first_byte(sock)
        except OSError:
            sock.close()  # gone before we looked
            return
        if first is None:
            sock.close()  # connected and hung up without a byte
            return
        if first != TLS_RECORD_HANDSHAKE:
            self._refuse(sock, peer)
            return
        try:
            await self._loop.connect_accepted_socket(
                self._factory, sock, ssl=self._ctx, ssl_handshake_timeout=_TLS_HANDSHAKE_TIMEOUT
            )
        except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
            failure = tls_failure(peer, e)
            reason = failure.message if failure is not None else (str(e) or type(e).__name__)
            # The client's certificate did not verify (wrong CA, expired), or it gave up.
            log.warning("TLS handshake with %s failed: %s", peer, reason)
            with contextlib.suppress(OSError):
                sock.close()

    async def _first_byte(self, sock: socket.socket) -> int | None:
        """The first byte the peer sent (peeked: it stays for TLS to read), -1 if it sent
        nothing within ``SNIFF_TIMEOUT``, None if it closed the connection."""
        fd = sock.fileno()
        ready = self._loop.create_future()
        self._loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await asyncio.wait_for(ready, SNIFF_TIMEOUT)
        except TimeoutError:
            return -1
        finally:
            self._loop.remove_reader(fd)
        try:
            data = sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return -1
        return data[0] if data else None

    def _refuse(self, sock: socket.socket, peer: str) -> None:
        log.warning("refused a plaintext connection from %s: this port requires TLS", peer)
        notice = ErrorReply(
            code=ErrorCode.AUTH_FAILED.value,
            message=plaintext_refusal_message(self._address),
            details={"address": self._address, "hint": REFUSAL_HINT},
        )
        frame = encode_frame(Envelope(Kind.ERROR, 0, notice))
        with contextlib.suppress(OSError):
            # Whatever the peer sent is read first: closing with unread bytes would reset the
            # connection, and a reset may discard our frame before the peer reads it.
            with contextlib.suppress(BlockingIOError):
                sock.recv(64 * 1024)
            sock.send(header(len(frame)) + frame)  # small: the socket buffer takes it whole
            sock.shutdown(socket.SHUT_WR)
        sock.close()

    async def stop(self) -> None:
        self._accepting.cancel()
        await asyncio.gather(self._accepting, return_exceptions=True)
        self._sock.close()
        for task in list(self._admitting):
            task.cancel()
        await asyncio.gather(*self._admitting, return_exceptions=True)


class TcpTransport(Transport):
    """Frames over TCP. ``max_frame`` bounds both what we accept and what we send; ``tls``
    (``shardex.net.tls.TlsConfig``): every connection, both ways, over TLS 1.3."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME, tls: TlsConfig | None = None) -> None:
        self.max_frame = max_frame
        self.tls = tls

    async def listen(self, address: str, handler: CommHandler) -> Listener:
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        # Handler tasks must be referenced until they finish (the loop keeps weak ones only).
        running: set[asyncio.Task[None]] = set()

        async def serve(comm: TcpComm) -> None:
            try:
                await handler(comm)
            except Exception:
                # The handler owns the comm; a crash in it must not leave a half-open socket.
                log.exception("connection handler failed for %s", comm.peer_address)
                comm.abort()

        def on_connected(comm: TcpComm) -> None:
            task = loop.create_task(serve(comm))
            running.add(task)
            task.add_done_callback(running.discard)

        def factory() -> TcpComm:
            return _PlainComm(self.max_frame, on_connected)

        def tls_factory() -> TcpComm:
            return _TlsComm(self.max_frame, on_connected)

        if self.tls is not None:
            ctx = self.tls.server_context()  # a missing certificate: a ConfigError now
            sock = await _bind(loop, host, port, address)
            return _TlsListener(sock, ctx, tls_factory, running)
        try:
            server = await loop.create_server(factory, host, port)
        except OSError as e:
            raise NodeUnavailable(
                f"cannot listen on {address}: {e}", details={"address": address}
            ) from e
        sockname = server.sockets[0].getsockname()
        return TcpListener(server, _fmt_addr(sockname))

    async def connect(self, address: str, timeout: float) -> Comm:
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        tls = self.tls
        try:
            async with asyncio.timeout(timeout):
                if tls is None:
                    _, comm = await loop.create_connection(
                        lambda: _PlainComm(self.max_frame), host, port
                    )
                else:
                    _, comm = await loop.create_connection(
                        lambda: _TlsComm(self.max_frame, presents_cert=tls.is_node),
                        host,
                        port,
                        ssl=tls.client_context(),
                        server_hostname=host,  # checked against the certificate's SANs
                        ssl_handshake_timeout=timeout,
                    )
        except OSError as e:  # refused, unreachable, timed out (TimeoutError), TLS failed
            failure = tls_failure(address, e) if tls is not None else None
            if failure is not None:
                raise failure from e
            raise connect_failed(address, timeout, e) from e
        return comm


async def _bind(
    loop: asyncio.AbstractEventLoop, host: str, port: int, address: str
) -> socket.socket:
    """A listening, non-blocking socket on ``host:port`` (its first address)."""
    try:
        infos = await loop.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, _, _, _, sockaddr = infos[0]
        sock = socket.create_server(sockaddr[:2], family=family, backlog=_BACKLOG)
    except OSError as e:
        raise NodeUnavailable(
            f"cannot listen on {address}: {e}", details={"address": address}
        ) from e
    sock.setblocking(False)
    return sock


__all__ = ["TcpComm", "TcpListener", "TcpTransport"]
