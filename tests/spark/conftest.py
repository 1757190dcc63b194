"""The one SparkSession of a test run, and the cluster helpers Spark tests share.

A SparkSession takes 15-25 s to start on the 2-core test machine, and the first Python
data-source read another few seconds (Python worker start-up), so every Spark test shares one
session-scoped session built by ``shardex.pipeline.session.build_spark_session`` (the same
settings as the ``shardex pipeline`` driver and the benchmarks). Tests that use the
``spark`` fixture are marked ``spark`` automatically (``-m 'not spark'`` skips them).
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
