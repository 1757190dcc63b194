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

from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from shardex.api.data import OpItem
from shardex.api.records import OP_DELETE
from shardex.api.validation import DEFAULT_MAX_DOC_BYTES as MAX_DOC
from shardex.api.validation import check_docid, encode_document
from shardex.client import Client
from shardex.client.bulk import BulkWriter
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.source.plan import plan_ranges
from shardex.pipeline.source.read import chunk_groups, client_for
from shardex.spark.options import ConnectorOptions, bad_option
from shardex.spark.schema import DELETED, ID

CHUNK = 1000  # rows per MutateMany round

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
        client = client_for(opts.source.endpoint)
        upserted = deleted = 0
        ops: list[OpItem] = []  # in row order: one document's rows apply in that order
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
            docid = check_docid(docid)
            if doc.pop(DELETED, None):
                ops.append(OpItem("delete", docid))
                deleted += 1
            else:
                body = {k: v for k, v in doc.items() if v is not None and k != ID}
                ops.append(OpItem("upsert", docid, encode_document(body, MAX_DOC, docid)))
                upserted += 1
            if len(ops) >= CHUNK:
                apply_ops(client, opts, ops)
                ops = []
        apply_ops(client, opts, ops)
        return Written(upserted, deleted)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.before is None:
            return
        delete_unwritten(self.opts, self.before)


def delete_unwritten(opts: ConnectorOptions, before: Timestamp) -> int:
    """Delete every document live at ``before`` that nobody wrote since (its CAS still the
    one it had then); returns how many were deleted."""
    client = client_for(opts.source.endpoint)
    ranges = plan_ranges(opts.keyspace, Timestamp(), before)
    n = 0
    for group in chunk_groups(client, opts.keyspace, ranges, CHUNK, snapshot=True):
        live = [
            OpItem("delete", c.docid, b"", c.cas)
            for chunk in group
            for c in chunk.changes
            if c.op != OP_DELETE
        ]
        n += apply_ops(client, opts, live)
    return n


def apply_ops(client: Client, opts: ConnectorOptions, ops: list[OpItem]) -> int:
    """``ops`` in one ``MutateMany`` per owner node (a partition's in order), at the
    write's durability. A deletion of a document already gone, or rewritten since the CAS
    it names, is no error; any other failure is raised. Returns how many applied."""
    if not ops:
        return 0
    writer = BulkWriter(client.rpc.router, opts.keyspace, opts.durability)
    results = client.rpc.run(writer.write_only_chunk(list(enumerate(ops))))
    n = 0
    for i, result in sorted(results.items()):
        if not isinstance(result, ShardexError):
            n += 1
        elif ops[i].kind != "delete" or result.code not in _GONE:
            result.details.setdefault("docid", ops[i].docid)
            raise result
    return n
