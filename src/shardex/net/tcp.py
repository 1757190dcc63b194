"""The real transport: length-prefixed frames over TCP, parsed in the loop's data callback.

Frame = 4-byte big-endian unsigned payload length + payload. Nothing else is on the wire at
this layer; encoding, authentication and request matching live in ``shardex.net.rpc``.

``TcpTransport`` listens and dials; each connection is a ``TcpComm`` (``tcp_comm.py``), the
asyncio protocol that cuts frames in the loop's callback. With a ``TlsConfig``
(``shardex.net.tls``) every connection is TLS 1.3, run in memory by its comm over a plain
transport: outgoing ones from their first byte, incoming ones through a listener that
refuses plaintext clients with a frame they can read (``tcp_tls.py``).
"""

from __future__ import annotations

import asyncio
import logging

from shardex.errors import NodeUnavailable
from shardex.net.tcp_comm import PlainComm, TcpComm, fmt_addr
from shardex.net.tcp_tls import TlsListener, TlsMemoryComm, bind_socket
from shardex.net.tls import TlsConfig, tls_failure
from shardex.net.transport import (
    DEFAULT_MAX_FRAME,
    Comm,
    CommHandler,
    Listener,
    Transport,
    connect_failed,
    split_address,
)

log = logging.getLogger(__name__)


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
            return PlainComm(self.max_frame, on_connected)

        if self.tls is not None:
            ctx = self.tls.server_context()  # a missing certificate: a ConfigError now
            sock = await bind_socket(loop, host, port, address)
            return TlsListener(sock, ctx, self.max_frame, on_connected, running)
        try:
            server = await loop.create_server(factory, host, port)
        except OSError as e:
            raise NodeUnavailable(
                f"cannot listen on {address}: {e}", details={"address": address}
            ) from e
        sockname = server.sockets[0].getsockname()
        return TcpListener(server, fmt_addr(sockname))

    async def connect(self, address: str, timeout: float) -> Comm:
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        tls = self.tls
        try:
            async with asyncio.timeout(timeout):
                if tls is None:
                    _, comm = await loop.create_connection(
                        lambda: PlainComm(self.max_frame), host, port
                    )
                else:
                    comm = await self._connect_tls(tls, host, port)
        except OSError as e:  # refused, unreachable, timed out (TimeoutError), TLS failed
            failure = tls_failure(address, e) if tls is not None else None
            if failure is not None:
                raise failure from e
            raise connect_failed(address, timeout, e) from e
        return comm

    async def _connect_tls(self, tls: TlsConfig, host: str, port: int) -> TcpComm:
        """A connection to ``host:port`` with TLS run in memory by its comm, as the nodes
        run their accepted ones (``tcp_tls.TlsMemoryComm``), once the handshake is done;
        its failure (a certificate that does not verify, a peer not speaking TLS) raised
        as ``ssl`` raises it. Cheaper per record than the loop's TLS, which after each
        record tries another read that fails through ``ssl.SSLObject`` and passes every
        write through its backlog."""
        loop = asyncio.get_running_loop()
        ctx = tls.client_context()
        handshake: asyncio.Future[None] = loop.create_future()
        transport, comm = await loop.create_connection(
            lambda: TlsMemoryComm(
                self.max_frame,
                None,
                ctx,
                handshake,
                server_hostname=host,  # checked against the certificate's SANs
                presents_cert=tls.is_node,
            ),
            host,
            port,
        )
        try:
            await handshake
        except BaseException:
            transport.close()  # after our alert, if the handshake wrote one
            raise
        return comm


__all__ = ["TcpComm", "TcpListener", "TcpTransport"]
