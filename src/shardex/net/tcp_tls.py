"""The TCP transport under TLS: the comm the loop's TLS reads into, and the listener that
tells TLS clients from plaintext ones.

Outgoing connections go through the loop's own TLS (``create_connection(ssl=...)``, in
``tcp.py``); incoming ones through a listener of our own (``TlsListener``) that looks at each
new connection's first byte before it upgrades: a TLS ClientHello is handed to the loop's
TLS, anything else - a plaintext client, which sends nothing and waits for the server's
challenge - gets one ``ErrorReply`` frame saying the port requires TLS, and is closed. (A
listener made by ``create_server`` reads the first bytes itself; once read they cannot be
handed to TLS.) The contexts, certificates and failure messages are ``tls.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

from shardex.errors import ErrorCode, NodeUnavailable
from shardex.net.framing import header
from shardex.net.messages import Envelope, ErrorReply, Kind, encode_frame
from shardex.net.tcp_comm import TcpComm, fmt_addr
from shardex.net.tls import (
    REFUSAL_HINT,
    SNIFF_TIMEOUT,
    TLS_RECORD_HANDSHAKE,
    plaintext_refusal_message,
    tls_failure,
)
from shardex.net.transport import DEFAULT_MAX_FRAME, Listener

log = logging.getLogger(__name__)

# A TLS handshake (both ways) must complete within this; the RPC handshake has its own bound.
_TLS_HANDSHAKE_TIMEOUT = 5.0
_BACKLOG = 1024
# The buffer decrypted bytes are read into (one TLS record is at most 16 KiB).
_TLS_READ = 64 * 1024


class TlsComm(TcpComm, asyncio.BufferedProtocol):
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


class TlsListener(Listener):
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


__all__ = ["TlsComm", "TlsListener", "bind_socket"]
