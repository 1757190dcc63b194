"""``SimTransport``: the ``Transport`` seam over a ``SimNetwork``.

Addresses look like real ones (``host:port``) so service code and configs need no change; the
host part names a simulated host. A connect costs a simulated round trip, is refused by a host
with no listener, waits at a partition (SYN retransmission) and hangs on a powered-off host,
each ending in ``NodeUnavailable`` like ``TcpTransport``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import TYPE_CHECKING

from shardex.errors import NodeUnavailable
from shardex.net.transport import DEFAULT_MAX_FRAME, Comm, CommHandler, Listener, Transport
from shardex.net.transport import split_address as _split
from shardex.sim.comm import SimComm, SimConnection
from shardex.sim.loop import current_host

if TYPE_CHECKING:  # the network builds transports (SimNetwork.transport), not the reverse
    from shardex.sim.network import SimNetwork

log = logging.getLogger(__name__)

_ANY_HOST = ("0.0.0.0", "::", "localhost")


class SimListener(Listener):
    def __init__(
        self,
        transport: SimTransport,
        address: str,
        handler: CommHandler,
        context: contextvars.Context,
    ) -> None:
        self.transport = transport
        self.host = transport.host
        self._address = address
        self._handler = handler
        # The context listen() ran in: handlers run in the server's context, not the client's.
        self._context = context

    def __repr__(self) -> str:
        return f"<SimListener {self._address}>"

    @property
    def address(self) -> str:
        return self._address

    async def stop(self) -> None:
        net = self.transport.network
        if net.listeners.get(self._address) is self:
            del net.listeners[self._address]
            net.record("unlisten", self._address)

    def spawn(self, comm: SimComm) -> None:
        ctx = self._context.copy()
        ctx.run(current_host.set, self.host)
        # Tagged with the server's host: crashing it cancels the handler.
        self.transport.network.loop.create_task(self._serve(comm), context=ctx)

    async def _serve(self, comm: SimComm) -> None:
        try:
            await self._handler(comm)
        except Exception:
            # Same policy as TcpTransport: a crashing handler must not leave a half-open comm.
            log.exception("connection handler failed for %s", comm.peer_address)
            comm.abort()


class SimTransport(Transport):
    """The transport of one simulated host."""

    def __init__(self, network: SimNetwork, host: str, max_frame: int | None = None) -> None:
        if ":" in host or not host:
            raise ValueError(f"simulated host names are plain names, got {host!r}")
        self.network = network
        self.host = host
        self.max_frame = DEFAULT_MAX_FRAME if max_frame is None else max_frame

    def __repr__(self) -> str:
        return f"<SimTransport {self.host}>"

    def address(self, port: int) -> str:
        return f"{self.host}:{port}"

    def nonce(self, size: int) -> bytes:
        # Seeded, so authentication transcripts (and every frame after them) replay exactly.
        return self.network.rng.randbytes(size)

    async def listen(self, address: str, handler: CommHandler) -> Listener:
        net = self.network
        host, port = _split(address)
        if host != self.host and host not in _ANY_HOST:
            raise NodeUnavailable(
                f"cannot listen on {address}: not an address of host {self.host}",
                details={"address": address, "host": self.host},
            )
        if not net.is_up(self.host):
            raise NodeUnavailable(f"cannot listen on {address}: host {self.host} is down")
        if port == 0:
            port = net.allocate_port(self.host)
        bound = f"{self.host}:{port}"
        if bound in net.listeners:
            raise NodeUnavailable(
                f"cannot listen on {bound}: address in use", details={"address": bound}
            )
        listener = SimListener(self, bound, handler, contextvars.copy_context())
        net.listeners[bound] = listener
        net.record("listen", bound)
        return listener

    async def connect(self, address: str, timeout: float) -> Comm:
        net = self.network
        dst_host, _ = _split(address)
        if not net.is_up(self.host):
            raise NodeUnavailable(f"host {self.host} is down", details={"address": address})
        made: list[SimConnection] = []
        try:
            async with asyncio.timeout(timeout):
                return await self._handshake(address, dst_host, made)
        except TimeoutError:
            net.record("timeout", f"{self.host}->{address} connect after {timeout}s")
            for conn in made:
                # The server may have accepted already; its end must not linger half-open.
                conn.reset("connect timed out")
            raise NodeUnavailable(
                f"connect to {address} timed out after {timeout}s",
                details={"address": address, "timeout": timeout},
            ) from None

    async def _handshake(self, address: str, dst_host: str, made: list[SimConnection]) -> SimComm:
        net = self.network
        net.record("connect", f"{self.host}->{address}")
        while True:
            await net.wait_link(self.host, dst_host)
            await asyncio.sleep(net.draw_latency())
            if not net.is_cut(self.host, dst_host):
                break
            # The SYN died at a cut that appeared meanwhile: retransmitted after the heal.
        if net.is_powered_off(dst_host):
            # Nobody answers a SYN to a dead machine: only the timeout ends this.
            await net.loop.create_future()
        listener = net.listeners.get(address)
        refused = net.chance(net.config.connect_fail_rate)
        if listener is None or refused or not isinstance(listener, SimListener):
            await asyncio.sleep(net.draw_latency())
            why = "injected fault" if listener is not None else "no listener"
            net.record("refuse", f"{self.host}->{address} ({why})")
            raise NodeUnavailable(
                f"cannot connect to {address}: connection refused",
                details={"address": address},
            )
        port = net.allocate_port(self.host)
        conn = net.new_connection(
            (self.host, f"{self.host}:{port}", self.max_frame),
            (dst_host, address, listener.transport.max_frame),
        )
        made.append(conn)
        net.record("accept", f"c{conn.id} {self.host}:{port}->{address}")
        listener.spawn(conn.server)
        await asyncio.sleep(net.draw_latency())  # the SYN-ACK travels back
        return conn.client
