"""Stability rounds between Spark's micro-batches end to end (``pipeline/rounds/between.py``,
``MaintenanceJob(stabilise_ahead=True)``): a real 3-node cluster and the Spark driver under
writes; the oracle holds at stability TSs published while the writes go on (by batches and by
the rounds between them) and at the end, and rounds between batches did run."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from data_helpers import running_cluster
from pipeline_helpers import Writer, check_oracle, mutate, published_ts, wait_stable

from shardex.client import connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.driver import PipelineDriver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "between"


def _stabilising_ahead(driver: PipelineDriver) -> None:
    """Every maintenance job of ``driver`` runs rounds between batches."""
    make = driver._job

    def job(*args: Any, **kwargs: Any) -> Any:
        j = make(*args, **kwargs)
        j.stabilise_between()
        return j

    driver._job = job  # type: ignore[method-assign]


@pytest.mark.timeout(600)
def test_oracle_under_writes_with_rounds_between_batches(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "cluster"
    with running_cluster(path, nodes=3), connect_local(path, as_node=True) as client:
        client.create_keyspace(KEYSPACE, num_partitions=8)
        mutate(client, KEYSPACE, random.Random(3), 300)
        # A moving partition key (city): a change of city is an Upsert to one slice and a
        # removal to the others, all in the same round.
        client.create_index(
            KEYSPACE, "by_city", ["city", "age"], partition_by=["city"], num_partition=4
        )
        with connect_local(path, as_node=True) as driver_client:
            driver = PipelineDriver(
                spark, driver_client, {"cluster_dir": str(path)}, tmp_path / "ckpt", poll=0.3
            )
            _stabilising_ahead(driver)
            thread = threading.Thread(target=driver.run, name="pipeline-driver", daemon=True)
            thread.start()
            try:
                client.wait_for_index(KEYSPACE, "by_city", timeout=180)
                checked = 0
                with Writer(connect_local(path, as_node=True), KEYSPACE, seed=9, pause=0.02):
                    deadline = time.monotonic() + 60
                    job = driver.keyspaces[KEYSPACE].job
                    while checked < 3 or job.between.stats.rounds < 3:
                        assert time.monotonic() < deadline, (checked, job.between.stats)
                        ts = published_ts(client, KEYSPACE, "by_city")
                        if ts is None:
                            continue
                        try:
                            check_oracle(client, KEYSPACE, "by_city", ts)
                            checked += 1
                        except ShardexError as exc:  # the slices moved on: another TS
                            if exc.code is not ErrorCode.SNAPSHOT_TOO_OLD:
                                raise
                ts = wait_stable(client, KEYSPACE, ["by_city"])
                assert check_oracle(client, KEYSPACE, "by_city", ts) > 0
                assert job.between.stats.rounds >= 3 and job.between.stats.failed == 0
            finally:
                driver.stop()
                thread.join(timeout=60)
