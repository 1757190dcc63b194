"""The TCP transport under TLS: the comm that carries frames over TLS, and the listener that
tells TLS clients from plaintext ones.

Every TLS connection is a ``TlsMemoryComm``: TLS run in memory (an ``ssl.SSLObject``
between two ``MemoryBIO``s, as the blocking client does) over the loop's plain TCP
transport, not through the loop's TLS transport, whose layer adds half again to OpenSSL's
own work per request and reply (after each record it tries another read, which fails with
an exception raised through ``ssl.SSLObject``; a write passes a backlog, flow-control and
state checks before it reaches OpenSSL); see
docs/decisions/0114-tls-in-memory-on-the-server-side.md. Outgoing connections
(``tcp.py``) start their handshake once connected. Incoming ones go through a listener of
our own (``TlsListener``) that looks at each new connection's first byte: a TLS ClientHello
is handed to a ``TlsMemoryComm``, anything else - a plaintext client, which sends nothing
and waits for the server's challenge - gets one ``ErrorReply`` frame saying the port
requires TLS, and is closed. (A listener made by ``create_server`` reads the first bytes
itself; once read they cannot be handed to TLS.) The contexts, certificates and failure
messages are ``tls.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

from shardex.errors import AuthFailed, ConnectionClosed, ErrorCode, NodeUnavailable
from shardex.net.framing import HEADER, header
from shardex.net.messages import Envelope, ErrorReply, Kind, encode_frame
from shardex.net.tcp_comm import TcpComm, fmt_addr
from shardex.net.tls import (
    REFUSAL_HINT,
    SNIFF_TIMEOUT,
    TLS_RECORD_HANDSHAKE,
    peer_node_name,
    plaintext_refusal_message,
    records,
    tls_failure,
)
from shardex.net.transport import Listener

log = logging.getLogger(__name__)

# A TLS handshake (both ways) must complete within this; the RPC handshake has its own bound.
_TLS_HANDSHAKE_TIMEOUT = 5.0
_BACKLOG = 1024
# Frames this small are encrypted with their header, as one record (``TcpComm._send``).
_JOIN_BELOW = 64 * 1024
# The most a TLS record's payload holds (TLS 1.3: 2^14 bytes).
_TLS_RECORD = 16 * 1024


class TlsMemoryComm(TcpComm, asyncio.Protocol):
    """A ``TcpComm`` with TLS run here, in memory, over the loop's plain transport, on
    either side of a connection: the records received (``data_received``: the loop's
    ``bytes`` of each read cost less than a ``get_buffer`` call and a view) are fed to the
    TLS object, what each record decrypts to is cut into frames; a frame sent is encrypted
    (header and body as one record) and its records go out in one transport write.

    An accepted connection's comm (``server_hostname`` None) answers the client's
    handshake as its records arrive; a dialled one (``server_hostname``: the name the
    server's certificate must carry) sends its ClientHello once connected. ``handshake``
    gets the outcome, and the comm is connected (``on_connected``, ``peer_node``) only once
    it succeeded."""

    def __init__(
        self,
        max_frame: int,
        on_connected: Callable[[TcpComm], None] | None,
        ctx: ssl.SSLContext,
        handshake: asyncio.Future[None],
        *,
        server_hostname: str | None = None,
        presents_cert: bool = False,
    ) -> None:
        super().__init__(max_frame, on_connected, presents_cert)
        self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._client = server_hostname is not None
        self._tls = ctx.wrap_bio(
            self._tls_in,
            self._tls_out,
            server_side=not self._client,
            server_hostname=server_hostname,
        )
        self._handshake: asyncio.Future[None] | None = handshake  # None once done
        self._records = self._tls  # ``tls.records`` of it once the handshake is done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._attach(transport)  # connected when the handshake is done
        if self._client:
            self._shake()  # our ClientHello

    def data_received(self, data: bytes) -> None:
        tls_in = self._tls_in
        tls_in.write(data)
        if self._handshake is not None and not self._shake():
            return
        # Record by record: a read returns one record's bytes (``bytes`` of their size:
        # cheaper than a view of a buffer of ours, which the frame cutter would slice as
        # views again). Nothing decrypted is left in the TLS object after a read of a
        # whole record's size, so a read is due only while bytes wait in ``tls_in`` (a
        # read that finds no whole record raises, which costs more).
        tls = self._records
        while True:
            try:
                plain = tls.read(_TLS_RECORD)
            except ssl.SSLWantReadError:
                break  # the rest of a record is still on its way
            except ssl.SSLError as e:  # a record that does not decrypt, an alert
                self._broken(e)
                return
            if not plain:  # the client's close_notify: the end of the stream
                if self.eof_received() is None and self._transport is not None:
                    self._transport.close()
                return
            TcpComm.data_received(self, plain)
            if not tls_in.pending or self._end is not None or self._closing:
                break
        if self._tls_out.pending:  # a key update's answer
            self._flush()

    def _shake(self) -> bool:
        """Take the handshake as far as the records received allow; True once done."""
        handshake = self._handshake
        assert handshake is not None
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return False
        except ssl.SSLError as e:  # a client certificate that does not verify, not TLS...
            self._flush()  # our alert, if any
            self._handshake = None
            if not handshake.done():
                handshake.set_exception(e)
            return False
        self._flush()
        self._handshake = None
        self._records = records(self._tls)
        self._connected(peer_node_name(self._tls.getpeercert()))
        if not handshake.done():
            handshake.set_result(None)
        return True

    def _broken(self, exc: ssl.SSLError) -> None:
        """The session failed (a record that does not decrypt, an alert): the stream ends
        as a lost connection does on the loop's TLS. A server's alert before its first
        frame, after we presented a certificate, is its refusal of that certificate (TLS
        1.3 checks it after the client's side of the handshake)."""
        refused = self._refused_cert() or tls_failure(self._peer, exc)
        self._ended(
            refused
            if isinstance(refused, AuthFailed)
            else ConnectionClosed(
                f"connection to {self._peer} lost: {exc}", details={"peer": self._peer}
            )
        )
        if self._transport is not None:
            self._transport.abort()

    def _flush(self) -> None:
        if self._tls_out.pending and self._transport is not None:
            self._transport.write(self._tls_out.read())

    def _send(self, frame: bytes) -> None:
        size = len(frame)
        tls = self._records
        try:
            if size < _JOIN_BELOW:
                tls.write(size.to_bytes(HEADER, "big") + frame)
            else:  # no copy of a large body
                tls.write(size.to_bytes(HEADER, "big"))
                tls.write(frame)
        except ssl.SSLError as e:
            self._broken(e)
            raise ConnectionClosed(
                f"connection to {self._peer} lost: {e}", details={"peer": self._peer}
            ) from None
        transport = self._transport
        assert transport is not None
        transport.write(self._tls_out.read())

    def connection_lost(self, exc: Exception | None) -> None:
        handshake, self._handshake = self._handshake, None
        if handshake is not None and not handshake.done():
            handshake.set_exception(exc or ConnectionResetError("closed during the TLS handshake"))
        super().connection_lost(exc)

    async def close(self) -> None:
        transport = self._transport
        if (
            not self.closed
            and self._handshake is None
            and transport is not None
            and not transport.is_closing()
        ):
            # A close_notify first, as the loop's TLS sends one: the peer tells our close
            # from a connection cut in transit.
            with contextlib.suppress(ssl.SSLError):
                self._tls.unwrap()  # writes it, then wants the peer's: SSLWantReadError
            self._flush()
        await super().close()


class TlsListener(Listener):
    """Accepts connections itself, sniffs each one's first byte, serves TLS clients with a
    ``TlsMemoryComm`` (handed to ``on_connected`` once its handshake is done) and refuses
    plaintext ones with a frame they can read."""

    def __init__(
        self,
        sock: socket.socket,
        ctx: ssl.SSLContext,
        max_frame: int,
        on_connected: Callable[[TcpComm], None],
        tasks: set[asyncio.Task[None]],
    ) -> None:
        self._sock = sock
        self._ctx = ctx
        self._max_frame = max_frame
        self._on_connected = on_connected
        self._tasks = tasks  # the serving tasks' set, shared with the transport's handler
        self._loop = asyncio.get_running_loop()
        self._address = fmt_addr(sock.getsockname())
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
            peer = fmt_addr(sock.getpeername())
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
        handshake: asyncio.Future[None] = self._loop.create_future()
        transport: asyncio.BaseTransport | None = None
        try:
            transport, _ = await self._loop.connect_accepted_socket(
                lambda: TlsMemoryComm(self._max_frame, self._on_connected, self._ctx, handshake),
                sock,
            )
            await asyncio.wait_for(handshake, _TLS_HANDSHAKE_TIMEOUT)
        except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
            failure = tls_failure(peer, e)
            reason = failure.message if failure is not None else (str(e) or type(e).__name__)
            # The client's certificate did not verify (wrong CA, expired), or it gave up.
            log.warning("TLS handshake with %s failed: %s", peer, reason)
            if transport is not None:
                transport.close()  # after our alert, if the handshake wrote one
            else:
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


async def bind_socket(
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


__all__ = ["TlsListener", "TlsMemoryComm", "bind_socket"]
