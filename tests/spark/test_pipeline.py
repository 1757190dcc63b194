"""The index pipeline end to end: a real 3-node cluster, the Spark driver (in this process,
on the shared SparkSession), initial builds and maintenance, every check by the oracle.

Each test ends with ``check_oracle``: at a published stability TS, the entries of all slices
of an index equal its definition evaluated over the documents as of that TS, and no entry is
in two slices.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from data_helpers import running_cluster
from pipeline_helpers import Writer, check_oracle, mutate, published_ts, wait_stable

from shardex.client import Client, connect_local
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import find_index
from shardex.pipeline.driver import PipelineDriver
from shardex.pipeline.indexers import index_state
from shardex.pipeline.metrics import PipelineMetrics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "people"


@dataclass
class Env:
    path: Path
    client: Client
    driver: PipelineDriver


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("pipeline")
    path = root / "cluster"
    with running_cluster(path, nodes=3), connect_local(path, as_node=True) as client:
        client.create_keyspace(KEYSPACE, num_partitions=8)
        with connect_local(path, as_node=True) as driver_client:
            # Batches above 40 changes go through Spark (mapInArrow), smaller ones are read
            # on the driver: the writer's pace makes both kinds.
            driver = PipelineDriver(
                spark,
                driver_client,
                {"cluster_dir": str(path)},
                root / "checkpoints",
                poll=0.3,
                driver_read_max=40,
                metrics=PipelineMetrics(),
            )
            thread = threading.Thread(target=driver.run, name="pipeline-driver", daemon=True)
            thread.start()
            try:
                yield Env(path, client, driver)
            finally:
                driver.stop()
                thread.join(timeout=60)


def index_id(client: Client, name: str) -> str:
    state = index_state(client)
    rec = find_index(state.indexes, KEYSPACE, name)
    assert rec is not None
    return rec.id


def check_mid_stream(client: Client, name: str, attempts: int = 8) -> Timestamp:
    """The oracle at a stability TS published while writes continue (retried if the slices
    have already dropped that snapshot)."""
    for _ in range(attempts):
        ts = published_ts(client, KEYSPACE, name)
        if ts is None:
            continue
        try:
            check_oracle(client, KEYSPACE, name, ts)
            return ts
        except ShardexError as exc:
            if exc.code is not ErrorCode.SNAPSHOT_TOO_OLD:
                raise
    raise AssertionError(f"no stability TS of {name} could be checked mid-stream")


# Setup (cluster) and call (two builds, writes) outlast the default 120 s on a loaded box.
@pytest.mark.timeout(600)
def test_build_then_maintain_under_writes_with_deferred_build_and_errors(env: Env) -> None:
    client = env.client
    rng = random.Random(5)
    mutate(client, KEYSPACE, rng, 400)
    # Moving partition key (city) with WHERE; some names are too long to index (errors).
    client.create_index(
        KEYSPACE,
        "by_name",
        ["name", "age"],
        where="type = 'user'",
        partition_by=["city"],
        num_partition=4,
    )
    client.create_index(
        KEYSPACE,
        "by_age",
        ["age", "name DESC"],
        partition_by=["META().id"],
        num_partition=3,
        defer_build=True,
    )
    # An array index: one entry per element, built and maintained like the others.
    client.create_index(
        KEYSPACE,
        "by_tag",
        ["DISTINCT ARRAY t.k FOR t IN tags WHEN t.n > 0 END", "age"],
        partition_by=["META().id"],
        num_partition=2,
    )
    with Writer(connect_local(env.path, as_node=True), KEYSPACE, seed=11) as writer:
        client.wait_for_index(KEYSPACE, "by_name", timeout=180)
        check_mid_stream(client, "by_name")
        client.wait_for_index(KEYSPACE, "by_tag", timeout=180)
        check_mid_stream(client, "by_tag")
        # The deferred index is built while writes continue, then maintained.
        client.build_index(KEYSPACE, "by_age")
        client.wait_for_index(KEYSPACE, "by_age", timeout=180)
        check_mid_stream(client, "by_age")
        assert writer.done > 0
    ts = wait_stable(client, KEYSPACE, ["by_name", "by_age", "by_tag"])
    n_name = check_oracle(client, KEYSPACE, "by_name", ts)
    n_age = check_oracle(client, KEYSPACE, "by_age", ts)
    n_tag = check_oracle(client, KEYSPACE, "by_tag", ts)
    assert n_name > 0 and n_age > 0 and n_tag > 0
    items = {i["name"]: i for i in client.list_indexes(KEYSPACE)}
    assert items["by_name"]["items_count"] == n_name
    assert items["by_age"]["items_count"] == n_age
    assert items["by_tag"]["items_count"] == n_tag
    assert items["by_age"]["progress"] == 1.0
    # Too-long names were counted as evaluation errors, not indexed, and did not stop it.
    kp = env.driver.keyspaces[KEYSPACE]
    by_name = index_id(client, "by_name")
    build_errors = sum(b.errors for b in kp.builds)
    assert build_errors + kp.job.steps.errors[by_name] > 0
    assert any(b.changes for b in kp.job.last)
    # The driver's /metrics counted the same builds and batches.
    metrics = env.driver.metrics
    assert metrics is not None
    value = metrics.registry.get_sample_value
    labels = {"keyspace": KEYSPACE}
    assert value("shardex_pipeline_builds_total", {**labels, "outcome": "done"}) == len(kp.builds)
    assert value("shardex_pipeline_batches_total", labels) >= len(kp.job.last) > 0
    assert value("shardex_pipeline_batch_changes_total", labels) >= sum(
        b.changes for b in kp.job.last
    )
