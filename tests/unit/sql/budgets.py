"""Memory budgets for operator tests: a node's SQL memory of its own, one query's account."""

from __future__ import annotations

from pathlib import Path

from shardex.sql.exec.memory import Budget, NodeMemory, QueryMemory

LARGE = 1 << 30


def budget(quota: int = LARGE, *, spill: bool = True, data_dir: Path | None = None) -> Budget:
    """A run's budget of ``quota`` bytes (spilling under ``data_dir``/sql-spill when given)."""
    node = NodeMemory(max(quota, LARGE), query_max=quota, data_dir=data_dir)
    return Budget(QueryMemory(node, "q", quota, spill))
