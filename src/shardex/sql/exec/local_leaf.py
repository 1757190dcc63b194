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
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.fragments import leaf_pipeline, root_pipeline
from shardex.sql.exec.plan import LEAF_KIND, ROOT_KIND
from shardex.sql.exec.rows import cell_chunks
from shardex.sql.protocol import QueryPlan

if TYPE_CHECKING:
    from shardex.index.scan_server import IndexScanServer

__all__ = ["run_local"]


def run_local(
    index_scan: IndexScanServer,
    documents: DocumentAccess,
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
        index_scan, documents, by_kind[LEAF_KIND].args, params, f"{name} leaf", cell_chunks
    )
    return root_pipeline(
        documents, by_kind[ROOT_KIND].args, params, f"{name} root", [leaf], cell_chunks
    )
