"""A point read: a local plan's index read, fetch and operators as plain calls.

A statement like ``SELECT ... FROM users WHERE email = $1`` over a non-partitioned index
finds one entry (or a few) in one slice on this node, fetches the documents and projects
them. Run as a leaf (``fragments.run_leaf``) that is a chain of async generators (the
slice's blocks, the scope rows, the operator pipeline, the leaf, the first-chunk wrapper of
``local_leaf.speculate``), a task for its first chunk, a ``LeafSpec`` and the pipeline's
inline bookkeeping: sized for results of any size, and most of a point query's Python on
its node. Here, when the index read ends within ``POINT_ROWS`` entries, the same steps run
in one call: the entries read on the loop (``IndexScanServer.read_local_now``), their
documents fetched (in-process when they are this node's, else one ``GetMany`` per owner),
and the leaf's operators (``fragment_rows.leaf_rows``) run on the loop, as a leaf whose input
fits ``bridge.INLINE_ROWS`` runs them. More entries: None, and the caller runs the leaf as
before (the few entries read are the only work lost).

Only the shapes whose root just passes the leaf's rows on qualify (``point_shaped``): rows
mode without DISTINCT, a document fetch (not covering, no ``META().cas``/expiration), an
index that is not an array index, no subquery that reads documents, not a DML's SELECT.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

from shardex.api.spans import encode_decoded
from shardex.core.timestamp import Timestamp
from shardex.sql.exec.analyze import reads_fetched_meta
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.entries import EntryDecoder
from shardex.sql.exec.fragment_rows import leaf_rows
from shardex.sql.exec.fragments import fetched_scopes
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.plan import PhysicalPlan
from shardex.sql.exec.rows import encode_row
from shardex.sql.exec.subqueries import blocking_fetch, reads_documents

if TYPE_CHECKING:
    from shardex.index.scan_server import IndexScanServer

__all__ = ["POINT_ROWS", "point_rows", "point_shaped"]

POINT_ROWS: Final = 64  # index entries a point read takes; past it, the leaf runs


def point_shaped(plan: PhysicalPlan, dml: bool) -> bool:
    """Whether ``plan`` (one leaf, run in-process here) may be run by ``point_rows``."""
    b, choice, record = plan.bound, plan.choice, plan.record
    tuning = plan.tuning
    return (
        tuning["point_read"]
        and tuning["inline"]
        and tuning["get_many"]
        and not dml
        and plan.mode == "rows"
        and not b.distinct
        and not plan.late
        and len(plan.leaves) == 1
        and choice is not None
        and record is not None
        and not choice.covering
        and record.definition.array_pos < 0
        and not reads_documents(b)
        and not reads_fetched_meta(b)
    )


async def point_rows(
    index_scan: IndexScanServer,
    documents: DocumentAccess,
    memory: NodeMemory,
    plan: PhysicalPlan,
    ts: Timestamp | None,
    params: Any,
    budget: int,
    spill: bool,
) -> list[bytes] | None:
    """The result rows (encoded) of ``plan`` (``point_shaped``) read at ``ts``, or None
    when its index read does not end within ``POINT_ROWS`` entries or cannot be made on the
    loop now (a slice lock held elsewhere): run its leaf then."""
    assert plan.record is not None and plan.keyspace is not None and plan.query_id
    defn, leaf, b = plan.record.definition, plan.leaves[0], plan.bound
    spans = encode_decoded(plan.decoded_spans(), defn) or None
    entries = index_scan.read_local_now(defn.id, leaf.partitions, spans, ts, POINT_ROWS)
    if entries is None:
        return None
    docids = EntryDecoder(defn.desc, ()).docids(entries)
    docs = documents.get_many_now(plan.keyspace, docids) if docids else []
    if docs is None:  # another owner's: one GetMany each
        docs = await documents.get_many(plan.keyspace, docids)
    sub_fetch = blocking_fetch(documents, asyncio.get_running_loop())
    with memory.fragment(plan.query_id, budget, spill) as mem:
        rows = leaf_rows(
            b,
            params,
            plan.mode,
            plan.top,
            mem.budget(),
            fetched_scopes(b.alias, docs),
            decided=plan.decided,
            fetch=sub_fetch,
        )
        cells = [encode_row(row) for row in rows]
    if plan.offset or plan.limit is not None:  # the root's cut (the leaf cut at ``top``)
        end = None if plan.limit is None else plan.offset + plan.limit
        cells = cells[plan.offset : end]
    return cells
