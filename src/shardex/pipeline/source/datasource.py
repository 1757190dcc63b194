"""``ShardexChangeSource``: the keyspace change streams as a PySpark Python data source.

    spark.dataSource.register(ShardexChangeSource)          # build_spark_session does it
    # every mutation between two timestamps (batch)
    spark.read.format("shardex").option("cluster_dir", d).option("keyspace", "users")
         .option("start_ts", json.dumps(ts1.to_json())).option("end_ts", ...).load()
    # the documents as of T0, for an initial index build (batch)
    spark.read.format("shardex").options(..., mode="snapshot", snapshot_ts=...).load()
    # continuous: offsets are the per-partition (seqno, uuid) vector
    spark.readStream.format("shardex").options(..., starting_offsets="earliest").load()

Schema (``SCHEMA_DDL``): docid, partition, seqno, uuid, cas, deleted, body (the stored JSON
bytes, null for a deletion; the projector decodes each document once).

Options (strings, as Spark passes them):

* where: ``cluster_dir`` (a local cluster directory: addresses and secret are read from it on
  the driver) or ``addresses`` (comma-separated ``host:port``) with ``secret`` or
  ``secret_file``; ``keyspace`` (required).
* batch: ``mode`` = ``changes`` (default: every record in (``start_ts``, ``end_ts``];
  defaults: from zero, to the current high seqnos) or ``snapshot`` (documents as of
  ``snapshot_ts``, default the current high seqnos; tombstones dropped, one row per docid).
* streaming: ``starting_offsets`` = ``earliest`` (default: all partitions from seqno 0),
  ``latest`` (the current high seqnos) or a timestamp JSON; ``max_records_per_batch`` (a
  ReadMaxRows limit spread over the partitions; seqnos are dense so the cut is exact);
  ``latest_offset_interval_ms`` (default 20: reuse the last high-seqno answer this long;
  Spark polls ``latestOffset`` about 50 times a second when idle); ``reader`` =
  ``partitioned`` (default: offsets on the driver, Spark tasks read the ranges in Python
  workers), ``driver`` (``SimpleDataSourceStreamReader``: the driver reads the ranges, no
  read tasks) or ``follow`` (driver-side too, fed by live per-partition streams: the lowest
  floor, but costly for the data node at high write rates; see ``follow.py``).
* projected reads (``projected.py``): ``project`` (index definitions as JSON,
  ``ProjectSpec.definitions_option``): the read task evaluates them and Spark gets key
  versions (``KEY_VERSION_DDL``) instead of changes; with ``load`` too (``LoadSpec``, an
  initial build: mode=snapshot, the same TS as ``snapshot_ts``) the task also sends the
  Upserts to the slices' indexers and Spark gets one row of counts per read batch.
* tuning: ``tasks`` = ``owner`` (default: one task per owner node), ``partition`` or a
  number; ``concurrency`` (streams open at once per task), ``max_items``,
  ``request_timeout``, ``resume_timeout``; ``stats_path`` (the stream readers write their
  call counters there as JSON: the benchmark reads them); ``high_seqnos`` = ``owners``
  (default: each owner asked directly) or ``gather`` (one data node gathers).

Timestamps are JSON ``{"<partition>": [seqno, uuid], ...}`` (``Timestamp.to_json``). Offsets
use the same form with every partition present, string keys in numeric order, so Spark's
JSON round trip and its string comparison of offsets are stable.

Errors: a ROLLBACK (the partition's history no longer contains the offset's (seqno, uuid))
fails the query with a message tagged for ``parse_rollback`` (partition, rollback seqno).

Modules of ``pipeline/source/``: ``options`` (options, the task unit), ``plan`` (ranges,
grouping, limits), ``read`` (worker-side reading into Arrow), ``stream`` (the stream
readers), ``follow`` (live streams for ``reader=follow``), ``types``.
Measurements and decisions: ``docs/decisions/0032-spark-source-rules.md``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import StructType

from shardex.core.timestamp import Timestamp
from shardex.pipeline.source.options import (
    ChangeRangesPartition,
    SourceOptions,
    config_error,
    current_timestamp,
    task_partitions,
)
from shardex.pipeline.source.plan import plan_ranges
from shardex.pipeline.source.read import partition_owners
from shardex.pipeline.source.stream import ShardexDriverStreamReader, ShardexStreamReader
from shardex.pipeline.source.types import SCHEMA_DDL, RollbackInfo, parse_rollback

__all__ = [
    "SCHEMA_DDL",
    "ChangeRangesPartition",
    "RollbackInfo",
    "ShardexBatchReader",
    "ShardexChangeSource",
    "ShardexDriverStreamReader",
    "ShardexStreamReader",
    "SourceOptions",
    "current_timestamp",
    "parse_rollback",
]


class ShardexChangeSource(DataSource):
    """The ``shardex`` data source (see the module docstring for options)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = SourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return "shardex"

    def schema(self) -> str:
        return self.opts.schema_ddl

    def reader(self, schema: StructType) -> DataSourceReader:
        return ShardexBatchReader(self.opts)

    def _check_streamable(self) -> None:
        if self.opts.mode != "changes":
            raise config_error(
                "mode=snapshot is a batch read; a stream reads changes",
                "mode",
                hint="spark.read for the snapshot, then readStream from its snapshot_ts",
            )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_streamable()
        if self.opts.reader != "partitioned":
            # Spark falls back to simpleStreamReader() on exactly this error.
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        return ShardexStreamReader(self.opts)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        self._check_streamable()
        return ShardexDriverStreamReader(self.opts, follow=self.opts.reader == "follow")


class ShardexBatchReader(DataSourceReader):
    """Batch reads: changes between two timestamps, or a snapshot of the documents.

    ``partitions()`` runs in a planner process on the driver; this object is then pickled
    into the read function, so it holds no client (a temporary one plans)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        keyspace = opts.endpoint.keyspace
        with opts.connect() as client:
            snapshot = opts.mode == "snapshot"
            if snapshot:
                end = opts.snapshot_ts or client.high_seqnos(keyspace)
                start = Timestamp()
            else:
                end = opts.end_ts or client.high_seqnos(keyspace)
                start = opts.start_ts or Timestamp()
            owners = partition_owners(client, keyspace)
        ranges = plan_ranges(keyspace, start, end)
        return list(task_partitions(opts, ranges, owners, snapshot=snapshot))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ChangeRangesPartition):
            return iter(())  # Spark's placeholder when partitions() planned nothing
        return partition.read()
