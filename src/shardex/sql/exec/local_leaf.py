"""A SELECT whose only index leaf is on its initiator, run in-process.

The execution protocol exists to move rows between members; when the one leaf of a plan
(one indexer node holds every slice the query reads) is this node, the protocol's work is
all overhead: a ``QueryExecute`` to itself, the execution's registry entries, Arrow batches
built and taken apart, credit flow between an outbox and an inbox in the same process. Here
the same two pipelines run chained instead: the leaf's (``fragments.leaf_pipeline``: scan at
the pinned TS, fetch, filter, partial work) feeds the root's (``root_pipeline``) its encoded
rows, exactly as an exchange would, so every result and error is the protocol's. Only the
transport differs: lists of encoded cells (``rows.cell_chunks``).

A client that sends a statement to the node its plan reads (the routing hint in
``SqlStarted.details``) gets this path on every later execution.

request_plus (``speculate``): the keyspace's high seqnos are a round trip to the other data
nodes, and the read does not have to wait for them. The slices' newest common snapshot now is
read at once while the round is out; when the answer comes, a snapshot that covers it is the
one the query would have pinned anyway (any snapshot covering the seqnos read after the
statement arrived sees every write acknowledged before it), and the rows read meanwhile stand.
One that does not is dropped unread and the query waits for a covering one, as without
speculation. With the pipeline keeping up, the newest snapshot covers the seqnos most of the
time: the round and the read overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from shardex.core.timestamp import Timestamp
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.fragments import leaf_pipeline, root_pipeline
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.plan import LEAF_KIND, ROOT_KIND
from shardex.sql.exec.rows import cell_chunks
from shardex.sql.protocol import QueryPlan

if TYPE_CHECKING:
    from shardex.index.scan_server import IndexScanServer

__all__ = ["after_first", "drop_unread", "run_local", "speculate"]


def run_local(
    index_scan: IndexScanServer,
    documents: DocumentAccess,
    memory: NodeMemory,
    qplan: QueryPlan,
    params: Any,
    name: str,
) -> AsyncIterator[list[bytes]]:
    """The result rows (encoded, in chunks) of ``qplan``, a root and one leaf, both here.
    Closing the iterator early closes the leaf's too (the root's pipeline closes its
    sources)."""
    by_kind = {f.kind: f for f in qplan.fragments}
    assert len(qplan.fragments) == 2 and by_kind.keys() == {ROOT_KIND, LEAF_KIND}
    params = params if params is not None else []
    leaf = leaf_pipeline(
        index_scan, documents, memory, by_kind[LEAF_KIND].args, params, name, cell_chunks
    )
    root = by_kind[ROOT_KIND].args
    return root_pipeline(documents, memory, root, params, name, [leaf], cell_chunks, list)


async def speculate(
    index_scan: IndexScanServer,
    documents: DocumentAccess,
    memory: NodeMemory,
    plan_at: Callable[[Timestamp], QueryPlan],
    seqnos: Callable[[], Any],
    slices: tuple[str, list[int]],
    params: Any,
    name: str,
    timeout: float,
) -> tuple[Timestamp, AsyncIterator[list[bytes]]]:
    """A request_plus run of a local one-leaf plan (``plan_at(ts)``): the TS it reads and its
    rows. ``seqnos()``: the keyspace's high seqnos, read after the statement arrived (a
    coroutine); ``slices``: the leaf's index id and partitions."""
    index_id, partitions = slices
    round_trip = asyncio.ensure_future(seqnos())
    try:
        newest = await index_scan.stable_ts(index_id, partitions, None, timeout)
    except BaseException:
        round_trip.cancel()
        raise
    chunks = run_local(index_scan, documents, memory, plan_at(newest), params, name)
    first = asyncio.ensure_future(anext(chunks, None))
    try:
        wait_for: Timestamp = await round_trip
    except BaseException:
        await drop_unread(first, chunks)
        raise
    if newest.covers(wait_for):
        return newest, after_first(first, chunks)
    await drop_unread(first, chunks)
    ts = await index_scan.stable_ts(index_id, partitions, wait_for, timeout)
    return ts, run_local(index_scan, documents, memory, plan_at(ts), params, name)


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
