"""Concurrent SQL clients for ``bench.sql``: one OS process per client (as
``bench.scan_clients``, whose reasons apply: 2 cores and the GIL). shardex clients run
``client.query`` (node ``k mod 3`` as initiator, so initiators are spread); PostgreSQL
clients run prepared statements over psycopg. ``measure`` runs one case on the first ``n``
workers: each warms up (at most ``WARMUP_QUERIES`` or ``WARMUP_SECONDS``), then all start at
one monotonic instant and run back-to-back queries until the common stop instant; a query
that started in the window counts.
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
from bench.sql_queries import PG_JSONB, PG_SQL, SX_SQL, Query

WARMUP_QUERIES = 20
WARMUP_SECONDS = 2.0
START_MARGIN = 0.3  # seconds between the last worker being ready and the common start
QUERY_TIMEOUT = 600.0


@dataclass
class Target:
    """How a worker reaches the system: ``kind`` "shardex" (``addresses``, ``secret``) or
    "postgresql" (``conninfo``)."""

    kind: str
    addresses: list[str] = field(default_factory=list)
    secret: str = ""
    conninfo: str = ""


@dataclass
class Variant:
    """How shardex runs the queries: consistency and execution tuning (ablations)."""

    name: str = "current"
    consistency: str = "request_plus"
    tuning: dict[str, bool] | None = None


@dataclass
class Measure:
    latencies: list[float]
    rows: int
    seconds: float
    errors: list[str]

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        n = len(lat)
        return {
            "queries": n,
            "p50 ms": round(percentile(lat, 50) * 1e3, 2) if lat else None,
            "p99 ms": round(percentile(lat, 99) * 1e3, 2) if lat else None,
            "mean ms": round(statistics.fmean(lat) * 1e3, 2) if lat else None,
            "q/s": round(n / self.seconds, 2) if self.seconds else None,
            "rows/query": round(self.rows / n, 1) if n else None,
            "errors": len(self.errors),
        }


class Runner:
    """Runs one query of a case and returns its rows (also used in-process for checks)."""

    def __init__(self, target: Target, k: int = 0) -> None:
        self.target = target
        if target.kind == "shardex":
            from shardex.client import connect

            addrs = target.addresses
            rotated = addrs[k % len(addrs) :] + addrs[: k % len(addrs)]
            self.client = connect(rotated, secret=target.secret, name=f"bench-sql-{k}")
        else:
            import psycopg
            from psycopg.types.json import Jsonb

            self.jsonb = Jsonb
            self.conn = psycopg.connect(target.conninfo, autocommit=True)

    def rows(self, q: Query, variant: Variant) -> list[Any]:
        if self.target.kind == "shardex":
            res = self.client.query(
                SX_SQL[q.case],
                list(q.params),
                variant.consistency,
                timeout=QUERY_TIMEOUT,
                tuning=variant.tuning,
            )
            return list(res)
        params = tuple(
            self.jsonb(p) if jsonb else p
            for p, jsonb in zip(q.params, PG_JSONB[q.case], strict=True)
        )
        return self.conn.execute(PG_SQL[q.case], params, prepare=True).fetchall()

    def close(self) -> None:
        if self.target.kind == "shardex":
            self.client.close()
        else:
            self.conn.close()


def _worker(target: Target, k: int, conn: Connection) -> None:
    runner = Runner(target, k)
    conn.send("ready")
    try:
        while True:
            cmd = conn.recv()
            if cmd is None:
                return
            queries, variant = cmd["queries"], cmd["variant"]
            i = k * 7  # clients start at different queries of the list
            try:
                t_end = time.monotonic() + WARMUP_SECONDS
                for _ in range(WARMUP_QUERIES):
                    runner.rows(queries[i % len(queries)], variant)
                    i += 1
                    if time.monotonic() > t_end:
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
                    rows += len(runner.rows(queries[i % len(queries)], variant))
                    lat.append(time.monotonic() - t0)
                except Exception as exc:  # counted and reported; the run goes on
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])
                i += 1
            conn.send((lat, rows, errors, time.monotonic() - start))
    finally:
        runner.close()


class ClientPool:
    """``size`` client processes for one system; ``close`` (or ``with``) ends them."""

    def __init__(self, target: Target, size: int) -> None:
        ctx = mp.get_context("spawn")  # the parent may run a JVM
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

    def _expect(self, conn: Connection, what: str, timeout: float = 300.0) -> Any:
        if not conn.poll(timeout):
            raise RuntimeError(f"a client process did not answer {what!r} in {timeout}s")
        msg = conn.recv()
        if what and msg != what:
            raise RuntimeError(f"a client process answered {msg!r}, expected {what!r}")
        return msg

    def measure(
        self, queries: Sequence[Query], variant: Variant, clients: int, seconds: float
    ) -> Measure:
        used = self.conns[:clients]
        for c in used:
            c.send({"queries": list(queries), "variant": variant})
        for c in used:
            self._expect(c, "warm", timeout=QUERY_TIMEOUT * 2)
        start = time.monotonic() + START_MARGIN
        stop = start + seconds
        for c in used:
            c.send((start, stop))
        out = Measure([], 0, seconds, [])
        for c in used:
            lat, rows, errors, took = self._expect(c, "", timeout=seconds + QUERY_TIMEOUT)
            out.latencies.extend(lat)
            out.rows += rows
            out.errors.extend(errors)
            # A query that started before the stop instant may end well after it (a GROUP
            # BY over every document): rates are over the time the clients really ran.
            out.seconds = max(out.seconds, took)
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
