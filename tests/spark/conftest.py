"""The one SparkSession of a test run, and the cluster helpers Spark tests share.

A SparkSession takes 15-25 s to start on the 2-core test machine, and the first Python
data-source read another few seconds (Python worker start-up), so every Spark test shares one
session-scoped session built by ``shardex.pipeline.session.build_spark_session`` (the same
settings as the ``shardex pipeline`` driver and the benchmarks). Tests that use the
``spark`` fixture are marked ``spark`` automatically (``-m 'not spark'`` skips them).

Starting a 3-node cluster and a pipeline driver costs about as much again, so the modules
that only need "a cluster with the pipeline running" (scans, paged scans, SQL, the SQL
surfaces) share one: ``shared_cluster`` (session scope). Each module works in a keyspace of
its own (``SharedCluster.keyspace``: documents, indexes and expectations stay apart) that is
dropped when the module ends, which also stops that keyspace's maintenance query, so only
the running module's query competes for the two cores. Tests that kill nodes, add nodes or
rebalance keep clusters of their own.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# The real-cluster helpers live beside the cluster tests, imported there as top-level modules.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cluster"))

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster
    from pyspark.sql import SparkSession


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    if shutil.which("java") is None:
        pytest.skip("no Java runtime: Spark tests need one (Java 17)")
    from shardex.pipeline.session import build_spark_session

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = build_spark_session(
        app_name="shardex-tests",
        conf_overrides={"spark.sql.warehouse.dir": str(warehouse)},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def shared_cluster(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedCluster]:
    from data_helpers import running_cluster
    from pipeline_helpers import SharedCluster, running_pipeline

    from shardex.client import connect_local

    root = tmp_path_factory.mktemp("shared")
    path = root / "cluster"
    with (
        running_cluster(path, nodes=3),
        connect_local(path, as_node=True) as client,
        running_pipeline(spark, path, root / "ckpt"),
    ):
        yield SharedCluster(path, client)
