"""Concurrent SQL clients for ``bench.sql``: the shared process pool of ``bench.common.clients``
(one OS process per client, a common start instant) with a runner that queries: shardex
``client.query`` (node ``k mod 3`` as initiator, so initiators are spread) or PostgreSQL
prepared statements over psycopg. Each worker warms up for at most ``WARMUP_QUERIES``
(``bench.common.clients``) or ``WARMUP_SECONDS``; rates are over the time the clients really ran.

The cold path (``cold_path``): in a fresh process per case, new clients one after the other,
each timed from the connection (with its login) to its first and its second answer.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, ClassVar

from bench.common import clients
from bench.common.clients import Target
from bench.sql.queries import PG_JSONB, PG_SQL, SX_SQL, Query

__all__ = ["ClientPool", "Measure", "Runner", "Target", "Variant", "cold_path"]

WARMUP_SECONDS = 2.0
QUERY_TIMEOUT = 600.0
POOL_CONFIG = clients.PoolConfig(
    answer_timeout=300.0,
    warm_timeout=QUERY_TIMEOUT * 2,
    result_slack=QUERY_TIMEOUT,
    warmup_seconds=WARMUP_SECONDS,
    # A query that started before the stop instant may end well after it (a GROUP BY over
    # every document): rates are over the time the clients really ran.
    stretch_seconds=True,
)


@dataclass
class Variant:
    """How shardex runs the queries: consistency and execution tuning (ablations)."""

    name: str = "current"
    consistency: str = "request_plus"
    tuning: dict[str, bool] | None = None

    def columns(self) -> dict[str, str]:
        """How a measurement row names the variant."""
        return {"consistency": self.consistency, "variant": self.name}


class Measure(clients.Measure):
    COUNT = "queries"
    RATE = "q/s"
    RATE_DIGITS = 2
    PER = "rows/query"


class Runner(clients.TargetRunner):
    """Runs one query of a case and returns its rows (also used in-process for checks).
    The statements are the class's (``SX``, ``PG``, ``JSONB``): another benchmark's mix is
    a subclass naming its own."""

    NAME = "bench-sql"
    SX: ClassVar[Mapping[str, str]] = SX_SQL
    PG: ClassVar[Mapping[str, str]] = PG_SQL
    JSONB: ClassVar[Mapping[str, tuple[bool, ...]]] = PG_JSONB

    def rows(self, q: Query, variant: Variant) -> list[Any]:
        if self.target.kind == "shardex":
            res = self.client.query(
                self.SX[q.case],
                list(q.params),
                variant.consistency,
                timeout=QUERY_TIMEOUT,
                tuning=variant.tuning,
            )
            return list(res)
        return self.conn.execute(self.PG[q.case], self.pg_params(q), prepare=True).fetchall()

    def pg_params(self, q: Query) -> tuple[Any, ...]:
        """The query's parameters for psycopg: the jsonb ones wrapped (``PG_JSONB``)."""
        return tuple(
            self.jsonb(p) if jsonb else p
            for p, jsonb in zip(q.params, self.JSONB[q.case], strict=True)
        )

    def count(self, q: Query, variant: Variant) -> int:
        return len(self.rows(q, variant))


class ClientPool(clients.ClientPool):
    """``size`` SQL client processes for one system, each with a ``runner`` (``Runner`` or a
    subclass); ``measure(queries, variant, clients, seconds)``; ``close`` (or ``with``) ends
    them."""

    def __init__(self, target: Target, size: int, runner: type[Runner] = Runner) -> None:
        super().__init__(partial(runner, target), size, Measure, POOL_CONFIG)


# --- the cold path -----------------------------------------------------------------------------


def cold_samples(
    target: Target, queries: Sequence[Query], variant: Variant, clients: int
) -> dict[str, list[float]]:
    """``clients`` new clients one after the other in this process, each running two of
    ``queries`` (checked to return their rows): seconds of its connection (connect and
    login: ``Runner.__init__``), its first and its second query."""
    out: dict[str, list[float]] = {"connect s": [], "first s": [], "second s": []}
    for k in range(clients):
        q1, q2 = queries[(2 * k) % len(queries)], queries[(2 * k + 1) % len(queries)]
        t0 = time.perf_counter()
        runner = Runner(target, k)  # shardex: node k mod 3 first, initiators spread
        try:
            t1 = time.perf_counter()
            n1 = runner.count(q1, variant)
            t2 = time.perf_counter()
            n2 = runner.count(q2, variant)
            t3 = time.perf_counter()
        finally:
            runner.close()
        for q, n in ((q1, n1), (q2, n2)):
            if n != q.expected_rows:
                raise RuntimeError(f"{q.case} {q.params}: {n} rows, expected {q.expected_rows}")
        out["connect s"].append(t1 - t0)
        out["first s"].append(t2 - t1)
        out["second s"].append(t3 - t2)
    return out


def _cold_worker(
    target: Target, queries: Sequence[Query], variant: Variant, clients: int, conn: Connection
) -> None:
    # The client library imported before any timing: a module's first import is not the
    # system's cost.
    if target.kind == "shardex":
        import shardex.client  # noqa: F401
    else:
        import psycopg  # noqa: F401
    try:
        conn.send(cold_samples(target, queries, variant, clients))
    except Exception as exc:  # the parent raises it
        conn.send(f"{type(exc).__name__}: {exc}"[:500])


def cold_path(
    target: Target, queries: Sequence[Query], variant: Variant, clients: int, timeout: float
) -> dict[str, list[float]]:
    """``cold_samples`` in a fresh process (spawned: the parent may run a JVM), so its first
    new client is also the process's first."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(
        target=_cold_worker, args=(target, list(queries), variant, clients, child), daemon=True
    )
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise RuntimeError(f"the cold-path process did not answer in {timeout:.0f} s")
        got = parent.recv()
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    if isinstance(got, str):
        raise RuntimeError(f"cold path: {got}")
    return got
