"""Concurrent SQL clients for ``bench.sql``: the shared process pool of ``bench.common.clients``
(one OS process per client, a common start instant) with a runner that queries: shardex
``client.query`` (node ``k mod 3`` as initiator, so initiators are spread) or PostgreSQL
prepared statements over psycopg. Each worker warms up for at most ``WARMUP_QUERIES``
(``bench.common.clients``) or ``WARMUP_SECONDS``; rates are over the time the clients really ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from bench.common import clients
from bench.common.clients import Target
from bench.sql.queries import PG_JSONB, PG_SQL, SX_SQL, Query

__all__ = ["ClientPool", "Measure", "Runner", "Target", "Variant"]

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


class Measure(clients.Measure):
    COUNT = "queries"
    RATE = "q/s"
    RATE_DIGITS = 2
    PER = "rows/query"


class Runner(clients.TargetRunner):
    """Runs one query of a case and returns its rows (also used in-process for checks)."""

    NAME = "bench-sql"

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
        return self.conn.execute(PG_SQL[q.case], self.pg_params(q), prepare=True).fetchall()

    def pg_params(self, q: Query) -> tuple[Any, ...]:
        """The query's parameters for psycopg: the jsonb ones wrapped (``PG_JSONB``)."""
        return tuple(
            self.jsonb(p) if jsonb else p
            for p, jsonb in zip(q.params, PG_JSONB[q.case], strict=True)
        )

    def count(self, q: Query, variant: Variant) -> int:
        return len(self.rows(q, variant))


class ClientPool(clients.ClientPool):
    """``size`` SQL client processes for one system; ``measure(queries, variant, clients,
    seconds)``; ``close`` (or ``with``) ends them."""

    def __init__(self, target: Target, size: int) -> None:
        super().__init__(partial(Runner, target), size, Measure, POOL_CONFIG)
