"""How a statement's end is named for the metrics."""

from __future__ import annotations

import asyncio

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.statement_stats import StatementStats, outcome_of


def test_outcomes() -> None:
    assert outcome_of(None) == "success"
    assert outcome_of(asyncio.CancelledError()) == "cancelled"
    assert outcome_of(TimeoutError()) == "timeout"
    assert outcome_of(ShardexError("t", code=ErrorCode.TIMEOUT)) == "timeout"
    assert outcome_of(ShardexError("c", code=ErrorCode.QUERY_CANCELLED)) == "cancelled"
    assert outcome_of(ShardexError("o", code=ErrorCode.QUERY_OVERLOADED)) == "rejected"
    assert outcome_of(ShardexError("s", code=ErrorCode.SQL_SYNTAX)) == "error"
    assert outcome_of(ValueError()) == "error"


def test_end_observes_under_the_outcome() -> None:
    stats = StatementStats()
    stats.end(0.0)
    stats.end(0.0, ShardexError("s", code=ErrorCode.SQL_SYNTAX))
    stats.end_as(0.0, "cancelled")
    counts = {k: h.count for k, h in stats.latencies.items()}
    assert counts == {"success": 1, "error": 1, "cancelled": 1}
