"""The simulated network: latency, drops, partitions and crashes, all from one seeded RNG.

Every decision (a latency, whether a frame is lost, whether a connect is refused) is drawn from
the network's own ``random.Random`` inside loop callbacks that run in a reproducible order, and
every event is appended to the trace. Nothing here reads the wall clock, the ``random`` module's
global generator, ``id()`` or the iteration order of a set: registries are insertion-ordered
dicts and sets are only asked for membership.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shardex.sim.comm import Packet, Pipe, SimConnection, State
from shardex.sim.loop import SimLoop, SimulationError
from shardex.sim.trace import Trace
from shardex.sim.transport import SimTransport


@dataclass
class FaultConfig:
    """How the network misbehaves. Mutable: a scenario may change rates mid-run."""

    # One-way latency = latency_min + Exp(mean latency_mean), capped at latency_max.
    latency_min: float = 0.0002
    latency_mean: float = 0.001
    latency_max: float = 0.05
    # Replaces the distribution above when set (gets the network RNG; must use only it).
    latency: Callable[[random.Random], float] | None = None
    # Chance that a data frame is lost; a lost frame breaks its connection (both ends see
    # ConnectionClosed), which is what TCP does when a path dies under it.
    drop_rate: float = 0.0
    # Chance that a connect is refused (NodeUnavailable after one round trip).
    connect_fail_rate: float = 0.0
    # Frames held at a partition break their connection after this long; None: held until
    # heal() (then delivered in order), like TCP retransmitting without a user timeout.
    partition_reset_after: float | None = None
    # Bytes in flight per direction before write() waits for the pipe to drain.
    send_buffer: int = 4 * 1024 * 1024
    # Events kept in memory (the digest covers all); None keeps everything.
    trace_limit: int | None = 200_000
    # Put a digest of every frame's bytes in the trace (stronger replay check).
    trace_payloads: bool = True


class _Cut:
    """``a`` cannot talk to ``b``; ``b`` None means everyone not in ``a``."""

    def __init__(self, a: frozenset[str], b: frozenset[str] | None) -> None:
        self.a = a
        self.b = b

    def separates(self, x: str, y: str) -> bool:
        return self._one_way(x, y) or self._one_way(y, x)

    def _one_way(self, x: str, y: str) -> bool:
        if x not in self.a:
            return False
        return y not in self.a if self.b is None else y in self.b


class SimNetwork:
    """Hosts, listeners and connections of one simulation."""

    def __init__(self, rng: random.Random | int, config: FaultConfig | None = None) -> None:
        self.rng = rng if isinstance(rng, random.Random) else random.Random(rng)
        self.config = config if config is not None else FaultConfig()
        self.trace = Trace(self.config.trace_limit)
        self._loop: SimLoop | None = None
        self.listeners: dict[str, object] = {}  # address -> SimListener
        self._conns: dict[int, SimConnection] = {}
        self._next_conn = 0
        self._next_port: dict[str, int] = {}
        self._down: dict[str, bool] = {}  # host -> crashed silently (power off)
        self._cuts: list[_Cut] = []
        self._blocked: dict[Pipe, None] = {}
        self._heal_waiters: list[asyncio.Future[None]] = []

    # ---- plumbing --------------------------------------------------------------------------

    @property
    def loop(self) -> SimLoop:
        if self._loop is None:
            loop = asyncio.get_running_loop()
            if not isinstance(loop, SimLoop):
                raise SimulationError(
                    "SimNetwork must run on a SimLoop (use run_simulation): on a real loop the "
                    "run would depend on wall-clock timing and could not be replayed"
                )
            self._loop = loop
        return self._loop

    def transport(self, host: str, max_frame: int | None = None) -> SimTransport:
        """A ``SimTransport`` for ``host`` (one per simulated process)."""
        return SimTransport(self, host, max_frame=max_frame)

    def record(self, kind: str, detail: str) -> None:
        self.trace.record(self.loop.time(), kind, detail)

    def describe_frame(self, frame: bytes) -> str:
        if not self.config.trace_payloads:
            return f"{len(frame)}B"
        return f"{len(frame)}B {hashlib.blake2b(frame, digest_size=6).hexdigest()}"

    def draw_latency(self) -> float:
        cfg = self.config
        if cfg.latency is not None:
            return max(0.0, float(cfg.latency(self.rng)))
        extra = self.rng.expovariate(1.0 / cfg.latency_mean) if cfg.latency_mean > 0 else 0.0
        return min(cfg.latency_max, cfg.latency_min + extra)

    def chance(self, p: float) -> bool:
        # No draw at all when p is 0: turning a fault off must not shift every later draw.
        return p > 0 and self.rng.random() < p

    def allocate_port(self, host: str) -> int:
        port = self._next_port.get(host, 30000)
        self._next_port[host] = port + 1
        return port

    def new_connection(
        self, client: tuple[str, str, int], server: tuple[str, str, int]
    ) -> SimConnection:
        self._next_conn += 1
        conn = SimConnection(self, self._next_conn, client, server)
        self._conns[conn.id] = conn
        return conn

    def forget(self, conn: SimConnection) -> None:
        self._conns.pop(conn.id, None)
        for pipe in (conn.client.out, conn.server.out):
            self._blocked.pop(pipe, None)

    def connections(self) -> list[SimConnection]:
        return list(self._conns.values())

    # ---- delivery ----------------------------------------------------------------------------

    def arrive(self, pipe: Pipe, kind: Packet, frame: bytes) -> None:
        """A packet reached the far end of ``pipe``."""
        dst, conn = pipe.dst, pipe.conn
        if dst.state in (State.CLOSED, State.RESET):
            if kind is Packet.DATA and self._down.get(dst.host):
                # Powered off: nobody answers, the sender only learns through its timeouts.
                self.record("lost", f"{pipe.label} {self.describe_frame(frame)} (host down)")
            elif kind is Packet.DATA:
                # A live kernel answers data for a closed socket with RST.
                conn.reset(f"data for closed end at {dst.host}")
            else:
                conn.maybe_retire()
            return
        if kind is Packet.RST:
            conn.reset(f"RST from {pipe.src.host}")
        elif kind is Packet.FIN:
            self.record("fin", pipe.label)
            dst.peer_closed()
        elif self.chance(self.config.drop_rate):
            self.record("drop", f"{pipe.label} {self.describe_frame(frame)}")
            conn.reset("frame dropped")
        elif len(frame) > dst._max_frame:
            self.record("toolarge", f"{pipe.label} {len(frame)}B")
            dst.oversize(len(frame))
            conn.reset("frame too large for receiver")
        else:
            self.record("deliver", f"{pipe.label} {self.describe_frame(frame)}")
            dst.deliver(frame)

    # ---- partitions --------------------------------------------------------------------------

    def partition(self, side_a: Iterable[str], side_b: Iterable[str] | None = None) -> None:
        """Cut ``side_a`` off from ``side_b`` (from every other host when ``side_b`` is None).

        Cuts accumulate until ``heal()``. Frames across a cut are held in order at the cut;
        connects across it wait (SYN retransmission) until heal or their timeout.
        """
        a = frozenset(side_a)
        b = None if side_b is None else frozenset(side_b)
        self._cuts.append(_Cut(a, b))
        other = "*" if b is None else ",".join(sorted(b))
        self.record("partition", f"{','.join(sorted(a))} | {other}")

    def isolate(self, host: str) -> None:
        self.partition([host])

    def heal(self) -> None:
        """Remove every cut; held frames flow again one latency later, in order."""
        if not self._cuts:
            return
        self._cuts.clear()
        self.record("heal", "")
        now = self.loop.time()
        blocked, self._blocked = list(self._blocked), {}
        for pipe in blocked:
            pipe.blocked = False
            pipe.reschedule(at=now + self.draw_latency())
        waiters, self._heal_waiters = self._heal_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def is_cut(self, x: str, y: str) -> bool:
        return any(cut.separates(x, y) for cut in self._cuts)

    async def wait_link(self, x: str, y: str) -> None:
        """Return once ``x`` and ``y`` can talk (at once if they already can)."""
        while self.is_cut(x, y):
            fut = self.loop.create_future()
            self._heal_waiters.append(fut)
            await fut

    def block(self, pipe: Pipe) -> None:
        if pipe.blocked:
            return
        pipe.blocked = True
        pipe.block_gen += 1
        self._blocked[pipe] = None
        self.record("hold", pipe.label)
        after = self.config.partition_reset_after
        if after is not None:
            self.loop.call_later(after, self._block_timeout, pipe, pipe.block_gen)

    def unblock(self, pipe: Pipe) -> None:
        self._blocked.pop(pipe, None)

    def _block_timeout(self, pipe: Pipe, gen: int) -> None:
        if pipe.blocked and pipe.block_gen == gen and not pipe.conn.retired:
            self._blocked.pop(pipe, None)
            pipe.conn.reset(f"partition held {pipe.src.host}->{pipe.dst.host} too long")

    def break_connections(self, x: str, y: str | None = None) -> int:
        """Reset every connection between ``x`` and ``y`` (or touching ``x``): an explicit drop."""
        count = 0
        for conn in self.connections():
            hosts = (conn.client.host, conn.server.host)
            if x in hosts and (y is None or y in hosts):
                conn.reset("broken by test")
                count += 1
        return count

    # ---- crashes -----------------------------------------------------------------------------

    def is_up(self, host: str) -> bool:
        return host not in self._down

    def is_powered_off(self, host: str) -> bool:
        return self._down.get(host, False)

    def crash(self, host: str, *, power_off: bool = False) -> None:
        """Kill ``host``: its comms close at once, its listeners vanish, its tasks are cancelled.

        By default the peers' kernels learn through an RST one latency later (a killed
        process). ``power_off=True`` sends nothing: peers find out only by their own timeouts,
        and frames they send meanwhile vanish.
        """
        if host in self._down:
            return
        self._down[host] = power_off
        self.record("crash", f"{host}{' power_off' if power_off else ''}")
        for address, listener in list(self.listeners.items()):
            if getattr(listener, "host", None) == host:
                del self.listeners[address]
        for conn in self.connections():
            for end in conn.ends():
                if end.host == host and end.state in (State.OPEN, State.EOF):
                    end.out.clear()
                    if not power_off:
                        end.out.send(Packet.RST)
                    end.fail(State.CLOSED)
        self.loop.kill_host(host)

    def restart(self, host: str) -> None:
        """Bring ``host`` back (empty: whoever restarts it must start its services again)."""
        if host not in self._down:
            return
        del self._down[host]
        self.loop.revive_host(host)
        self.record("restart", host)
