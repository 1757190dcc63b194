"""The transport seam: services never know whether bytes cross real TCP or the simulator.

Modelled on the Comm/Listener/Connector split of Dask ``distributed``: a ``Transport`` opens
listeners and outgoing connections; a ``Comm`` moves whole frames (``bytes``) in order, or
fails. Framing, the frame-size limit and the byte stream are the backend's business; message
encoding, authentication and request/response live above, in ``shardex.net.rpc``, so they run
identically over ``TcpTransport`` and ``shardex.sim.SimTransport``.

Time comes from the running asyncio loop (``loop.time()``, ``asyncio.sleep``,
``asyncio.wait_for``): under simulation the loop itself runs on virtual time, so the same
service code is the clock's client in both modes.
"""

from __future__ import annotations

import abc
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardex.errors import ShardexError

# The largest frame either side accepts; a peer that announces more is cut off.
DEFAULT_MAX_FRAME = 64 * 1024 * 1024


FrameCallback = Callable[[bytes], None]
EndCallback = Callable[["ShardexError"], None]


class Comm(abc.ABC):
    """One bidirectional, ordered, framed connection."""

    def set_receiver(self, on_frame: FrameCallback, on_end: EndCallback) -> bool:
        """Push mode, optional: hand every later frame to ``on_frame`` as it arrives (in the
        loop's data callback, no task in between) and the stream's end to ``on_end``, once,
        with the error ``read`` would raise. True if the comm does so (``read`` must not be
        called any more); False (the default) leaves the caller to ``read``."""
        return False

    def write_nowait(self, frame: bytes) -> bool:
        """Send ``frame`` at once if that needs no wait; False (the default, or a peer that
        is not keeping up) leaves it to ``write``. Raises as ``write`` does."""
        return False

    @abc.abstractmethod
    async def read(self) -> bytes:
        """Next whole frame. Raises ``ConnectionClosed`` at EOF/reset, ``FrameTooLarge`` if the
        peer announces a frame over the limit (the comm is then closed)."""

    @abc.abstractmethod
    async def write(self, frame: bytes) -> None:
        """Send one whole frame. Raises ``ConnectionClosed`` if the comm is gone."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush and close gracefully; idempotent."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Close at once without flushing; idempotent, safe from any callback."""

    @property
    def peer_node(self) -> str | None:
        """The node name the peer proved with a certificate (TLS, verified against the
        cluster CA, carrying the node marker: ``shardex.net.tls``), else None: no TLS, no
        certificate, or a certificate that names no node. Authentication reads it to tell
        nodes from users."""
        return None

    @property
    def encrypted(self) -> bool:
        """Whether the bytes of this comm cross the network encrypted (TLS)."""
        return False

    @property
    @abc.abstractmethod
    def closed(self) -> bool: ...

    @property
    @abc.abstractmethod
    def local_address(self) -> str: ...

    @property
    @abc.abstractmethod
    def peer_address(self) -> str: ...


CommHandler = Callable[[Comm], Awaitable[None]]


class Listener(abc.ABC):
    @property
    @abc.abstractmethod
    def address(self) -> str:
        """``host:port`` actually bound (port 0 resolves to the real port)."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop accepting; existing comms are closed by their owners."""


class Transport(abc.ABC):
    """Factory of listeners and outgoing comms for one address family."""

    max_frame: int = DEFAULT_MAX_FRAME

    @abc.abstractmethod
    async def listen(self, address: str, handler: CommHandler) -> Listener:
        """Accept connections on ``address`` (``host:port``); run ``handler(comm)`` for each."""

    @abc.abstractmethod
    async def connect(self, address: str, timeout: float) -> Comm:
        """Open a comm to ``address``; raises ``NodeUnavailable`` if it cannot within timeout."""

    def nonce(self, size: int) -> bytes:
        """Random bytes for authentication nonces. The transport supplies them so that the
        simulator can draw them from its seeded generator: a run then replays byte for byte."""
        return secrets.token_bytes(size)


def split_address(address: str) -> tuple[str, int]:
    """``"127.0.0.1:7000"`` -> ``("127.0.0.1", 7000)`` with a clear error for anything else."""
    from shardex.errors import ConfigError

    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"bad address {address!r}",
            details={"value": address, "hint": "expected host:port, e.g. 127.0.0.1:7000"},
        )
    return host, int(port)


def connect_failed(address: str, timeout: float, exc: OSError) -> ShardexError:
    """The ``NodeUnavailable`` for a TCP connect that timed out or was refused (the loop's
    transport and the sync client's scan sockets say the same)."""
    from shardex.errors import NodeUnavailable

    if isinstance(exc, TimeoutError):
        return NodeUnavailable(
            f"connect to {address} timed out after {timeout}s",
            details={"address": address, "timeout": timeout},
        )
    return NodeUnavailable(f"cannot connect to {address}: {exc}", details={"address": address})
