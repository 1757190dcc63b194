"""The SQL fragment kinds, registered on every member: ``sql.leaf`` (on indexer nodes) and
``sql.root`` (on the initiator). Each is ``fn(ctx) -> AsyncIterator[RecordBatch]`` for the
execution protocol; the row work runs in ``bridge.run_pipeline`` over ``pipeline``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shardex.core.expr import evaluate, static_path
from shardex.core.spans import Span
from shardex.core.timestamp import Timestamp
from shardex.core.values import MISSING
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.analyze import key_lookup, reads_meta
from shardex.sql.exec.bridge import run_pipeline
from shardex.sql.exec.documents import DocumentAccess
from shardex.sql.exec.entries import EntryDecoder
from shardex.sql.exec.fragment_rows import leaf_rows, root_rows
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.plan import LEAF_KIND, ROOT_KIND, bind_statement, lookup_keys
from shardex.sql.exec.rows import decode_row
from shardex.sql.exec.statements import prepared_off_loop
from shardex.sql.exec.tuning import check_tuning
from shardex.sql.planner.choose import key_exprs
from shardex.sql.protocol import FragmentContext, FragmentRegistry
from shardex.sql.syntax.bind import META_KEY

if TYPE_CHECKING:
    from shardex.index.scan_server import IndexScanServer

__all__ = ["lookup_rows", "named_keys", "sql_fragments"]

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
        a = ctx.args
        tuning = check_tuning(a.get("tuning"))
        b = await prepared_off_loop(
            a["sql"], lambda: bind_statement(a["sql"], a["dml"], cached=tuning["plan_cache"])
        )
        if index_scan is None:
            raise ShardexError(
                f"member {ctx.member_id} runs no index service but got a scan fragment",
                code=ErrorCode.QUERY_STATE,
                details={"member": ctx.member_id},
            )
        params = ctx.parameters
        desc = list(a["desc"])
        key_paths = [static_path(k) for k in key_exprs(tuple(a["keys"]))]
        spans = None
        if a["spans"]:
            spans = [Span(lo, hi, li, hi_inc) for lo, hi, li, hi_inc in a["spans"]]
        ts = None if a["ts"] is None else Timestamp.from_wire(a["ts"])
        alias, keyspace, covering = b.alias, a["keyspace"], a["covering"]
        ordered = bool(a.get("ordered"))
        fetch = documents.get_many if tuning["get_many"] else documents.get_each

        decoder = EntryDecoder(desc, key_paths)
        meta = reads_meta(b)

        async def scope_rows() -> AsyncIterator[list[Any]]:
            blocks = index_scan.read_local(
                a["index_id"],
                a["partitions"],
                spans,
                ts,
                ordered=ordered,
                block_rows=scan_block_rows(a["top"]),
            )
            async for block in blocks:
                if covering:
                    yield decoder.covered_rows(block, alias, meta)
                    continue
                docs = await fetch(keyspace, decoder.docids(block))
                yield [{alias: doc, META_KEY: {"id": docid}} for docid, doc in docs]

        mode, top = a["mode"], a["top"]
        with memory.fragment(str(ctx.query_id), a["budget"], a.get("spill", True)) as mem:
            batches = run_pipeline(
                lambda ins: leaf_rows(
                    b, params, mode, top, mem.budget(), ins[0], presorted=ordered
                ),
                [scope_rows()],
                name=f"{ctx.query_id} leaf",
                inline=tuning["inline"],
            )
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    yield batch

    async def root(ctx: FragmentContext) -> AsyncIterator[pa.RecordBatch]:
        a = ctx.args
        tuning = check_tuning(a.get("tuning"))
        b = await prepared_off_loop(
            a["sql"], lambda: bind_statement(a["sql"], a["dml"], cached=tuning["plan_cache"])
        )
        params = ctx.parameters
        source = a["source"]
        sources: list[AsyncIterator[list[Any]]]
        decode = None
        if source == "index":
            # Encoded rows, decoded afresh for each inline run: the final aggregate merges
            # into the partial states it reads, so a restarted run needs untouched ones.
            sources = [_cells_by_batch(ctx.inputs[e]) for e in sorted(ctx.inputs)]
            decode = decode_row
        elif source == "keys":
            fetch = documents.get_many if tuning["get_many"] else documents.get_each
            sources = [lookup_rows(b, params, a["keyspace"], fetch)]
        elif source == "expr":
            assert b.from_ is not None and b.from_.source is not None
            value = evaluate(b.from_.source, {}, params=params)
            items = (
                value if isinstance(value, list) else [] if value in (MISSING, None) else [value]
            )
            sources = [_once([{b.alias: item, META_KEY: {}} for item in items])]
        else:
            sources = [_once([{}])]
        mode, limit, offset = a["mode"], a["limit"], a["offset"]
        mode = "local" if source != "index" else mode
        with memory.fragment(str(ctx.query_id), a["budget"], a.get("spill", True)) as mem:
            batches = run_pipeline(
                lambda ins: root_rows(b, params, mode, limit, offset, mem.budget(), ins),
                sources,
                name=f"{ctx.query_id} root",
                inline=tuning["inline"],
                decode=decode,
            )
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    yield batch

    return FragmentRegistry({LEAF_KIND: leaf, ROOT_KIND: root})


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
) -> AsyncIterator[list[Any]]:
    """The scope rows of a key lookup (``keys``: the ids it names, when known already)."""
    if keys is None:
        keys = named_keys(b, params)
    docs = dict(await fetch(keyspace, list(dict.fromkeys(keys))))
    yield [{b.alias: docs[k], META_KEY: {"id": k}} for k in keys if k in docs]


def named_keys(b: Any, params: Any) -> list[str]:
    """The document ids a key-lookup SELECT names, in its order."""
    lookup = key_lookup(b)
    assert lookup is not None
    return lookup_keys(lookup.keys, params, dedupe=lookup.source == "meta_id")
