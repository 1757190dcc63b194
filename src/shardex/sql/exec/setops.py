"""Set operations in the distributed plan: UNION / INTERSECT / EXCEPT [ALL] at the initiator.

Each SELECT branch runs as a query of its own (its text, cut from the statement's by the
parser, planned and run as any SELECT is: its index, spans, leaves, stability TS and
failover), and its rows are gathered to the initiator, where the set operators
(``operators.setops``), then the whole result's ORDER BY, OFFSET and LIMIT run over them
(decision 0124). A parenthesised set operation inside is a source of the same kind.

Memory: the operators charge the statement's budget on this node the way a root fragment's
do: UNION's and the ALL-less forms' DISTINCT is the spilling one (``spill_groups.distinct``),
ORDER BY the external sort (``spill.external_sort``, top-N with a LIMIT), and INTERSECT /
EXCEPT test against the right side's values partitioned to disk past the budget
(``spill_sets.py``); with spilling off, QUERY_MEMORY_LIMIT names the operator. Each
branch's own operators charge that branch's query, as any SELECT's do.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from shardex.sql.exec.bridge import close_all, run_pipeline
from shardex.sql.exec.memory import Budget, NodeMemory
from shardex.sql.exec.rows import cell_chunks, decode_row
from shardex.sql.exec.spill import external_sort
from shardex.sql.exec.spill_groups import distinct as spilling_distinct
from shardex.sql.exec.spill_sets import spilling_membership
from shardex.sql.local_rows import eval_count, set_op_sort_key
from shardex.sql.operators import offset_limit, strip_keys
from shardex.sql.operators.setops import combine
from shardex.sql.syntax import SelectStmt
from shardex.sql.syntax.ast import SetOpStmt
from shardex.sql.syntax.explain import explain_query
from shardex.sql.syntax.setops import BoundSetOp, bind_set_op

__all__ = [
    "explain_set_op",
    "set_op_texts",
    "set_op_values",
    "start_set_op",
]

# Starts one SELECT branch from its text: its result rows, encoded, in chunks.
StartBranch = Callable[[str, SelectStmt], Awaitable[AsyncIterator[list[bytes]]]]


async def start_set_op(
    stmt: SetOpStmt,
    params: Any,
    start_branch: StartBranch,
    memory: NodeMemory,
    quota: int,
    spill: bool,
) -> AsyncIterator[list[bytes]]:
    """Start every branch (each its own gather) and return the set operation's rows. The
    caller has checked ``params`` (they may hold a WITH clause's values besides)."""
    q = bind_set_op(stmt)
    sources: list[AsyncIterator[list[bytes]]] = []
    try:
        for branch, text in zip(stmt.branches, stmt.texts, strict=True):
            if isinstance(branch, SetOpStmt):
                sources.append(
                    await start_set_op(branch, params, start_branch, memory, quota, spill)
                )
            else:
                sources.append(await start_branch(text, branch))
    except BaseException:
        await close_all(sources)
        raise
    return _rows(q, sources, params, memory, quota, spill)


async def _rows(
    q: BoundSetOp,
    sources: list[AsyncIterator[list[bytes]]],
    params: Any,
    memory: NodeMemory,
    quota: int,
    spill: bool,
) -> AsyncIterator[list[bytes]]:
    with memory.fragment(None, quota, spill) as mem:

        def run(inputs: list[Iterator[Any]]) -> Iterator[Any]:
            return set_op_values(q, inputs, mem.budget(), params)

        async for chunk in run_pipeline(
            run, sources, name="set operation", inline=True, decode=decode_row, pack=cell_chunks
        ):
            yield chunk


def set_op_values(
    q: BoundSetOp, inputs: list[Iterator[Any]], budget: Budget, params: Any
) -> Iterator[Any]:
    """The result values of ``q`` over its branches' values (``inputs``), within ``budget``."""
    limit = eval_count(q.limit, params, "LIMIT")
    offset = eval_count(q.offset, params, "OFFSET") or 0
    if limit == 0:
        return iter(())
    values = combine(
        q.ops,
        [functools.partial(iter, it) for it in inputs],
        dedupe=lambda rows: spilling_distinct(rows, budget, operator="UNION/DISTINCT"),
        members=lambda left, right, keep: spilling_membership(left, right, keep, budget),
    )
    key = set_op_sort_key(q, params)
    if key is not None:
        top = None if limit is None else offset + limit
        values = strip_keys(external_sort(((key(v), v) for v in values), budget, top))
    return offset_limit(values, offset, limit)


def set_op_texts(stmt: SetOpStmt) -> list[str]:
    """The texts of every SELECT branch, nested set operations flattened, in order."""
    out: list[str] = []
    for branch, text in zip(stmt.branches, stmt.texts, strict=True):
        out += set_op_texts(branch) if isinstance(branch, SetOpStmt) else [text]
    return out


def explain_set_op(stmt: SetOpStmt, plans: list[dict[str, Any]]) -> dict[str, Any]:
    """EXPLAIN of a set operation: each SELECT branch's distributed plan (``plans``, in
    ``set_op_texts`` order) in the local EXPLAIN's shape, and where the operators run."""
    selects = iter(plans)

    def fill(node: dict[str, Any]) -> dict[str, Any]:
        if "branches" in node:
            return {**node, "branches": [fill(b) for b in node["branches"]]}
        return next(selects)

    explained = explain_query(bind_set_op(stmt))
    out = fill(explained)
    out["distributed"] = {
        "mode": "set_operation",
        "on": "initiator",
        "does": [op["operator"] for op in explained["plan"]],
        "inputs": f"{len(plans)} SELECT branches, each its own query gathered here",
    }
    return out
