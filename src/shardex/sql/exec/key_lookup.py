"""Key lookups on the initiator: a SELECT naming at most ``plan.INLINE_KEYS`` documents by
key (``USE KEYS``, ``META().id = $1``) runs on the node's loop, with no fragment and no
thread: the documents from their owners (one ``GetMany`` each), then the root's operators
over them. When every document is this node's own (a client sends such a statement to the
key's owner: ``client.routes``), ``read_now`` answers it within the loop turn that received
it: no task, no message, no await (decision 0108)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from shardex.sql.exec.analyze import reads_fetched_meta
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.fragment_rows import root_rows
from shardex.sql.exec.fragments import lookup_rows, lookup_scopes, named_keys
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.plan import INLINE_KEYS, PhysicalPlan
from shardex.sql.exec.rows import encode_row
from shardex.sql.exec.subqueries import reads_documents
from shardex.sql.protocol.initiator import cancelled

__all__ = ["KeyLookups"]


class KeyLookups:
    def __init__(
        self, documents: DocumentAccess, memory: NodeMemory, new_query_id: Callable[[], object]
    ) -> None:
        self.documents = documents
        self.memory = memory
        self._new_query_id = new_query_id

    def keys_of(self, plan: PhysicalPlan, params: Any) -> list[str] | None:
        """The ids ``plan`` reads when it runs as a key lookup here (it is then marked
        ``inline`` and given its query id), else None."""
        if plan.source != "keys" or not plan.tuning["inline"] or reads_documents(plan.bound):
            return None  # (a USE KEYS subquery waits for reads: not on the loop)
        keys = named_keys(plan.bound, params)
        if len(keys) > INLINE_KEYS:
            return None
        plan.inline = True
        # No QueryExecute, but an id all the same: the reply and the metrics name every
        # SELECT by one (an ExchangeStats for it finds no streams).
        plan.query_id = str(self._new_query_id())
        return keys

    def read_now(
        self, plan: PhysicalPlan, keys: list[str], params: Any, quota: int, spill: bool
    ) -> list[bytes] | None:
        """The result rows (encoded) when every document is this node's and readable now;
        None: ``rows`` does it."""
        assert plan.keyspace is not None
        if not plan.tuning["get_many"] or reads_fetched_meta(plan.bound):
            return None  # META().cas / expiration: ``rows`` fetches them with the documents
        docs = self.documents.get_many_now(plan.keyspace, keys)
        if docs is None:
            return None
        return self._cells(plan, lookup_scopes(plan.bound, dict(docs), keys), params, quota, spill)

    async def rows(
        self,
        plan: PhysicalPlan,
        keys: list[str],
        params: Any,
        timeout: float,
        quota: int,
        spill: bool,
    ) -> AsyncIterator[list[bytes]]:
        """The result rows (encoded, one chunk): the documents from their owners, within
        the query's ``timeout``; the work after the fetch is bounded by ``INLINE_KEYS``
        rows."""
        assert plan.keyspace is not None
        docs, b = self.documents, plan.bound
        fetch = docs.get_many if plan.tuning["get_many"] else docs.get_each
        try:
            async with asyncio.timeout(timeout):
                chunks = [
                    c
                    async for c in lookup_rows(
                        b, params, plan.keyspace, fetch, keys, meta=docs.get_many_meta
                    )
                ]
        except TimeoutError:
            raise cancelled(
                f"query timed out after {timeout}s",
                "timeout",
                timeout=timeout,
                hint="raise the query timeout or make the query cheaper",
            ) from None
        yield self._cells(plan, [row for chunk in chunks for row in chunk], params, quota, spill)

    def _cells(
        self, plan: PhysicalPlan, scopes: list[Any], params: Any, quota: int, spill: bool
    ) -> list[bytes]:
        """The root's operators over the scope rows, encoded."""
        b = plan.bound
        with self.memory.fragment(plan.query_id, quota, spill) as mem:
            budget = mem.budget()
            rows = root_rows(b, params, "local", plan.limit, plan.offset, budget, [iter(scopes)])
            return [encode_row(r) for r in rows]
