"""Running a join statement at its initiator (decision 0123; ``join_plan`` says what runs).

The FROM side's statement and every gathered inner side's are started as ordinary SELECTs
(``start``: the service's own ``start_select``, each with its index choice, leaves,
stability TS and failover); their rows reach this node's pipeline thread (``bridge``), which
joins them with the operators ``LocalEngine`` runs (``join_steps``), then does LET, WHERE,
the aggregates, the projection, ORDER BY, OFFSET and LIMIT as a ``local`` root does. Reads
the thread needs on the way (a lookup join's documents, an index join's probe statements)
run on the loop while the thread waits for them, as a USE KEYS subquery's do (decision
0120). A gathered side is held whole while the join runs and is charged to the query's
memory budget (operator ``join``): past it the statement fails with QUERY_MEMORY_LIMIT.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any

from shardex.core.expr import MISSING, evaluate
from shardex.sql.exec.bridge import run_pipeline
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.fragment_rows import compiled, root_rows
from shardex.sql.exec.join_plan import JoinSides, probe_params, side_meta, side_params
from shardex.sql.exec.memory import Budget, NodeMemory, value_size
from shardex.sql.exec.rows import cell_chunks, decode_row, encode_row
from shardex.sql.exec.subqueries import FETCH_TIMEOUT, Fetch, blocking_fetch, expression_runner
from shardex.sql.join_steps import joined_rows
from shardex.sql.local_rows import unnest_specs
from shardex.sql.syntax.bind import META_KEY, BoundSelect
from shardex.sql.syntax.subquery import running_subqueries

__all__ = ["ClusterSides", "blocking_meta_fetch", "run_join"]

# (keyspace, ids) -> (docid, document, META()) of those that exist, META() fetched whole
MetaFetch = Callable[[str, list[str]], list[tuple[str, Any, dict[str, Any]]]]
# A side statement started: its encoded result rows, in chunks.
Start = Callable[[str, Any], Awaitable[AsyncIterator[list[bytes]]]]
ROW_OVERHEAD = 64  # bytes charged per held inner row beyond its values' estimate


class ClusterSides:
    """``join_steps.InnerSides`` over the cluster, for the pipeline thread. ``fetch_meta``:
    a lookup join's fetch of documents with their META() (for the joins in ``metas``, whose
    statement reads ``META(alias).cas`` or ``.expiration``)."""

    def __init__(
        self,
        fetch: Fetch,
        gathered: dict[int, Iterator[Any]],
        probe: Callable[[int, list[Any]], list[Any]],
        budget: Budget,
        fetch_meta: MetaFetch | None = None,
        metas: frozenset[int] = frozenset(),
    ) -> None:
        self._fetch = fetch
        self._fetch_meta = fetch_meta
        self._metas = metas
        self._gathered = gathered
        self._probe = probe
        self._held = budget.reserve("join")

    def fetch(self, k: int, keyspace: str, ids: list[str]) -> dict[str, tuple[Any, Any]]:
        if k in self._metas and self._fetch_meta is not None:
            return {d: (doc, meta) for d, doc, meta in self._fetch_meta(keyspace, ids)}
        return {d: (doc, {"id": d}) for d, doc in self._fetch(keyspace, ids)}

    def scan(self, k: int) -> list[tuple[str, Any, Any]]:
        out: list[tuple[str, Any, Any]] = []
        for row in self._gathered.pop(k):
            self._charge(ROW_OVERHEAD + len(row[0]) + value_size(row[1]))
            out.append((row[0], row[1], side_meta(row)))
        return out

    def held(self, rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for row in rows:
            self._charge(ROW_OVERHEAD + value_size(row))
            yield row

    def _charge(self, n: int) -> None:
        if not self._held.grow(n):
            raise self._held.over(why="a join's table is held whole")

    def probe(self, k: int, values: list[Any]) -> list[tuple[str, Any, Any]]:
        return [(row[0], row[1], side_meta(row)) for row in self._probe(k, values)]


def blocking_meta_fetch(documents: DocumentAccess, loop: asyncio.AbstractEventLoop) -> MetaFetch:
    """``DocumentAccess.get_many_meta`` for the pipeline thread (it waits; the loop reads)."""

    def fetch(keyspace: str, ids: list[str]) -> list[tuple[str, Any, dict[str, Any]]]:
        read = documents.get_many_meta(keyspace, list(dict.fromkeys(ids)))
        return asyncio.run_coroutine_threadsafe(read, loop).result(FETCH_TIMEOUT)

    return fetch


async def _once(cells: list[bytes]) -> AsyncIterator[list[bytes]]:
    yield cells


def _from_expression(b: BoundSelect, params: Any) -> list[bytes]:
    assert b.from_ is not None and b.from_.source is not None
    with running_subqueries(expression_runner):  # FROM (SELECT ...): evaluated once
        value = evaluate(b.from_.source, {}, params=params)
    items = value if isinstance(value, list) else [] if value is MISSING else [value]
    return [encode_row(item) for item in items]


async def run_join(
    plan: Any,
    params: Any,
    start: Start,
    documents: DocumentAccess,
    memory: NodeMemory,
    budget: int,
    spill: bool,
    timeout: float = FETCH_TIMEOUT,
) -> AsyncIterator[list[bytes]]:
    """The result rows (encoded, in chunks) of the join statement ``plan`` (a
    ``PhysicalPlan`` with ``join``), within ``budget`` bytes of the node's ``memory``."""
    b: BoundSelect = plan.bound
    sides: JoinSides = plan.join
    query, limit, offset = str(plan.query_id), plan.limit, plan.offset
    loop = asyncio.get_running_loop()
    sources: list[AsyncIterator[list[bytes]]] = []
    named = side_params(params)
    try:
        if sides.from_sql is not None:
            sources.append(await start(sides.from_sql, named))
        else:
            sources.append(_once(_from_expression(b, params)))
        order = sorted(sides.gathered)
        for k in order:
            sources.append(await start(sides.gathered[k], named))
    except BaseException:
        for s in sources:
            with contextlib.suppress(Exception):
                await s.aclose()  # type: ignore[attr-defined]
        raise
    fetch = blocking_fetch(documents, loop)
    meta_fetch = blocking_meta_fetch(documents, loop)

    def probe(k: int, values: list[Any]) -> list[Any]:
        async def run() -> list[Any]:
            chunks = await start(sides.probes[k], probe_params(params, values))
            out: list[Any] = []
            async with contextlib.aclosing(chunks):  # type: ignore[type-var]
                async for cells in chunks:
                    out += [decode_row(c) for c in cells]
            return out

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout)

    alias, keyed = b.alias, sides.from_sql is not None
    assert alias is not None
    with memory.fragment(query, budget, spill) as mem:

        def rows(ins: list[Iterator[Any]]) -> Any:
            bud = mem.budget()
            gathered = {k: ins[i + 1] for i, k in enumerate(order)}
            inner = ClusterSides(
                fetch, gathered, probe, bud, meta_fetch, frozenset(sides.fetched_meta)
            )
            if keyed:
                scope = ({alias: v[1], META_KEY: side_meta(v)} for v in ins[0])
            else:
                scope = ({alias: v, META_KEY: {}} for v in ins[0])
            joined = joined_rows(
                b, scope, sides.plans, inner, params, unnest_specs(b, params), compiled
            )
            return root_rows(b, params, "local", limit, offset, bud, [joined], fetch)

        batches = run_pipeline(
            rows,
            sources,
            name=f"{query} join",
            inline=False,  # the thread waits for reads the loop makes
            decode=decode_row,
            pack=cell_chunks,
        )
        async with contextlib.aclosing(batches):
            async for chunk in batches:
                yield chunk
