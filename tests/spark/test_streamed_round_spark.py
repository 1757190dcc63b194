"""A batch's round begun while the batch is still projected (``pipeline/rounds/streamed.py``),
end to end: a real 3-node cluster and the Spark driver. The driver is stopped, a backlog of
random mutations (updates that change the indexed key and the moving partition key, deletes,
re-inserts, evaluation errors) is written, and a new driver drains it in a first batch whose
rows go to the indexers group by group (groups of a few dozen changes here) before its
stabilise; the oracle holds at the end, the round did send rows early, and a second backlog
drained the same way is exact too."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from data_helpers import running_cluster
from pipeline_helpers import check_oracle, mutate, running_pipeline, wait_stable

from shardex.client import Client, connect_local
from shardex.pipeline.maintain import MaintenanceJob

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "streamed"
INDEXES = ["by_city", "by_name"]


def _groups_of_24(job: MaintenanceJob) -> None:
    job.project_rows = 24


def _drain(
    spark: SparkSession, path: Path, checkpoints: Path, client: Client, seed: int
) -> list[Any]:
    """Write a backlog with no driver running, drain it with a new one: its batch stats."""
    mutate(client, KEYSPACE, random.Random(seed), 500)
    with running_pipeline(spark, path, checkpoints, poll=0.3, each_job=_groups_of_24) as driver:
        ts = wait_stable(client, KEYSPACE, INDEXES)
        for name in INDEXES:
            check_oracle(client, KEYSPACE, name, ts)
        return list(driver.keyspaces[KEYSPACE].job.last)


@pytest.mark.timeout(600)
def test_a_drained_backlog_streamed_to_the_indexers_is_exact(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "cluster"
    checkpoints = tmp_path / "ckpt"
    with running_cluster(path, nodes=3), connect_local(path, as_node=True) as client:
        client.create_keyspace(KEYSPACE, num_partitions=8)
        mutate(client, KEYSPACE, random.Random(5), 200)
        client.create_index(
            KEYSPACE, "by_city", ["city", "age"], partition_by=["city"], num_partition=4
        )
        client.create_index(KEYSPACE, "by_name", ["name"], where="type = 'user'")
        with running_pipeline(spark, path, checkpoints, poll=0.3, each_job=_groups_of_24):
            for name in INDEXES:
                client.wait_for_index(KEYSPACE, name, timeout=180)
            wait_stable(client, KEYSPACE, INDEXES)
        for seed in (6, 7):
            stats = _drain(spark, path, checkpoints, client, seed)
            streamed = [s for s in stats if s.streamed > 0]
            assert streamed, [(s.batch_id, s.changes, s.between) for s in stats]
            assert all(s.retries == 0 for s in streamed)
            assert all(s.key_versions > s.streamed for s in streamed)  # the rest went last
