"""The real transport: asyncio TCP streams carrying length-prefixed frames.

Frame = 4-byte big-endian unsigned payload length + payload. Nothing else is on the wire at
this layer; encoding, authentication and request matching live in ``shardex.net.rpc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from shardex.errors import ConnectionClosed, FrameTooLarge, NodeUnavailable
from shardex.net.transport import (
    DEFAULT_MAX_FRAME,
    Comm,
    CommHandler,
    Listener,
    Transport,
    split_address,
)

log = logging.getLogger(__name__)

_HEADER = 4
# StreamReader pauses the socket once it buffers 2 * limit bytes. The default (64 KiB) makes
# a 1 MiB frame bounce between pause and resume dozens of times; 1 MiB keeps large frames
# flowing while bounding what one connection can buffer (2 MiB).
_READ_LIMIT = 1024 * 1024
# Writes return without awaiting until this much is buffered in the kernel-side transport.
# Many small frames then coalesce into few syscalls; a slow reader still pushes back on us.
_WRITE_HIGH_WATER = 256 * 1024
# A graceful close that cannot flush within this bound (peer not reading) becomes an abort.
_CLOSE_TIMEOUT = 5.0


def _set_nodelay(writer: asyncio.StreamWriter) -> None:
    # asyncio enables TCP_NODELAY on TCP sockets already; set it explicitly because request/
    # response latency depends on it (Nagle + delayed ACK would add ~40 ms per round trip).
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _fmt_addr(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


class TcpComm(Comm):
    """One TCP connection moving whole frames."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._max_frame = max_frame
        self._closed = False
        self._local = _fmt_addr(writer.get_extra_info("sockname"))
        self._peer = _fmt_addr(writer.get_extra_info("peername"))
        _set_nodelay(writer)
        writer.transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)

    def __repr__(self) -> str:
        return f"<TcpComm {self._local} -> {self._peer}{' closed' if self.closed else ''}>"

    @property
    def closed(self) -> bool:
        return self._closed or self._writer.is_closing()

    @property
    def local_address(self) -> str:
        return self._local

    @property
    def peer_address(self) -> str:
        return self._peer

    async def read(self) -> bytes:
        if self._closed:
            raise ConnectionClosed("comm is closed", details={"peer": self._peer})
        try:
            header = await self._reader.readexactly(_HEADER)
            size = int.from_bytes(header, "big")
            if size > self._max_frame:
                log.error(
                    "peer %s announced a frame of %d bytes (max_frame %d); closing connection",
                    self._peer,
                    size,
                    self._max_frame,
                )
                self.abort()
                raise FrameTooLarge(
                    f"peer {self._peer} announced a frame of {size} bytes",
                    details={"peer": self._peer, "size": size, "max_frame": self._max_frame},
                )
            return await self._reader.readexactly(size)
        except asyncio.IncompleteReadError as e:
            self._closed = True
            raise ConnectionClosed(
                f"connection to {self._peer} closed by peer",
                details={"peer": self._peer, "partial_bytes": len(e.partial)},
            ) from None
        except (ConnectionError, OSError) as e:
            self.abort()
            raise ConnectionClosed(
                f"connection to {self._peer} lost: {e}", details={"peer": self._peer}
            ) from e

    async def write(self, frame: bytes) -> None:
        size = len(frame)
        if size > self._max_frame:
            # The caller learns at once; the peer would cut us off anyway.
            raise FrameTooLarge(
                f"frame of {size} bytes to {self._peer} exceeds max_frame {self._max_frame}",
                details={"peer": self._peer, "size": size, "max_frame": self._max_frame},
            )
        if self.closed:
            raise ConnectionClosed(
                f"connection to {self._peer} is closed", details={"peer": self._peer}
            )
        # One write call per frame: header and payload leave together (NODELAY would otherwise
        # send a 4-byte segment on its own).
        self._writer.write(size.to_bytes(_HEADER, "big") + frame)
        transport = self._writer.transport
        if transport.get_write_buffer_size() > _WRITE_HIGH_WATER:
            try:
                await self._writer.drain()
            except (ConnectionError, OSError) as e:
                self.abort()
                raise ConnectionClosed(
                    f"connection to {self._peer} lost: {e}", details={"peer": self._peer}
                ) from e

    async def close(self) -> None:
        if self._closed and self._writer.is_closing():
            return
        self._closed = True
        self._writer.close()
        try:
            await asyncio.wait_for(self._writer.wait_closed(), _CLOSE_TIMEOUT)
        except (TimeoutError, ConnectionError, OSError):
            self._writer.transport.abort()

    def abort(self) -> None:
        self._closed = True
        self._writer.transport.abort()


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
    """Frames over TCP. ``max_frame`` bounds both what we accept and what we send."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame

    async def listen(self, address: str, handler: CommHandler) -> Listener:
        host, port = split_address(address)

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            comm = TcpComm(reader, writer, self.max_frame)
            try:
                await handler(comm)
            except Exception:
                # The handler owns the comm; a crash in it must not leave a half-open socket.
                log.exception("connection handler failed for %s", comm.peer_address)
                comm.abort()

        try:
            server = await asyncio.start_server(on_client, host, port, limit=_READ_LIMIT)
        except OSError as e:
            raise NodeUnavailable(
                f"cannot listen on {address}: {e}", details={"address": address}
            ) from e
        sockname = server.sockets[0].getsockname()
        return TcpListener(server, _fmt_addr(sockname))

    async def connect(self, address: str, timeout: float) -> Comm:
        host, port = split_address(address)
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, limit=_READ_LIMIT)
        except TimeoutError:
            raise NodeUnavailable(
                f"connect to {address} timed out after {timeout}s",
                details={"address": address, "timeout": timeout},
            ) from None
        except OSError as e:
            raise NodeUnavailable(
                f"cannot connect to {address}: {e}", details={"address": address}
            ) from e
        return TcpComm(reader, writer, self.max_frame)
