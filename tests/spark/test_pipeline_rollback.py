"""A change-stream ROLLBACK reaching the pipeline: the indexes are rolled back and rebuilt,
the stream restarts in a new checkpoint generation, and the oracle holds afterwards.

The rollback is injected where the pipeline sees history: the driver is stopped, the last
offset of its Spark checkpoint is given a partition uuid the data service never had (as if
the pipeline had read a branch that was later lost), and a new driver starts from it. The
source then reports ROLLBACK for that partition with rollback seqno 0 (no provable common
history), exactly what a real diverged partition produces.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from data_helpers import running_cluster
from pipeline_helpers import check_oracle, mutate, slice_entries, wait_stable

from shardex.client import Client, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import find_index, latest_index_topology
from shardex.pipeline.driver import PipelineDriver
from shardex.pipeline.indexers import index_state, load_finish
from shardex.pipeline.rollback import current_generation, rollback_everywhere

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "events"
# Two initial builds, a query restart and the module's cluster start: beyond the default 120 s
# on a loaded 2-core machine (the timeout covers fixture setup too).
pytestmark = pytest.mark.timeout(600)


class DriverThread:
    def __init__(self, spark: SparkSession, path: Path, checkpoints: Path) -> None:
        self.client = connect_local(path, as_node=True)
        self.driver = PipelineDriver(
            spark, self.client, {"cluster_dir": str(path)}, checkpoints, poll=0.3
        )
        self.thread = threading.Thread(target=self.driver.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.driver.stop()
        self.thread.join(timeout=60)
        self.client.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Client]]:
    path = tmp_path_factory.mktemp("rollback") / "cluster"
    with running_cluster(path, nodes=3), connect_local(path, as_node=True) as client:
        client.create_keyspace(KEYSPACE, num_partitions=4)
        yield path, client


def forge_last_offset(checkpoint: Path, partition: int, uuid: int) -> None:
    offsets = checkpoint / "offsets"
    last = max((p for p in offsets.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    lines = last.read_text().splitlines()
    ts = json.loads(lines[2])
    ts[str(partition)][1] = uuid
    lines[2] = json.dumps(ts)
    last.write_text("\n".join(lines) + "\n")


def test_rollback_rebuilds_the_indexes_and_the_oracle_holds(
    spark: SparkSession, cluster: tuple[Path, Client], tmp_path: Path
) -> None:
    path, client = cluster
    checkpoints = tmp_path / "checkpoints"
    rng = random.Random(3)
    mutate(client, KEYSPACE, rng, 300)
    client.create_index(KEYSPACE, "by_city", ["city", "age"])
    first = DriverThread(spark, path, checkpoints)
    try:
        client.wait_for_index(KEYSPACE, "by_city", timeout=180)
        mutate(client, KEYSPACE, rng, 100)
        wait_stable(client, KEYSPACE, ["by_city"])
    finally:
        first.stop()
    ks_pipeline = first.driver.keyspaces[KEYSPACE]
    checkpoint = ks_pipeline.job.checkpoint
    assert checkpoint == current_generation(checkpoint.parent)
    forge_last_offset(checkpoint, partition=0, uuid=0x5EED)
    mutate(client, KEYSPACE, rng, 50)  # so the restarted stream plans a new batch

    second = DriverThread(spark, path, checkpoints)
    try:
        state = index_state(client)
        rec = find_index(state.indexes, KEYSPACE, "by_city")
        assert rec is not None
        topo = latest_index_topology(state.index_topologies, rec.id)
        assert topo is not None
        wait_for(lambda: second.driver.keyspaces.get(KEYSPACE) is not None)
        kp = second.driver.keyspaces[KEYSPACE]
        wait_for(lambda: kp.rollbacks == 1, timeout=120)
        # A new generation replaced the old checkpoint, the index was rebuilt from a new T0.
        assert kp.job.checkpoint != checkpoint and not checkpoint.exists()
        wait_for(lambda: len(kp.builds) == 1, timeout=180)
        assert kp.builds[0].ts0 != rec.build_ts
        mutate(client, KEYSPACE, rng, 100)
        ts = wait_stable(client, KEYSPACE, ["by_city"])
        assert check_oracle(client, KEYSPACE, "by_city", ts) > 0
        assert kp.rollbacks == 1
    finally:
        second.stop()


def test_a_slice_in_rollback_refuses_reads(cluster: tuple[Path, Client]) -> None:
    """Scans of a slice marked for rebuild get INDEX_IN_ROLLBACK (not stale entries)."""
    _path, client = cluster
    client.create_index(KEYSPACE, "by_age", ["age"], defer_build=True)
    state = index_state(client)
    rec = find_index(state.indexes, KEYSPACE, "by_age")
    assert rec is not None
    topo = latest_index_topology(state.index_topologies, rec.id)
    assert topo is not None
    node = topo.assignment[0]
    # An unbuilt slice is empty and readable; after a rollback below what it applied it is
    # not. Make it apply something first: a loaded slice at a T0 past seqno 0.
    t0 = client.high_seqnos(KEYSPACE)
    load_finish(client, t0, [(rec.id, 0, node)], {})
    assert slice_entries(client, rec.id, 0, node, None) == []
    hit = rollback_everywhere(client, [node], {}, KEYSPACE, partition=0, seqno=0)
    assert (rec.id, 0) in hit
    with pytest.raises(ShardexError) as err:
        slice_entries(client, rec.id, 0, node, None)
    assert err.value.code is ErrorCode.INDEX_IN_ROLLBACK
    client.drop_index(KEYSPACE, "by_age")


def wait_for(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"condition not met in {timeout}s")
