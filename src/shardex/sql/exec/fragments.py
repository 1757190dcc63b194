"""The SQL fragment kinds, registered on every member: ``sql.leaf`` (on indexer nodes) and
``sql.root`` (on the initiator). Each is ``fn(ctx) -> AsyncIterator[RecordBatch]`` for the
execution protocol; the row work runs in ``bridge.run_pipeline`` over ``pipeline``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardex.core.expr import evaluate
from shardex.core.values import MISSING
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.analyze import reads_fetched_meta, reads_meta
from shardex.sql.exec.bridge import Pack, close_all, run_pipeline
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.entries import EntryDecoder, key_projection
from shardex.sql.exec.fragment_rows import late_leaf_rows, leaf_rows, root_rows
from shardex.sql.exec.join_exchange import JOIN_KIND, join_fragment, leaf_args, leaf_pack
from shardex.sql.exec.late import late_root_values
from shardex.sql.exec.leaf_spec import LeafSpec, leaf_spec
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.plan import (
    LEAF_KIND,
    ROOT_KIND,
    bind_statement,
    lookup_keys,
    statement_facts,
)
from shardex.sql.exec.rows import cells_batch, decode_row, to_batches
from shardex.sql.exec.statements import prepared_off_loop
from shardex.sql.exec.subqueries import blocking_fetch, expression_runner, reads_documents
from shardex.sql.exec.tuning import check_tuning
from shardex.sql.protocol import FragmentContext, FragmentRegistry
from shardex.sql.syntax.bind import META_KEY
from shardex.sql.syntax.subquery import running_subqueries

if TYPE_CHECKING:
    from shardex.index.scan_server import IndexScanServer

__all__ = [
    "concatenated",
    "fetched_scopes",
    "leaf_pipeline",
    "lookup_rows",
    "lookup_scopes",
    "named_keys",
    "root_pipeline",
    "run_leaf",
    "sql_fragments",
]

# ``DocumentAccess.get_many_meta``: (docid, document, META()) of the docids that exist
MetaFetch = Callable[[str, list[str]], Awaitable[list[tuple[str, Any, dict[str, Any]]]]]

SCAN_BLOCK_ROWS = 500
MIN_SCAN_BLOCK_ROWS = 16


def scan_block_rows(top: int | None) -> int:
    """Entries a leaf reads per block: with a known row limit, about that many (a LIMIT 20
    reads and fetches ~20, and the next block only if the filter dropped some), else
    ``SCAN_BLOCK_ROWS``. The pipeline pulls blocks lazily, so the index scan stops when the
    leaf has its rows: the limit reaches the scan itself."""
    if top is None:
        return SCAN_BLOCK_ROWS
    return max(MIN_SCAN_BLOCK_ROWS, min(SCAN_BLOCK_ROWS, top))


def sql_fragments(
    index_scan: IndexScanServer | None, documents: DocumentAccess, memory: NodeMemory
) -> FragmentRegistry:
    """``memory``: the node's SQL memory; each fragment draws on its query's account there,
    released (spill files removed) when the fragment ends, however it ends."""

    async def leaf(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        if index_scan is None:
            raise ShardexError(
                f"member {ctx.member_id} runs no index service but got a scan fragment",
                code=ErrorCode.QUERY_STATE,
                details={"member": ctx.member_id},
            )
        # A side of a join between fragments: its rows partitioned among the join's members.
        args = leaf_args(ctx.args, ctx.member_id)
        pack = await leaf_pack(ctx, to_batches)
        batches = leaf_pipeline(
            index_scan, documents, memory, args, ctx.parameters, str(ctx.query_id), pack
        )
        async with contextlib.aclosing(batches):
            async for batch in batches:
                yield batch

    async def join(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        batches = join_fragment(ctx, documents, memory)
        async with contextlib.aclosing(batches):
            async for batch in batches:
                yield batch

    async def root(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        inputs = [_cells_by_batch(ctx.inputs[e]) for e in sorted(ctx.inputs)]
        if ctx.args.get("by_sender") and ctx.by_sender is not None:
            # Several fragment instances on one edge (the join fragments): an input each,
            # as separate leaves' edges are, so their sorted runs merge.
            inputs = [_cells_by_batch(b) for e in sorted(ctx.inputs) for b in ctx.by_sender(e)]
        batches = root_pipeline(
            documents, memory, ctx.args, ctx.parameters, str(ctx.query_id), inputs
        )
        async with contextlib.aclosing(batches):
            async for batch in batches:
                yield batch

    return FragmentRegistry({LEAF_KIND: leaf, ROOT_KIND: root, JOIN_KIND: join})


async def leaf_pipeline(
    index_scan: IndexScanServer,
    documents: DocumentAccess,
    memory: NodeMemory,
    a: dict[str, Any],
    params: Any,
    query: str,
    pack: Pack = to_batches,
) -> AsyncIterator[Any]:
    """A leaf's output (``args`` ``a`` of a ``sql.leaf`` fragment of query ``query``)
    ``pack``ed: ``run_leaf`` of the arguments decoded."""
    spec = await leaf_spec(a)
    batches = run_leaf(index_scan, documents, memory, spec, params, query, pack)
    async with contextlib.aclosing(batches):
        async for batch in batches:
            yield batch


async def run_leaf(
    index_scan: IndexScanServer,
    documents: DocumentAccess,
    memory: NodeMemory,
    spec: LeafSpec,
    params: Any,
    query: str,
    pack: Pack = to_batches,
) -> AsyncIterator[Any]:
    """The leaf ``spec`` of query ``query``, its output ``pack``ed: scan the local slices at
    the TS, fetch documents unless covering, then ``leaf_rows``, within the query's account
    of the node's ``memory`` (released, spill files removed, however it ends)."""
    b, tuning = spec.b, spec.tuning
    alias, keyspace, covering, late = b.alias, spec.keyspace, spec.covering, spec.late
    fetch = documents.get_many if tuning["get_many"] else documents.get_each
    decoder = EntryDecoder(spec.desc, spec.key_paths)
    meta = (covering or late) and reads_meta(b)
    fetched_meta = reads_fetched_meta(b)
    top = spec.top
    mode, ordered, decided = spec.mode, spec.ordered, spec.decided
    # A covering scan whose spans decide WHERE and whose terms each read one key part or
    # the docid: result values straight from the keys, no scope row or projection per row.
    picks = None
    if covering and decided and mode == "rows" and not late and tuning["key_projection"]:
        picks = key_projection(b, spec.key_paths)

    async def scope_rows() -> AsyncIterator[list[Any]]:
        seen: set[str] | None = set() if spec.once else None
        blocks = index_scan.read_local(
            spec.index_id,
            spec.partitions,
            spec.spans,
            spec.ts,
            ordered=spec.ordered,
            block_rows=scan_block_rows(top),
            # Storage reads as small as the blocks: a leaf after 20 rows no longer reads
            # 512 entries of each slice for them.
            chunk_rows=None if top is None else scan_block_rows(top),
        )
        async for block in blocks:
            if picks is not None:
                yield decoder.projected(block, picks)
                continue
            if covering or late:
                yield decoder.covered_rows(block, alias, meta or late)
                continue
            docids = decoder.docids(block)
            if seen is not None:  # an array index: each document once, at its first entry
                docids = [d for d in dict.fromkeys(docids) if d not in seen]
                seen.update(docids)
            if fetched_meta:  # META().cas / expiration: each document's from its owner
                metas = await documents.get_many_meta(keyspace, docids)
                yield [{alias: doc, META_KEY: m} for _, doc, m in metas]
                continue
            yield fetched_scopes(alias, await fetch(keyspace, docids))

    sub_fetch = blocking_fetch(documents, asyncio.get_running_loop())
    with memory.fragment(query, spec.budget, spec.spill) as mem:

        def rows(ins: list[Any]) -> Any:
            if picks is not None:
                return ins[0] if top is None else itertools.islice(ins[0], top)
            if late:
                assert top is not None
                return late_leaf_rows(b, params, top, mem.budget(), ins[0], presorted=ordered)
            return leaf_rows(
                b,
                params,
                mode,
                top,
                mem.budget(),
                ins[0],
                presorted=ordered,
                decided=decided,
                fetch=sub_fetch,
            )

        batches = run_pipeline(
            rows,
            [scope_rows()],
            name=f"{query} leaf",
            # USE KEYS subqueries wait for document reads: never on the loop (decision 0120).
            inline=tuning["inline"] and not reads_documents(b),
            pack=pack,
            # Without a row limit the leaf's operators read every scope row.
            reads_all=top is None,
        )
        async with contextlib.aclosing(batches):
            async for batch in batches:
                yield batch


def fetched_scopes(alias: str, docs: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """A leaf's scope rows of the documents it fetched (``(docid, document)``)."""
    return [{alias: doc, META_KEY: {"id": docid}} for docid, doc in docs]


async def root_pipeline(
    documents: DocumentAccess,
    memory: NodeMemory,
    a: dict[str, Any],
    params: Any,
    query: str,
    inputs: list[AsyncIterator[list[bytes]]],
    pack: Pack = to_batches,
    pack_cells: Callable[[list[bytes]], Any] = cells_batch,
) -> AsyncIterator[Any]:
    """The root's output (``args`` ``a`` of a ``sql.root`` fragment of query ``query``)
    ``pack``ed, from its leaves' encoded rows (``inputs``, one per leaf) or its own source
    (keys, an expression, nothing), within the query's account of the node's ``memory``.
    ``pack_cells``: ``pack`` for rows encoded already."""
    tuning = check_tuning(a.get("tuning"))
    b = await prepared_off_loop(
        a["sql"], lambda: bind_statement(a["sql"], a["dml"], cached=tuning["plan_cache"])
    )
    source = a["source"]
    sources: list[AsyncIterator[list[Any]]]
    decode = None
    if source == "index":
        # Encoded rows, decoded afresh for each inline run: the final aggregate merges
        # into the partial states it reads, so a restarted run needs untouched ones.
        sources = inputs
        decode = decode_row
    elif source == "keys":
        fetch = documents.get_many if tuning["get_many"] else documents.get_each
        sources = [lookup_rows(b, params, a["keyspace"], fetch, meta=documents.get_many_meta)]
    elif source == "expr":
        assert b.from_ is not None and b.from_.source is not None
        with running_subqueries(expression_runner):  # FROM (SELECT ...): evaluated once
            value = evaluate(b.from_.source, {}, params=params)
        items = value if isinstance(value, list) else [] if value is MISSING else [value]
        sources = [_once([{b.alias: item, META_KEY: {}} for item in items])]
    else:
        sources = [_once([{}])]
    mode, limit, offset = a["mode"], a["limit"], a["offset"]
    mode = "local" if source != "index" else mode
    if source == "index" and a.get("late") and limit:
        fetch = documents.get_many if tuning["get_many"] else documents.get_each
        values = await late_root_values(
            b, params, a["keyspace"], fetch, sources, decode_row, limit, offset
        )
        for batch in pack(values):
            yield batch
        return
    if mode == "rows" and not b.distinct:
        # The leaves' rows are the result's: passed on still encoded (no decode and
        # encode again), in the order ``root_rows`` would give, offset and limit counted.
        async for cells in concatenated(sources, offset, limit):
            yield pack_cells(cells)
        return
    sub_fetch = blocking_fetch(documents, asyncio.get_running_loop())
    with memory.fragment(query, a["budget"], a.get("spill", True)) as mem:
        batches = run_pipeline(
            lambda ins: root_rows(b, params, mode, limit, offset, mem.budget(), ins, sub_fetch),
            sources,
            name=f"{query} root",
            inline=tuning["inline"] and not reads_documents(b),
            decode=decode,
            pack=pack,
        )
        async with contextlib.aclosing(batches):
            async for batch in batches:
                yield batch


async def concatenated(
    sources: list[AsyncIterator[list[bytes]]], offset: int, limit: int | None
) -> AsyncIterator[list[bytes]]:
    """The sources' cells one source after another, the first ``offset`` skipped, at most
    ``limit`` passed; every source closed at the end."""
    skip, left = offset, limit
    try:
        for source in sources:
            async for chunk in source:
                if skip:
                    dropped = min(skip, len(chunk))
                    chunk, skip = chunk[dropped:], skip - dropped
                if left is not None:
                    chunk, left = chunk[:left], left - min(left, len(chunk))
                if chunk:
                    yield chunk
                if left == 0:
                    return
    finally:
        await close_all(sources)


async def _once(rows: list[Any]) -> AsyncIterator[list[Any]]:
    yield rows


async def _cells_by_batch(batches: AsyncIterator[pa.RecordBatch]) -> AsyncIterator[list[Any]]:
    async for batch in batches:
        yield batch.column(0).to_pylist()


async def lookup_rows(
    b: Any,
    params: Any,
    keyspace: str,
    fetch: Callable[[str, list[str]], Awaitable[list[tuple[str, Any]]]],
    keys: list[str] | None = None,
    meta: MetaFetch | None = None,
) -> AsyncIterator[list[Any]]:
    """The scope rows of a key lookup (``keys``: the ids it names, when known already).
    ``meta``: the fetch of documents with their META() (``DocumentAccess.get_many_meta``),
    used when the query reads ``META().cas`` or ``META().expiration``."""
    if keys is None:
        keys = named_keys(b, params)
    unique = list(dict.fromkeys(keys))
    if meta is not None and reads_fetched_meta(b):
        found = await meta(keyspace, unique)
        docs = {d: doc for d, doc, _ in found}
        yield lookup_scopes(b, docs, keys, {d: m for d, _, m in found})
        return
    docs = dict(await fetch(keyspace, unique))
    yield lookup_scopes(b, docs, keys)


def lookup_scopes(
    b: Any, docs: dict[str, Any], keys: list[str], metas: dict[str, Any] | None = None
) -> list[Any]:
    """A key lookup's scope rows: ``keys`` in order (repeats kept), those found in ``docs``;
    their META() from ``metas`` when given, else just the id."""
    if metas is not None:
        return [{b.alias: docs[k], META_KEY: metas[k]} for k in keys if k in docs]
    return [{b.alias: docs[k], META_KEY: {"id": k}} for k in keys if k in docs]


def named_keys(b: Any, params: Any) -> list[str]:
    """The document ids a key-lookup SELECT names, in its order."""
    lookup = statement_facts(b).key_lookup
    assert lookup is not None
    return lookup_keys(lookup.keys, params, dedupe=lookup.source == "meta_id")
