"""Batch and streaming reads of documents: the change source's reading, rows of documents.

Batch (``DocumentReader``): ``partitions()`` records the keyspace's seqno vector (its high
seqnos, or the ``snapshot_ts`` option) and plans one Spark partition per data partition;
each task reads its partition's documents as of that vector with the change source's
snapshot read (``pipeline/source/read.py``: the change log up to the vector, last version
per docid, deletions dropped), so the DataFrame is one consistent snapshot of the keyspace.
When an index serves the filters Spark pushes (``filters.py``), ``partitions()`` scans it
instead (``consistency``: not_bounded, or request_plus: every write acknowledged before the
scan) and groups the docids by data partition; each task then fetches its documents and
keeps those that still pass the pushed filters. Those rows are each document's version when
fetched, not one vector's: an index read trades the snapshot for reading only what matches.

Streaming (``DocumentStreamReader``): the change source's partitioned stream reader (offsets
are seqno vectors as JSON, one task per owner node), each change a row: inserts and updates
as the document, deletions as ``_deleted = true`` with only ``_id`` set.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from shardex.api.data import Get, GetMany, GetManyReply, GetReply
from shardex.api.records import OP_DELETE
from shardex.client import Client
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.partitioning import partition_of
from shardex.pipeline.source.checks import Chunk
from shardex.pipeline.source.datasource import ShardexStreamReader
from shardex.pipeline.source.options import ChangeRangesPartition, with_options
from shardex.pipeline.source.plan import plan_ranges
from shardex.pipeline.source.read import chunk_groups, client_for
from shardex.pipeline.source.types import Endpoint, PartitionRange
from shardex.spark.filters import IndexPlan, active_indexes, matches, plan_index
from shardex.spark.options import ConnectorOptions, bad_option
from shardex.spark.schema import DELETED, Converter, decode, infer_schema

BLOCK_ROWS = 4096  # rows per RecordBatch handed to Spark
FETCH_CHUNK = 500  # docids fetched per round in an index read


class SnapshotPartition(InputPartition):
    """One data partition's documents as of ``range_.end_seqno`` (on ``range_.end_uuid``)."""

    def __init__(self, endpoint: Endpoint, range_: PartitionRange) -> None:
        super().__init__(range_.partition)
        self.endpoint = endpoint
        self.range_ = range_

    def __repr__(self) -> str:
        r = self.range_
        return f"SnapshotPartition(partition={r.partition}, seqno={r.end_seqno}, uuid={r.end_uuid})"


class FetchPartition(InputPartition):
    """The documents of one data partition an index scan found: fetched, then rechecked."""

    def __init__(
        self, endpoint: Endpoint, partition: int, docids: Sequence[str], pushed: Sequence[Filter]
    ) -> None:
        super().__init__(partition)
        self.endpoint = endpoint
        self.docids = list(docids)
        self.pushed = tuple(pushed)

    def __repr__(self) -> str:
        return f"FetchPartition(partition={self.value}, docids={len(self.docids)})"


def change_rows(converter: Converter, chunks: Sequence[Chunk], *, deletions: bool) -> list[dict]:
    rows: list[dict] = []
    for chunk in chunks:
        for c in chunk.changes:
            deleted = c.op == OP_DELETE
            if deleted and not deletions:
                continue
            rows.append(converter.row(c.docid, None if deleted else c.body, deleted))
    return rows


def _blocks(converter: Converter, rows: Iterator[dict]) -> Iterator[pa.RecordBatch]:
    block: list[dict] = []
    for row in rows:
        block.append(row)
        if len(block) >= BLOCK_ROWS:
            yield converter.batch(block)
            block = []
    if block:
        yield converter.batch(block)


class DocumentReader(DataSourceReader):
    """Batch reads (see the module doc). Pickled to the tasks: holds no client."""

    def __init__(self, opts: ConnectorOptions, schema: StructType) -> None:
        Converter(schema)  # a column type no document can fill fails the planning, not a task
        self.opts = opts
        self.schema = schema
        self.plan: IndexPlan | None = None

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Keep the filters an index serves (``filters.plan_index``); Spark evaluates the
        rest. Runs once, on the driver, while Spark plans the query."""
        opts = self.opts
        with opts.connect() as client:
            indexes = active_indexes(client, opts.keyspace)
        self.plan = plan_index(
            filters, self.schema, indexes, keyspace=opts.keyspace, use_index=opts.index
        )
        pushed = () if self.plan is None else self.plan.pushed
        for f in filters:
            if not any(f is p for p in pushed):
                yield f

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        if opts.index is not None and self.plan is None:
            # No filter reached pushFilters: the forced index must still serve the read.
            with opts.connect() as client:
                indexes = active_indexes(client, opts.keyspace)
            self.plan = plan_index(
                [], self.schema, indexes, keyspace=opts.keyspace, use_index=opts.index
            )
        if self.plan is not None:
            return self._index_partitions(self.plan)
        with opts.connect() as client:
            vector = opts.snapshot_ts() or client.high_seqnos(opts.keyspace)
        endpoint = opts.source.endpoint
        return [
            SnapshotPartition(endpoint, r) for r in plan_ranges(opts.keyspace, Timestamp(), vector)
        ]

    def _index_partitions(self, plan: IndexPlan) -> list[InputPartition]:
        opts = self.opts
        by_partition: dict[int, dict[str, None]] = {}
        with opts.connect() as client:
            meta, _ = client.rpc.run(client.rpc.router.keyspace(opts.keyspace))
            rows = client.scan(
                opts.keyspace,
                plan.index,
                plan.spans,
                consistency=opts.consistency,
                covering=False,
                ordered=False,
            )
            for row in rows:
                docid = row["docid"]
                by_partition.setdefault(partition_of(docid, meta.num_partitions), {})[docid] = None
        endpoint = opts.source.endpoint
        return [
            FetchPartition(endpoint, p, list(ids), plan.pushed)
            for p, ids in sorted(by_partition.items())
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        converter = Converter(self.schema)
        if isinstance(partition, SnapshotPartition):
            return _blocks(converter, self._snapshot_rows(converter, partition))
        if isinstance(partition, FetchPartition):
            return _blocks(converter, _fetched_rows(converter, partition))
        return iter(())  # Spark's placeholder when partitions() planned nothing

    def _snapshot_rows(self, converter: Converter, part: SnapshotPartition) -> Iterator[dict]:
        client = client_for(part.endpoint)
        for group in chunk_groups(
            client, part.endpoint.keyspace, [part.range_], BLOCK_ROWS, snapshot=True
        ):
            yield from change_rows(converter, group, deletions=False)


def _fetched_rows(converter: Converter, part: FetchPartition) -> Iterator[dict]:
    """The partition's documents by ``GetMany`` to its owner (one request per chunk; the
    docids are all of one partition), rechecked against the pushed filters. A docid the
    reply could not answer (its partition moved meanwhile) is read alone, re-routed."""
    client = client_for(part.endpoint)
    keyspace = part.endpoint.keyspace
    router = client.rpc.router
    for i in range(0, len(part.docids), FETCH_CHUNK):
        chunk = part.docids[i : i + FETCH_CHUNK]
        msg = GetMany(keyspace=keyspace, docids=chunk)
        ask = router.to_owner(keyspace, chunk[0], msg, GetManyReply, idempotent=True)
        reply = client.rpc.run(ask)
        failed = {e.index for e in reply.errors}
        for j, (docid, body) in enumerate(zip(chunk, reply.bodies, strict=True)):
            if j in failed:
                body = _get_alone(client, keyspace, docid)
            if body is None:
                continue  # deleted since the scan
            row = converter.row(docid, body)
            if matches(row, part.pushed):
                yield row


def _get_alone(client: Client, keyspace: str, docid: str) -> bytes | None:
    try:
        return client.rpc.run(
            client.rpc.router.to_owner(
                keyspace, docid, Get(keyspace=keyspace, docid=docid), GetReply, idempotent=True
            )
        ).body
    except ShardexError as exc:
        if exc.code is ErrorCode.DOC_NOT_FOUND:
            return None
        raise


class DocumentStreamReader(ShardexStreamReader):
    """The change source's partitioned stream reader, its rows documents (see the module
    doc). The schema must hold the ``_deleted`` boolean column."""

    def __init__(self, opts: ConnectorOptions, schema: StructType) -> None:
        if DELETED not in schema.names:
            raise bad_option(
                f"a stream's schema needs the {DELETED!r} boolean column",
                "schema",
                hint=f"add `{DELETED} boolean` to the schema given with .schema(...)",
            )
        Converter(schema)  # a column type no document can fill fails here, not in a task
        # A micro-batch is small: one task per owner node, as the index pipeline reads.
        super().__init__(with_options(opts.source, mode="changes", tasks="owner"))
        self.schema = schema

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ChangeRangesPartition)
        converter = Converter(self.schema)
        endpoint = partition.endpoint
        groups = chunk_groups(client_for(endpoint), endpoint.keyspace, partition.ranges, BLOCK_ROWS)
        for group in groups:
            rows = change_rows(converter, group, deletions=True)
            if rows:
                yield converter.batch(rows)


def sample_schema(opts: ConnectorOptions) -> StructType:
    """The schema of the keyspace's most recent documents: up to ``sample_size`` of them,
    the last changes of every partition (``infer_schema``). A partition whose log was purged
    past that point is read from its start instead, up to the sample's size."""
    with opts.connect() as client:
        high = client.high_seqnos(opts.keyspace)
        per = max(1, math.ceil(opts.sample_size / max(1, len(high))))
        # (high - per, high] of each partition; a start above 0 is on the current branch
        recent = [
            PartitionRange(p, start, e.uuid if start else 0, e.seqno, e.uuid)
            for p, e in high.items()
            if e.seqno > 0
            for start in [max(0, e.seqno - per)]
        ]
        try:
            bodies = _sample(client, opts, recent)
        except ShardexError as exc:
            if exc.code is not ErrorCode.ROLLBACK:  # below the purge seqno
                raise
            whole = [PartitionRange(r.partition, 0, 0, r.end_seqno, r.end_uuid) for r in recent]
            bodies = _sample(client, opts, whole)
    docs = [decode(b) for b in bodies]
    return infer_schema(d for d in docs if isinstance(d, dict))


def _sample(client: Client, opts: ConnectorOptions, ranges: list[PartitionRange]) -> list[bytes]:
    """The latest body of each live document in ``ranges``, at most ``sample_size``."""
    latest: dict[str, bytes | None] = {}
    for group in chunk_groups(client, opts.keyspace, ranges, BLOCK_ROWS):
        for chunk in group:
            for c in chunk.changes:
                latest[c.docid] = None if c.op == OP_DELETE else c.body
        if len(latest) >= 2 * opts.sample_size:
            break  # closing the reads early cancels them
    return [b for b in latest.values() if b is not None][: opts.sample_size]
