"""DataFrame writes: every row a document, upserted under its key column.

``append`` upserts each row (document id: the ``key`` column, default ``_id``; a row whose
``_deleted`` is true deletes that document instead, so a stream read from one keyspace
written to another carries its deletions). ``overwrite`` then makes the keyspace hold only
what was written: before any task runs, the writer records the keyspace's seqno vector; once
every task has committed, each document live at that vector is deleted under its CAS as of
the vector, so a document the write (or anyone) rewrote since is kept and the others go.
Neither mode is a transaction: an aborted job keeps the rows its tasks wrote, and a retried
task writes its rows again (upserts: the same result).

Row to document: the key column is the docid (``_id`` itself is not stored in the body;
another key column stays a field), ``_deleted`` is never stored, top-level nulls are left
out (a read shows a missing field as null anyway); nested rows become objects.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from shardex.api.records import OP_DELETE
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.source.plan import plan_ranges
from shardex.pipeline.source.read import chunk_groups, client_for
from shardex.spark.options import ConnectorOptions, bad_option
from shardex.spark.schema import DELETED, ID

CHUNK = 1000  # rows per upsert_many

_GONE = (ErrorCode.DOC_NOT_FOUND, ErrorCode.CAS_MISMATCH)


@dataclass
class Written(WriterCommitMessage):
    upserted: int
    deleted: int


class DocumentWriter(DataSourceWriter):
    """Created on the driver (``DataSource.writer``), pickled to every write task."""

    def __init__(self, opts: ConnectorOptions, schema: StructType, overwrite: bool) -> None:
        if opts.key not in schema.names:
            raise bad_option(
                "is not a column of the DataFrame",
                "key",
                opts.key,
                hint=f"one of {', '.join(schema.names)}",
            )
        self.opts = opts
        self.overwrite = overwrite
        # overwrite: what the keyspace held before this write (see the module doc)
        self.before: Timestamp | None = None
        if overwrite:
            with opts.connect() as client:
                self.before = client.high_seqnos(opts.keyspace)

    def write(self, iterator: Iterator[Row]) -> Written:
        opts = self.opts
        ks = client_for(opts.source.endpoint).keyspace(opts.keyspace)
        upserted = deleted = 0
        chunk: list[tuple[str, dict[str, Any]]] = []

        def flush() -> None:
            nonlocal upserted
            if chunk:
                ks.upsert_many(chunk, durability=opts.durability)
                upserted += len(chunk)
                chunk.clear()

        for row in iterator:
            doc = row.asDict(recursive=True)
            docid = doc.pop(opts.key) if opts.key == ID else doc.get(opts.key)
            if not isinstance(docid, str) or not docid:
                raise bad_option(
                    "a row has no document id in the key column",
                    "key",
                    opts.key,
                    hint="every row needs a non-empty string key (filter or fill nulls first)",
                )
            if doc.pop(DELETED, None):
                with contextlib.suppress(ShardexError):  # absent already: nothing to do
                    ks.delete(docid, durability=opts.durability)
                deleted += 1
                continue
            chunk.append((docid, {k: v for k, v in doc.items() if v is not None and k != ID}))
            if len(chunk) >= CHUNK:
                flush()
        flush()
        return Written(upserted, deleted)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.before is None:
            return
        delete_unwritten(self.opts, self.before)


def delete_unwritten(opts: ConnectorOptions, before: Timestamp) -> int:
    """Delete every document live at ``before`` that nobody wrote since (its CAS still the
    one it had then); returns how many were deleted."""
    client = client_for(opts.source.endpoint)
    ks = client.keyspace(opts.keyspace)
    ranges = plan_ranges(opts.keyspace, Timestamp(), before)
    n = 0
    for group in chunk_groups(client, opts.keyspace, ranges, CHUNK, snapshot=True):
        for chunk in group:
            for c in chunk.changes:
                if c.op == OP_DELETE:
                    continue
                try:
                    ks.delete(c.docid, c.cas, durability=opts.durability)
                    n += 1
                except ShardexError as exc:
                    if exc.code not in _GONE:  # rewritten or deleted since: keep / nothing
                        raise
    return n
