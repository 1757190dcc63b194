"""``ShardexDataSource``: the ``shardex`` format of ``spark.read``, ``readStream`` and
``df.write``.

One Spark format name serves two readers, told apart by their options: with ``cluster``
(what users pass) it is the document connector of this package; with the change source's
``cluster_dir`` or ``addresses`` it is that source (``pipeline/source/datasource.py``,
rows of changes), unchanged, so the index pipeline and jobs written against it keep working
in a session where ``register`` replaced the pipeline's registration of the name.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import StructType

from shardex.pipeline.source.datasource import ShardexChangeSource
from shardex.spark.options import ConnectorOptions, bad_option
from shardex.spark.reader import DocumentReader, DocumentStreamReader, sample_schema
from shardex.spark.writer import DocumentWriter


class ShardexDataSource(DataSource):
    """The ``shardex`` format (options: ``docs/operations.md``, "Reading and writing from
    Spark"). Created where Spark plans the read or write, on the driver: the options are
    checked and the keyspace looked up there, so a bad one fails the ``load()``/``save()``
    call itself, not a task."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.changes: ShardexChangeSource | None = None
        self.opts: ConnectorOptions | None = None
        if any(str(k).lower() == "cluster" for k in options):
            self.opts = ConnectorOptions.parse(options)
            self.opts.check_keyspace()
        else:
            self.changes = ShardexChangeSource(options)

    @classmethod
    def name(cls) -> str:
        return "shardex"

    def _connector(self) -> ConnectorOptions:
        assert self.opts is not None
        return self.opts

    def schema(self) -> StructType | str:
        if self.changes is not None:
            return self.changes.schema()
        return sample_schema(self._connector())

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.changes is not None:
            return self.changes.reader(schema)
        return DocumentReader(self._connector(), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self.changes is not None:
            return self.changes.streamReader(schema)
        return DocumentStreamReader(self._connector(), schema)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        assert self.changes is not None  # the connector's streamReader never declines
        return self.changes.simpleStreamReader(schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if self.changes is not None:
            raise bad_option(
                "writes need the document connector's options", "cluster", hint="option cluster"
            )
        return DocumentWriter(self._connector(), schema, overwrite)
