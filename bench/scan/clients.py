"""Concurrent scan clients for ``bench.scan``: the shared process pool of ``bench.common.clients``
(one OS process per client, a common start instant) with a runner that scans: shardex
``client.scan`` (node ``k mod 3`` as coordinator, so coordinators are spread) or a psycopg
connection with prepared statements and the case's session settings (``PG_SETTINGS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from bench.common import clients
from bench.common.clients import Target
from bench.common.dataset import KEYSPACE
from bench.scan.queries import PG_SETTINGS, PG_SQL, Query

__all__ = ["ClientPool", "Measure", "Target"]


class Measure(clients.Measure):
    """One case at one concurrency: what the parent gets back."""

    COUNT = "scans"
    RATE = "scans/s"
    RATE_DIGITS = 1
    PER = "rows/scan"


class _Runner(clients.TargetRunner):
    """Inside a worker: runs one query and returns its row count."""

    NAME = "bench-scan"

    def prepare(self, queries: Sequence[Query], consistency: str) -> None:
        """PostgreSQL: the case's session settings (``PG_SETTINGS``), nothing else."""
        if self.target.kind != "shardex":
            self.conn.execute("RESET ALL")
            for setting in PG_SETTINGS[queries[0].case]:
                self.conn.execute(setting)

    def count(self, q: Query, consistency: str) -> int:
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


class ClientPool(clients.ClientPool):
    """``size`` scan client processes for one system; ``measure(queries, consistency,
    clients, seconds)``; ``close`` (or ``with``) ends them."""

    def __init__(self, target: Target, size: int) -> None:
        super().__init__(partial(_Runner, target), size, Measure)
