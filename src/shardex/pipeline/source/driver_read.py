"""Read and project a change range on the driver, without Arrow in between.

``read_and_project(client, keyspace, defs, start, end)`` returns the key versions of every
change in (start, end] for ``defs``, exactly what ``read_ranges`` + ``project_arrow(...,
error_rows=True)`` + ``from_arrow`` returned (the maintenance job's path for small batches,
its catch-up and the read-ahead), minus two conversions: the stream's changes go straight
into the projector's columns (no ``RecordBatch`` built and read back with ``to_pylist``), and
the projector's row tuples are kept (no ``to_arrow`` and ``from_arrow`` round trip). Measured
with ``python -m bench.diagnostics.pipeline_read``; figures in
``docs/decisions/0046-driver-read-and-project.md``.

The read is ``read.py``'s (same exactness checks, resumption and rollback errors):
ranges of at most ``small_range`` changes with one ``ReadRanges`` per owner node, larger
ones with a stream each; with ``concurrency`` = the number of ranges every partition's
stream opens at once, so their round trips overlap instead of queueing behind 16 slots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter

from shardex.api.records import OP_DELETE
from shardex.client import Client
from shardex.core.timestamp import Timestamp
from shardex.index.keyversion import BROADCAST, ERROR, KeyVersion
from shardex.meta.index_definition import IndexDefinition
from shardex.pipeline.project.projector import OP_UPSERT, _projector_for
from shardex.pipeline.source.plan import plan_ranges
from shardex.pipeline.source.read import (
    DEFAULT_MAX_ITEMS,
    DEFAULT_RESUME_TIMEOUT,
    DEFAULT_SMALL_RANGE,
    Chunk,
    chunk_groups,
)

__all__ = ["PROJECT_ROWS", "project_chunks", "read_and_project"]

_DOCID, _SEQNO, _OP, _BODY = (attrgetter(f) for f in ("docid", "seqno", "op", "body"))
_OPS = frozenset((OP_UPSERT, OP_DELETE))

# Chunks projected together: large enough that the projector's per-call cost is noise,
# small enough that projecting overlaps the streams still arriving.
PROJECT_ROWS = 4096


def project_chunks(defs: Sequence[IndexDefinition], chunks: Sequence[Chunk]) -> list[KeyVersion]:
    """Key versions of ``chunks`` for ``defs``; every evaluation error also becomes an
    ``ERROR`` row (entry = UTF-8 message), as ``project_arrow(..., error_rows=True)`` does."""
    docids: list[str] = []
    parts: list[int] = []
    seqnos: list[int] = []
    ops: list[str] = []
    bodies: list[bytes | None] = []
    # A column at a time, each filled by ``map`` (the loop in C, not one Python iteration
    # with four appends per change).
    for ch in chunks:
        changes = ch.changes
        parts.extend([ch.partition] * len(changes))
        docids.extend(map(_DOCID, changes))
        seqnos.extend(map(_SEQNO, changes))
        ops.extend(map(_OP, changes))
        bodies.extend(map(_BODY, changes))
    if not _OPS.issuperset(ops):  # the projector knows upserts and deletions only
        ops = [OP_DELETE if op == OP_DELETE else OP_UPSERT for op in ops]
    res = _projector_for(defs).project_columns(
        docids, parts, seqnos, ops, bodies, sample_limit=None
    )
    rows = res.rows
    for e in res.samples:
        rows.append(
            (e.index_id, BROADCAST, ERROR, e.message.encode(), e.docid, e.partition, e.seqno)
        )
    return rows


def read_and_project(
    client: Client,
    keyspace: str,
    defs: Sequence[IndexDefinition],
    start: Timestamp,
    end: Timestamp,
    *,
    max_items: int = DEFAULT_MAX_ITEMS,
    resume_timeout: float = DEFAULT_RESUME_TIMEOUT,
    small_range: int = DEFAULT_SMALL_RANGE,
    group_rows: int = PROJECT_ROWS,
    on_group: Callable[[list[KeyVersion]], None] | None = None,
) -> list[KeyVersion]:
    """The key versions of (start, end] of ``keyspace`` for ``defs`` (see the module doc),
    projected in groups of about ``group_rows`` changes. With ``on_group`` each group's key
    versions go to it as soon as they are projected (in order), and nothing is returned."""
    ranges = plan_ranges(keyspace, start, end)
    out: list[KeyVersion] = []
    if not ranges:
        return out
    for group in chunk_groups(
        client,
        keyspace,
        ranges,
        group_rows,
        concurrency=len(ranges),
        max_items=max_items,
        resume_timeout=resume_timeout,
        small_range=small_range,
    ):
        rows = project_chunks(defs, group)
        if on_group is None:
            out.extend(rows)
        else:
            on_group(rows)
    return out
