"""Concurrent scan clients for ``bench.scan``: one OS process per client.

With 2 cores and the GIL, client threads in one process would measure the GIL as much as
the system; processes give each client its own interpreter (they still share the cores with
the servers, as clients on the same machine do). A ``ClientPool`` spawns ``size`` worker
processes once per system (spawn start method: the parent may run a JVM), each with its own
connection (shardex: a client to node ``k mod 3``, so coordinators are spread; PostgreSQL:
a psycopg connection with prepared statements). ``measure`` runs one case on the first ``n``
workers: they warm up, then all start at the same monotonic instant (CLOCK_MONOTONIC is
system-wide on Linux) and run back-to-back queries until the common stop instant; every
latency whose query started in the window is kept.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from bench.data_service import percentile
from bench.pipeline_common import KEYSPACE
from bench.scan_queries import PG_SETTINGS, PG_SQL, Query

WARMUP_QUERIES = 20
START_MARGIN = 0.3  # seconds between the last worker being ready and the common start


@dataclass
class Target:
    """How a worker reaches the system: ``kind`` "shardex" (``addresses``, ``secret``) or
    "postgresql" (``conninfo``)."""

    kind: str
    addresses: list[str] = field(default_factory=list)
    secret: str = ""
    conninfo: str = ""


@dataclass
class Measure:
    """One case at one concurrency: what the parent gets back."""

    latencies: list[float]
    rows: int
    seconds: float
    errors: list[str]

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        n = len(lat)
        return {
            "scans": n,
            "p50 ms": round(percentile(lat, 50) * 1e3, 2) if lat else None,
            "p99 ms": round(percentile(lat, 99) * 1e3, 2) if lat else None,
            "mean ms": round(statistics.fmean(lat) * 1e3, 2) if lat else None,
            "scans/s": round(n / self.seconds, 1) if self.seconds else None,
            "rows/scan": round(self.rows / n, 1) if n else None,
            "errors": len(self.errors),
        }


class _Runner:
    """Inside a worker: runs one query and returns its row count."""

    def __init__(self, target: Target, k: int) -> None:
        self.target = target
        if target.kind == "shardex":
            from shardex.client import connect

            addrs = target.addresses
            rotated = addrs[k % len(addrs) :] + addrs[: k % len(addrs)]
            self.client = connect(rotated, secret=target.secret, name=f"bench-scan-{k}")
        else:
            import psycopg
            from psycopg.types.json import Jsonb

            self.jsonb = Jsonb
            self.conn = psycopg.connect(target.conninfo, autocommit=True)

    def prepare(self, case: str) -> None:
        """PostgreSQL: the case's session settings (``PG_SETTINGS``), nothing else."""
        if self.target.kind != "shardex":
            self.conn.execute("RESET ALL")
            for setting in PG_SETTINGS[case]:
                self.conn.execute(setting)

    def run(self, q: Query, consistency: str) -> int:
        if self.target.kind == "shardex":
            rows = list(
                self.client.scan(
                    KEYSPACE, q.index, q.spans, consistency=consistency, limit=q.limit, timeout=60
                )
            )
            return len(rows)
        params = tuple(self.jsonb(p) for p in q.pg_params)
        cur = self.conn.execute(PG_SQL[q.case], params, prepare=True)
        return len(cur.fetchall())

    def close(self) -> None:
        if self.target.kind == "shardex":
            self.client.close()
        else:
            self.conn.close()


def _worker(target: Target, k: int, conn: Connection) -> None:
    runner = _Runner(target, k)
    conn.send("ready")
    try:
        while True:
            cmd = conn.recv()
            if cmd is None:
                return
            queries, consistency = cmd["queries"], cmd["consistency"]
            i = k * 7  # clients start at different queries of the list
            try:
                runner.prepare(queries[0].case)
                for _ in range(WARMUP_QUERIES):
                    runner.run(queries[i % len(queries)], consistency)
                    i += 1
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
                    rows += runner.run(queries[i % len(queries)], consistency)
                    lat.append(time.monotonic() - t0)
                except Exception as exc:  # counted and reported; the run goes on
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])
                i += 1
            conn.send((lat, rows, errors))
    finally:
        runner.close()


class ClientPool:
    """``size`` client processes for one system; ``close`` (or ``with``) ends them."""

    def __init__(self, target: Target, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        try:
            for k in range(size):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(target, k, child), daemon=True)
                p.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(p)
            for c in self.conns:
                self._expect(c, "ready")
        except BaseException:
            self.close()
            raise

    def _expect(self, conn: Connection, what: str, timeout: float = 120.0) -> Any:
        if not conn.poll(timeout):
            raise RuntimeError(f"a client process did not answer {what!r} in {timeout}s")
        msg = conn.recv()
        if what and msg != what:
            raise RuntimeError(f"a client process answered {msg!r}, expected {what!r}")
        return msg

    def measure(
        self, queries: Sequence[Query], consistency: str, clients: int, seconds: float
    ) -> Measure:
        used = self.conns[:clients]
        for c in used:
            c.send({"queries": list(queries), "consistency": consistency})
        for c in used:
            self._expect(c, "warm")
        start = time.monotonic() + START_MARGIN
        stop = start + seconds
        for c in used:
            c.send((start, stop))
        out = Measure([], 0, seconds, [])
        for c in used:
            lat, rows, errors = self._expect(c, "", timeout=seconds + 120)
            out.latencies.extend(lat)
            out.rows += rows
            out.errors.extend(errors)
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
