"""Simulated connections: both ends of a comm and the two one-way pipes between them.

A pipe carries packets (data frames and the FIN/RST control packets) in order, each due at a
virtual time drawn from the network's RNG and never earlier than the packet before it: frames
on one comm stay in order, like TCP, while packets on different comms interleave freely. One
timer per pipe (rather than one per packet) keeps the order exact even when two packets are due
at the same instant, since the loop's timer heap is not stable.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from typing import TYPE_CHECKING, NamedTuple

from shardex.errors import ConnectionClosed, FrameTooLarge
from shardex.net.transport import Comm

if TYPE_CHECKING:
    from shardex.sim.network import SimNetwork


class Packet(enum.Enum):
    DATA = "data"
    FIN = "fin"  # graceful close: the peer reads what is buffered, then ConnectionClosed
    RST = "rst"  # abort / crash: the peer sees ConnectionClosed at once, buffer discarded


class State(enum.Enum):
    OPEN = "open"
    EOF = "eof"  # the peer closed gracefully; buffered frames are still readable
    CLOSED = "closed"  # closed or aborted here (or the host crashed)
    RESET = "reset"  # the connection broke (drop, RST, partition timeout)


class _InFlight(NamedTuple):
    due: float
    kind: Packet
    frame: bytes


class Pipe:
    """One direction of one connection."""

    def __init__(self, net: SimNetwork, conn: SimConnection, src: SimComm, dst: SimComm) -> None:
        self.net = net
        self.conn = conn
        self.src = src
        self.dst = dst
        self.queue: deque[_InFlight] = deque()
        self.bytes = 0
        self._last_due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.blocked = False
        self.block_gen = 0

    @property
    def label(self) -> str:
        return f"c{self.conn.id} {self.src.host}->{self.dst.host}"

    def send(self, kind: Packet, frame: bytes = b"") -> None:
        loop = self.net.loop
        due = max(loop.time() + self.net.draw_latency(), self._last_due)
        self._last_due = due
        self.queue.append(_InFlight(due, kind, frame))
        self.bytes += len(frame)
        if kind is Packet.DATA:
            self.net.record("send", f"{self.label} {self.net.describe_frame(frame)}")
        if self._timer is None and not self.blocked:
            self._timer = loop.call_at(self.queue[0].due, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self.net.loop.time()
        while self.queue and self.queue[0].due <= now:
            if self.net.is_cut(self.src.host, self.dst.host):
                # Held at the cut, in order, until heal() or the partition timeout.
                self.net.block(self)
                return
            packet = self.queue.popleft()
            self.bytes -= len(packet.frame)
            self._wake_writers()
            self.net.arrive(self, packet.kind, packet.frame)
            if self.conn.retired:
                return
        if self.queue:
            self.reschedule()
        else:
            self.conn.maybe_retire()

    def reschedule(self, at: float | None = None) -> None:
        if self._timer is not None or not self.queue or self.blocked:
            return
        due = self.queue[0].due if at is None else max(at, self.queue[0].due)
        self._timer = self.net.loop.call_at(due, self._on_timer)

    def clear(self) -> None:
        """Forget everything in flight (the connection broke or the sender died)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.queue.clear()
        self.bytes = 0
        self.blocked = False
        self.net.unblock(self)
        self._wake_writers(force=True)

    async def wait_drained(self) -> None:
        fut = self.net.loop.create_future()
        self._drain_waiters.append(fut)
        await fut

    def _wake_writers(self, force: bool = False) -> None:
        # Writers resume once the pipe is half empty (hysteresis avoids waking on every frame).
        if self._drain_waiters and (force or self.bytes <= self.net.config.send_buffer // 2):
            waiters, self._drain_waiters = self._drain_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)


class SimConnection:
    """A connection between a client end and a server end."""

    def __init__(
        self,
        net: SimNetwork,
        conn_id: int,
        client: tuple[str, str, int],
        server: tuple[str, str, int],
    ) -> None:
        self.id = conn_id
        self.net = net
        self.retired = False
        c_host, c_addr, c_max = client
        s_host, s_addr, s_max = server
        self.client = SimComm(self, c_host, c_addr, s_addr, c_max)
        self.server = SimComm(self, s_host, s_addr, c_addr, s_max)
        self.client.out = Pipe(net, self, self.client, self.server)
        self.server.out = Pipe(net, self, self.server, self.client)

    def ends(self) -> tuple[SimComm, SimComm]:
        return (self.client, self.server)

    def reset(self, reason: str) -> None:
        """Break the connection: both ends see ConnectionClosed, nothing more is delivered."""
        if self.retired:
            return
        self.net.record("reset", f"c{self.id} {reason}")
        for end in self.ends():
            end.out.clear()
            if end.state in (State.OPEN, State.EOF):
                end.fail(State.RESET)
        self.retire()

    def maybe_retire(self) -> None:
        if all(e.state in (State.CLOSED, State.RESET) and not e.out.queue for e in self.ends()):
            self.retire()

    def retire(self) -> None:
        if not self.retired:
            self.retired = True
            self.net.forget(self)


class SimComm(Comm):
    """One end of a simulated connection; same contract as ``TcpComm``."""

    out: Pipe

    def __init__(
        self, conn: SimConnection, host: str, local: str, peer: str, max_frame: int
    ) -> None:
        self.conn = conn
        self.host = host
        self._local = local
        self._peer = peer
        self._max_frame = max_frame
        self.state = State.OPEN
        self._inbox: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._pending_error: Exception | None = None

    def __repr__(self) -> str:
        return f"<SimComm c{self.conn.id} {self._local} -> {self._peer} {self.state.value}>"

    @property
    def closed(self) -> bool:
        return self.state in (State.CLOSED, State.RESET)

    @property
    def local_address(self) -> str:
        return self._local

    @property
    def peer_address(self) -> str:
        return self._peer

    def _closed_error(self) -> ConnectionClosed:
        what = {
            State.RESET: "was reset",
            State.CLOSED: "is closed",
            State.EOF: "was closed by the peer",
        }.get(self.state, "is closed")
        return ConnectionClosed(
            f"connection to {self._peer} {what}",
            details={"peer": self._peer, "conn": self.conn.id},
        )

    async def read(self) -> bytes:
        while True:
            if self._pending_error is not None:
                err, self._pending_error = self._pending_error, None
                raise err
            if self.state in (State.CLOSED, State.RESET):
                raise self._closed_error()
            if self._inbox:
                return self._inbox.popleft()
            if self.state is State.EOF:
                raise self._closed_error()
            if self._waiter is not None:
                raise RuntimeError(f"concurrent read on {self!r}")
            self._waiter = self.conn.net.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def write(self, frame: bytes) -> None:
        size = len(frame)
        if size > self._max_frame:
            raise FrameTooLarge(
                f"frame of {size} bytes to {self._peer} exceeds max_frame {self._max_frame}",
                details={"peer": self._peer, "size": size, "max_frame": self._max_frame},
            )
        if self.state is not State.OPEN:
            raise self._closed_error()
        # Copy: a caller may reuse its buffer, and the frame is only read at delivery time.
        self.out.send(Packet.DATA, bytes(frame))
        if self.out.bytes > self.conn.net.config.send_buffer:
            # A full send buffer pushes back on the writer, as TCP's would.
            await self.out.wait_drained()

    async def close(self) -> None:
        if self.state in (State.CLOSED, State.RESET):
            return
        self.conn.net.record("close", f"c{self.conn.id} {self.host}")
        self.out.send(Packet.FIN)  # after the data already queued: a graceful flush
        self.fail(State.CLOSED)

    def abort(self) -> None:
        if self.state in (State.CLOSED, State.RESET):
            return
        self.conn.net.record("abort", f"c{self.conn.id} {self.host}")
        self.out.clear()
        self.out.send(Packet.RST)
        self.fail(State.CLOSED)

    # ---- driven by the network -------------------------------------------------------------

    def deliver(self, frame: bytes) -> None:
        self._inbox.append(frame)
        self._wake()

    def oversize(self, size: int) -> None:
        """The peer sent more than we accept: read raises FrameTooLarge once, then closed."""
        self._pending_error = FrameTooLarge(
            f"peer {self._peer} announced a frame of {size} bytes",
            details={"peer": self._peer, "size": size, "max_frame": self._max_frame},
        )
        self.fail(State.CLOSED, keep_error=True)

    def peer_closed(self) -> None:
        if self.state is State.OPEN:
            self.state = State.EOF
            self._wake()

    def fail(self, state: State, keep_error: bool = False) -> None:
        self.state = state
        self._inbox.clear()
        if not keep_error:
            self._pending_error = None
        self._wake()
        self.conn.maybe_retire()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
