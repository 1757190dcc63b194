"""``foreach_batch_id``: the maintenance job's foreachBatch without PySpark's per-batch
session and DataFrame wrappers (``shardex.pipeline.batch_callback``).

On Spark's own rate source (no cluster): the function sees every batch id in order, Spark
commits each batch after it returned (the commit log holds them), and a raising function
fails the query with its message.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from shardex.pipeline.batch_callback import BatchIdCallback, foreach_batch_id

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter


def _rate_writer(spark: SparkSession, name: str) -> DataStreamWriter:
    df = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    return df.writeStream.queryName(name)


def test_batch_ids_reach_the_function_and_are_committed(
    spark: SparkSession, tmp_path: Path
) -> None:
    seen: list[int] = []
    checkpoint = tmp_path / "ckpt"
    writer = foreach_batch_id(_rate_writer(spark, "batch-callback-ids"), seen.append)
    query = writer.option("checkpointLocation", str(checkpoint)).start()
    try:
        deadline = time.monotonic() + 120
        while len(seen) < 3 and time.monotonic() < deadline:
            assert query.exception() is None
            time.sleep(0.05)
        assert len(seen) >= 3, seen
    finally:
        query.stop()
    assert seen == list(range(len(seen)))
    assert all(isinstance(b, int) for b in seen)
    committed = {int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()}
    # Every batch the function finished is in the commit log (the last one may have been
    # stopped between the function and the commit).
    assert set(seen[:-1]) <= committed


def test_a_raising_function_fails_the_query(spark: SparkSession, tmp_path: Path) -> None:
    def boom(batch_id: int) -> None:
        raise ValueError(f"batch {batch_id} refused by the test")

    writer = foreach_batch_id(_rate_writer(spark, "batch-callback-fails"), boom)
    query = writer.option("checkpointLocation", str(tmp_path / "ckpt")).start()
    try:
        with pytest.raises(Exception, match="refused by the test"):
            query.awaitTermination(120)
        assert not query.isActive
    finally:
        query.stop()


def test_the_callback_passes_the_batch_id_only_and_keeps_the_error() -> None:
    got: list[int] = []
    cb = BatchIdCallback(None, got.append)
    cb.call(object(), 7)
    assert got == [7]

    def fail(batch_id: int) -> None:
        raise RuntimeError("no")

    cb = BatchIdCallback(None, fail)
    with pytest.raises(RuntimeError, match="no"):
        cb.call(None, 1)
    assert isinstance(cb.error, RuntimeError)
