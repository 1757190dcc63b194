"""A SELECT whose only index leaf is on its initiator, run in-process.

The execution protocol exists to move rows between members; when the one leaf of a plan
(one indexer node holds every slice the query reads) is this node, the protocol's work is
all overhead: a ``QueryExecute`` to itself, the execution's registry entries, Arrow batches
built and taken apart, credit flow between an outbox and an inbox in the same process. Here
the same two pipelines run chained instead: the leaf's (``fragments.run_leaf``: scan at
the pinned TS, fetch, filter, partial work) feeds the root's (``root_pipeline``) its encoded
rows, exactly as an exchange would, so every result and error is the protocol's. Only the
transport differs: lists of encoded cells (``rows.cell_chunks``), the leaf's arguments taken
from the plan as objects (``PhysicalPlan.leaf_spec``: nothing encoded into a fragment's dict
and decoded back), and a rows plan's root, which would pass the leaf's encoded rows on as they
are, is just that (``fragments.concatenated``).

A plan whose index read finds a few entries to fetch skips even that: ``point_read`` reads,
fetches and projects them as plain calls (``local_rows``, and at request_plus in
``speculate``), falling back to the leaf when the entries are more.

A client that sends a statement to the node its plan reads (the routing hint in
``SqlStarted.details``) gets this path on every later execution.

request_plus (``speculate``): the keyspace's high seqnos are a round trip to the other data
nodes, and the read does not have to wait for them. The slices' newest common snapshot now is
read at once while the round is out; when the answer comes, a snapshot that covers it is the
one the query would have pinned anyway (any snapshot covering the seqnos read after the
statement arrived sees every write acknowledged before it), and the rows read meanwhile stand.
One that does not is dropped unread and the query waits for a covering one, as without
speculation. With the pipeline keeping up, the newest snapshot covers the seqnos most of the
time: the round and the read overlap. The round is started by the caller, in the call
(``ClusterView.shared_high_seqnos_now``), and its coverage is checked on the seqnos' wire dict:
an index that caught up holds exactly the high seqnos, one C-level comparison.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardex.core.timestamp import Timestamp
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.fragments import concatenated, root_pipeline, run_leaf
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.plan import PhysicalPlan
from shardex.sql.exec.point_read import point_rows, point_shaped
from shardex.sql.exec.reply import once
from shardex.sql.exec.rows import cell_chunks

if TYPE_CHECKING:
    from shardex.index.scan_server import IndexScanServer
    from shardex.scan.cluster_view import ClusterView

__all__ = [
    "LocalRun",
    "after_first",
    "drop_unread",
    "high_seqnos_after",
    "local_rows",
    "root_of_leaves",
    "run_local",
    "speculate",
]


def high_seqnos_after(view: ClusterView, keyspace: str) -> Awaitable[Mapping[int, tuple[int, int]]]:
    """The keyspace's high seqnos as a wire dict, read after this call: the shared round is
    started (or joined) here, in the call, when the state is at hand."""
    started = view.shared_high_seqnos_now(keyspace)
    if started is None:
        return view.shared_high_seqnos_wire(keyspace)

    async def completed() -> Mapping[int, tuple[int, int]]:
        return await view.high_seqnos_wire(keyspace, known=await started)

    return completed()


@dataclass(frozen=True)
class LocalRun:
    """A plan run in-process and what its fragments would carry besides: the statement's
    text, whether it is a DML's derived SELECT, the memory quota and whether it may spill."""

    plan: PhysicalPlan
    sql: str
    dml: bool
    budget: int
    spill: bool


def run_local(
    index_scan: IndexScanServer,
    documents: DocumentAccess,
    memory: NodeMemory,
    local: LocalRun,
    ts: Timestamp | None,
    params: Any,
    name: str,
) -> AsyncIterator[list[bytes]]:
    """The result rows (encoded, in chunks) of ``local.plan`` (a root and one leaf, both
    here) at ``ts``. Closing the iterator early closes the leaf's too (the root's pipeline
    closes its sources)."""
    plan, params = local.plan, params if params is not None else []
    assert len(plan.leaves) == 1
    spec = plan.leaf_spec(plan.leaves[0], local.dml, ts, local.budget, local.spill)
    leaf = run_leaf(index_scan, documents, memory, spec, params, name, cell_chunks)
    return root_of_leaves(documents, memory, local, [leaf], params, name)


def root_of_leaves(
    documents: DocumentAccess,
    memory: NodeMemory,
    local: LocalRun,
    leaves: list[AsyncIterator[list[bytes]]],
    params: Any,
    name: str,
) -> AsyncIterator[list[bytes]]:
    """The result rows of ``local.plan`` from its leaves' encoded rows (one source per
    leaf, in the plan's order), its root run here as the protocol's ``sql.root`` would."""
    plan = local.plan
    late = plan.late and not local.dml
    if plan.mode == "rows" and not plan.bound.distinct and not late:
        # The root would pass the leaves' encoded rows on as they are: no root pipeline
        # (and with one leaf and no OFFSET or LIMIT to count, not even that).
        if len(leaves) == 1 and not plan.offset and plan.limit is None:
            return leaves[0]
        return concatenated(leaves, plan.offset, plan.limit)
    root = plan.root_args(local.sql, local.dml, local.budget, local.spill)
    return root_pipeline(documents, memory, root, params, name, leaves, cell_chunks, list)


async def speculate(
    index_scan: IndexScanServer,
    documents: DocumentAccess,
    memory: NodeMemory,
    local: LocalRun,
    seqnos: Awaitable[Mapping[int, tuple[int, int]]],
    params: Any,
    name: str,
    timeout: float,
) -> tuple[Timestamp, AsyncIterator[list[bytes]]]:
    """A request_plus run of ``local``: the TS it reads and its rows. ``seqnos``: the
    keyspace's high seqnos as a wire dict, read after the statement arrived, already asked
    (``ClusterView.shared_high_seqnos_now``)."""
    plan = local.plan
    assert plan.record is not None
    index_id, partitions = plan.record.id, plan.leaves[0].partitions
    try:
        newest = await index_scan.stable_ts(index_id, partitions, None, timeout)
    except BaseException:
        _close(seqnos)
        raise
    if point_shaped(plan, local.dml):
        # Read in this task while the round is out: no task, no generators.
        try:
            read = await _point(index_scan, documents, memory, local, newest, params)
        except BaseException:
            _close(seqnos)
            raise
        if read is not None:
            wait_for = _not_covered(newest, await seqnos)
            if wait_for is None:
                return newest, read
            ts = await index_scan.stable_ts(index_id, partitions, wait_for, timeout)
            return ts, await local_rows(index_scan, documents, memory, local, ts, params, name)
    chunks = run_local(index_scan, documents, memory, local, newest, params, name)
    first = asyncio.ensure_future(anext(chunks, None))
    try:
        high = await seqnos
    except BaseException:
        await drop_unread(first, chunks)
        raise
    wait_for = _not_covered(newest, high)
    if wait_for is None:
        return newest, after_first(first, chunks)
    await drop_unread(first, chunks)
    ts = await index_scan.stable_ts(index_id, partitions, wait_for, timeout)
    return ts, run_local(index_scan, documents, memory, local, ts, params, name)


async def local_rows(
    index_scan: IndexScanServer,
    documents: DocumentAccess,
    memory: NodeMemory,
    local: LocalRun,
    ts: Timestamp | None,
    params: Any,
    name: str,
) -> AsyncIterator[list[bytes]]:
    """``run_local``'s rows, by a point read when ``local.plan`` is one (``point_read``) and
    its entries are few, else by its leaf."""
    if point_shaped(local.plan, local.dml):
        read = await _point(index_scan, documents, memory, local, ts, params)
        if read is not None:
            return read
    return run_local(index_scan, documents, memory, local, ts, params, name)


async def _point(
    index_scan: IndexScanServer,
    documents: DocumentAccess,
    memory: NodeMemory,
    local: LocalRun,
    ts: Timestamp | None,
    params: Any,
) -> AsyncIterator[list[bytes]] | None:
    """``local``'s rows by ``point_rows`` at ``ts`` (``plan.point`` says so), or the error
    that ends them after the reply, as a leaf's first chunk's error would; None when its
    leaf must run instead."""
    plan = local.plan
    plan.point = False
    try:
        cells = await point_rows(
            index_scan, documents, memory, plan, ts, params, local.budget, local.spill
        )
    except Exception as exc:
        return _raising(exc)
    if cells is None:
        return None
    plan.point = True
    return once(cells)


def _not_covered(newest: Timestamp, high: Mapping[int, tuple[int, int]]) -> Timestamp | None:
    """None when the snapshot at ``newest`` covers the high seqnos ``high`` (a wire dict),
    else what a covering snapshot must cover."""
    # An index that caught up holds exactly the high seqnos: one C-level comparison of
    # the entries, no ``Timestamp`` built (``scan_ts.covers_seqnos``).
    if newest.to_wire().items() >= high.items():
        return None
    wait_for = Timestamp.from_wire(high)
    return None if newest.covers(wait_for) else wait_for


async def _raising(exc: Exception) -> AsyncIterator[list[bytes]]:
    """Rows that end in ``exc`` at once: a first chunk's error, after the reply."""
    raise exc
    yield []  # an async generator


def _close(aw: Awaitable[Any]) -> None:
    """An awaitable never awaited, let go: a coroutine closed (no "never awaited"
    warning), a future cancelled (a shared round goes on for its other statements)."""
    if asyncio.isfuture(aw):
        aw.cancel()
    elif asyncio.iscoroutine(aw):
        aw.close()


async def drop_unread(first: asyncio.Future[Any], chunks: AsyncIterator[list[bytes]]) -> None:
    """Stop a run whose rows are not wanted: its first chunk's read and the run itself."""
    first.cancel()
    with contextlib.suppress(BaseException):
        await first
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


async def after_first(
    first: asyncio.Future[list[bytes] | None], chunks: AsyncIterator[list[bytes]]
) -> AsyncIterator[list[bytes]]:
    """The first chunk (already being read), then the rest; closing it closes ``chunks``."""
    try:
        chunk = await first
        if chunk is None:
            return
        yield chunk
        async for chunk in chunks:
            yield chunk
    finally:
        await drop_unread(first, chunks)
