"""Concurrent benchmark clients: one OS process per client, shared by ``bench.scan`` and
``bench.sql`` (``bench/scan/clients.py``, ``bench/sql/clients.py`` supply the runners).

With 2 cores and the GIL, client threads in one process would measure the GIL as much as
the system; processes give each client its own interpreter (they still share the cores with
the servers, as clients on the same machine do). A ``ClientPool`` spawns ``size`` worker
processes once per system (spawn start method: the parent may run a JVM), each building its
own ``Runner`` from a picklable factory (its connection: shardex, a client to node ``k mod
3`` so coordinators are spread; PostgreSQL, a psycopg connection with prepared statements).
``measure`` runs one case on the first ``n`` workers: they warm up, then all start at the
same monotonic instant (CLOCK_MONOTONIC is system-wide on Linux) and run back-to-back queries
until the common stop instant; every latency whose query started in the window is kept. Given
the servers' CPU counter, it also reads the CPU the servers and the measuring client processes
used from the start instant until the last answer is in (the warm-up left out).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, ClassVar, Protocol

from bench.common.runner import percentile

WARMUP_QUERIES = 20
START_MARGIN = 0.3  # seconds between the last worker being ready and the common start


@dataclass
class Target:
    """How a worker reaches the system: ``kind`` "shardex" (``addresses``, and ``username``
    with ``password`` or else the node ``secret``) or "postgresql" (``conninfo``)."""

    kind: str
    addresses: list[str] = field(default_factory=list)
    secret: str = ""
    conninfo: str = ""
    username: str = ""
    password: str = ""


def shardex_target(cluster_dir: Any, as_user: bool = False) -> Target:
    """The ``Target`` of a local cluster: every node's address and the cluster secret, or
    with ``as_user`` its admin user's login (as an application connects: a SCRAM exchange,
    every request checked against the user's rights)."""
    from shardex.meta import cluster_dir as cdir

    spec = cdir.load(cluster_dir)
    addresses = [n.address for n in spec.nodes]
    password = cdir.read_admin_password(cluster_dir, spec) if as_user else None
    if password is None:
        return Target("shardex", addresses=addresses, secret=cdir.read_secret(cluster_dir, spec))
    return Target("shardex", addresses=addresses, username=cdir.ADMIN_USER, password=password)


class TargetRunner:
    """The base of the runners: a shardex client whose first address is node ``k mod
    len(addresses)`` (named ``NAME-k``), or a psycopg autocommit connection and ``Jsonb``;
    ``prepare`` does nothing, ``close`` closes the connection."""

    NAME = "bench"

    def __init__(self, target: Target, k: int = 0) -> None:
        self.target = target
        if target.kind == "shardex":
            from shardex.client import connect

            addrs = target.addresses
            rotated = addrs[k % len(addrs) :] + addrs[: k % len(addrs)]
            name = f"{self.NAME}-{k}"
            if target.username:
                self.client = connect(
                    rotated, username=target.username, password=target.password, name=name
                )
            else:
                self.client = connect(rotated, secret=target.secret, name=name)
        else:
            import psycopg
            from psycopg.types.json import Jsonb

            self.jsonb = Jsonb
            self.conn = psycopg.connect(target.conninfo, autocommit=True)

    def prepare(self, queries: Sequence[Any], setting: Any) -> None:
        """Before a case's warm-up (session settings, say)."""

    def close(self) -> None:
        if self.target.kind == "shardex":
            self.client.close()
        else:
            self.conn.close()


@dataclass
class Measure:
    """One case at one concurrency: what the parent gets back. Subclasses name the unit
    (``COUNT``: how many, ``RATE``: per second, ``PER``: rows per query)."""

    latencies: list[float]
    rows: int
    seconds: float
    errors: list[str]
    # CPU seconds over the measured window (None: not read): the servers' and the measuring
    # client processes'.
    server_cpu: float | None = None
    client_cpu: float | None = None

    COUNT: ClassVar[str] = "queries"
    RATE: ClassVar[str] = "q/s"
    RATE_DIGITS: ClassVar[int] = 2
    PER: ClassVar[str] = "rows/query"
    OP: ClassVar[str] = "query"  # the CPU columns' unit: "server CPU ms/<OP>"

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        n = len(lat)
        out: dict[str, Any] = {
            self.COUNT: n,
            "p50 ms": round(percentile(lat, 50) * 1e3, 2) if lat else None,
            "p99 ms": round(percentile(lat, 99) * 1e3, 2) if lat else None,
            "mean ms": round(statistics.fmean(lat) * 1e3, 2) if lat else None,
            self.RATE: round(n / self.seconds, self.RATE_DIGITS) if self.seconds else None,
            self.PER: round(self.rows / n, 1) if n else None,
            "errors": len(self.errors),
        }
        if self.server_cpu is not None:
            out[f"server CPU ms/{self.OP}"] = cpu_ms_per(self.server_cpu, n)
        if self.client_cpu is not None:
            out[f"client CPU ms/{self.OP}"] = cpu_ms_per(self.client_cpu, n)
        return out


# /proc counts CPU in 10 ms ticks: below 5 of them a window's figure is mostly rounding
# (a few GROUP BYs' client CPU), better left out than shown as 0.
MIN_CPU_SECONDS = 0.05


def cpu_ms_per(cpu_seconds: float, ops: int) -> float | None:
    """CPU milliseconds per operation, to 4 significant digits (a point query's is a few
    hundredths of a ms); None without operations or below ``MIN_CPU_SECONDS`` in all."""
    if not ops or cpu_seconds < MIN_CPU_SECONDS:
        return None
    return float(f"{cpu_seconds * 1e3 / ops:.4g}")


class Runner(Protocol):
    """Inside a worker: runs queries of one case with one setting (consistency, variant)."""

    def prepare(self, queries: Sequence[Any], setting: Any) -> None: ...

    def count(self, q: Any, setting: Any) -> int: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class PoolConfig:
    """How long the parent waits, and how a worker warms up."""

    answer_timeout: float = 120.0  # "ready" and the default of every answer
    warm_timeout: float | None = None  # "warm"; None: ``answer_timeout``
    result_slack: float = 120.0  # past the measured seconds, for the results
    warmup_seconds: float | None = None  # stop warming up after this long; None: never
    # Rates over the time the clients really ran (the last query may end well after the
    # stop instant), rather than over the planned seconds.
    stretch_seconds: bool = False


def _worker(factory: Callable[[int], Runner], config: PoolConfig, k: int, conn: Connection) -> None:
    runner = factory(k)
    conn.send("ready")
    try:
        while True:
            cmd = conn.recv()
            if cmd is None:
                return
            queries, setting = cmd
            i = k * 7  # clients start at different queries of the list
            try:
                runner.prepare(queries, setting)
                t_end = (
                    None
                    if config.warmup_seconds is None
                    else time.monotonic() + config.warmup_seconds
                )
                for _ in range(WARMUP_QUERIES):
                    runner.count(queries[i % len(queries)], setting)
                    i += 1
                    if t_end is not None and time.monotonic() > t_end:
                        break
            except Exception as exc:  # the parent raises it, naming the case
                conn.send(f"warm-up failed: {type(exc).__name__}: {exc}"[:500])
                continue
            conn.send("warm")
            start, stop = conn.recv()
            while time.monotonic() < start:
                time.sleep(min(0.001, max(0.0, start - time.monotonic())))
            lat: list[float] = []
            rows = 0
            errors: list[str] = []
            while True:
                t0 = time.monotonic()
                if t0 >= stop:
                    break
                try:
                    rows += runner.count(queries[i % len(queries)], setting)
                    lat.append(time.monotonic() - t0)
                except Exception as exc:  # counted and reported; the run goes on
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])
                i += 1
            conn.send((lat, rows, errors, time.monotonic() - start))
    finally:
        runner.close()


class ClientPool:
    """``size`` client processes, each running ``factory(k)`` (picklable: a module-level
    class or a ``functools.partial`` of one); ``close`` (or ``with``) ends them."""

    def __init__(
        self,
        factory: Callable[[int], Runner],
        size: int,
        measure_type: type[Measure] = Measure,
        config: PoolConfig = PoolConfig(),
    ) -> None:
        ctx = mp.get_context("spawn")  # the parent may run a JVM
        self.measure_type = measure_type
        self.config = config
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        try:
            for k in range(size):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(factory, config, k, child), daemon=True)
                p.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(p)
            for c in self.conns:
                self._expect(c, "ready")
        except BaseException:
            self.close()
            raise

    def _expect(self, conn: Connection, what: str, timeout: float | None = None) -> Any:
        if timeout is None:
            timeout = self.config.answer_timeout
        if not conn.poll(timeout):
            raise RuntimeError(f"a client process did not answer {what!r} in {timeout}s")
        msg = conn.recv()
        if what and msg != what:
            raise RuntimeError(f"a client process answered {msg!r}, expected {what!r}")
        return msg

    def measure(
        self,
        queries: Sequence[Any],
        setting: Any,
        clients: int,
        seconds: float,
        server_cpu: Callable[[], float] | None = None,
    ) -> Any:
        """``clients`` workers run ``queries`` with ``setting`` for ``seconds``.
        ``server_cpu``: the servers' CPU seconds so far (``bench.common.proc_cpu``); read with
        the clients' at the start instant and once every answer is in, so the window holds
        the measured queries whole (a query ending after the stop instant included) and no
        warm-up."""
        from bench.common.proc_cpu import process_cpu

        used = self.conns[:clients]
        pids = [p.pid for p in self.procs[:clients]]
        for c in used:
            c.send((list(queries), setting))
        for c in used:
            self._expect(c, "warm", timeout=self.config.warm_timeout)
        start = time.monotonic() + START_MARGIN
        stop = start + seconds
        for c in used:
            c.send((start, stop))
        out = self.measure_type([], 0, seconds, [])
        if server_cpu is not None:
            time.sleep(max(0.0, start - time.monotonic()))
            cpu0, client0 = server_cpu(), process_cpu(pids)
        for c in used:
            lat, rows, errors, took = self._expect(
                c, "", timeout=seconds + self.config.result_slack
            )
            out.latencies.extend(lat)
            out.rows += rows
            out.errors.extend(errors)
            if self.config.stretch_seconds:
                out.seconds = max(out.seconds, took)
        if server_cpu is not None:
            out.server_cpu = server_cpu() - cpu0
            out.client_cpu = process_cpu(pids) - client0
        return out

    def close(self) -> None:
        for c in self.conns:
            with contextlib.suppress(OSError):  # already gone
                c.send(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.conns:
            c.close()

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
