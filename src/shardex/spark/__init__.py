"""Reading and writing shardex keyspaces from Spark jobs (PySpark's Python data sources).

    import shardex.spark
    shardex.spark.register(spark)
    df = (spark.read.format("shardex").option("cluster", "/path/to/cluster")
          .option("keyspace", "users").load())
    df.write.format("shardex").option("cluster", d).option("keyspace", "copy")
      .mode("append").save()
    stream = spark.readStream.format("shardex").option("cluster", d).option("keyspace", "users")

Modules: ``options`` (the options), ``schema`` (inference, documents to Arrow), ``filters``
(pushed filters as an index scan), ``reader`` (batch and stream reads), ``writer`` (writes),
``source`` (the ``shardex`` data source). Users' guide: docs/operations.md, "Reading and
writing from Spark"; why it is built this way: docs/decisions/0131-spark-connector.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["PUSHDOWN_CONF", "register"]

# Spark hands a Python data source the filters of a query only with this on (and refuses a
# reader that takes filters while it is off).
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> None:
    """Register the ``shardex`` format in ``spark`` and turn on Python filter pushdown.
    The index pipeline's change reads (options ``cluster_dir``/``addresses``) keep working
    under the same name."""
    from shardex.spark.source import ShardexDataSource

    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(ShardexDataSource)
