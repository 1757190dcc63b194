"""The stall watchdog on a real 3-node cluster: a maintenance query that keeps running but
applies nothing (its batches return without projecting or delivering, its rounds between
batches stopped) while writes come is noticed after ``stall_after`` seconds, logged with
the keyspace, the index and the lag, and restarted in a new checkpoint generation; the index
then catches up to the keyspace's high seqnos and equals the oracle there."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cluster_helpers import wait_for
from data_helpers import running_cluster
from pipeline_helpers import check_oracle, mutate, published_ts, running_pipeline, wait_stable

from shardex.client import connect_local
from shardex.core.timestamp import Timestamp
from shardex.pipeline.maintain import MaintenanceJob
from shardex.pipeline.registry import IndexRegistry

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "stall"
INDEX = "by_age"
STABLE_TIMEOUT = 360.0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_stalled_stream_is_restarted_and_catches_up(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    jobs: list[MaintenanceJob] = []
    stalled: set[int] = set()  # id() of the jobs whose batches apply nothing

    def each_job(job: MaintenanceJob) -> None:
        run = job.run_batch_id

        def batch(batch_id: int) -> None:
            if id(job) in stalled:
                return  # Spark commits the batch; nothing is read, projected or delivered
            run(batch_id)

        job.run_batch_id = batch  # type: ignore[method-assign]
        jobs.append(job)

    rng = random.Random(19)
    path = tmp_path / "cluster"
    with (
        running_cluster(path, nodes=3),
        connect_local(path, as_node=True) as client,
        running_pipeline(
            spark, path, tmp_path / "ckpt", each_job=each_job, stall_after=3.0
        ) as driver,
    ):
        client.create_keyspace(KEYSPACE, num_partitions=8, num_replicas=0)
        mutate(client, KEYSPACE, rng, 200)
        client.create_index(KEYSPACE, INDEX, ["age", "name"], partition_by=["META().id"])
        client.wait_for_index(KEYSPACE, INDEX, timeout=STABLE_TIMEOUT)
        wait_stable(client, KEYSPACE, [INDEX], timeout=STABLE_TIMEOUT)
        kp = driver.keyspaces[KEYSPACE]
        before = kp.stalls
        stuck = kp.job
        # The running query keeps running but applies nothing from now on.
        stalled.add(id(stuck))
        stuck.stop_rounds()  # no round between batches carries the stream either
        caplog.set_level(logging.WARNING, logger="shardex.pipeline.driver")
        mutate(client, KEYSPACE, rng, 300)
        target = wait_stable(client, KEYSPACE, [INDEX], timeout=STABLE_TIMEOUT)
        wait_for(lambda: kp.stalls > before, 60, what="the watchdog restarting the query")
        assert kp.job is not stuck and id(kp.job) not in stalled
        warnings = [r.getMessage() for r in caplog.records if "applied nothing" in r.getMessage()]
        assert warnings, "no stall warning logged"
        assert f"keyspace {KEYSPACE}" in warnings[0] and f"index {INDEX} behind" in warnings[0]
        # What each lagging partition's applied and target entries are, and what the stream
        # and its source last saw there.
        assert "[applied -> target: " in warnings[0]
        assert "the stream's last committed end" in warnings[0]
        assert "its source's last latest offset" in warnings[0]
        check_oracle(client, KEYSPACE, INDEX, target)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_index_joining_behind_the_idle_stream_is_caught_up(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index built while writes came, which stopped before it joined: the stream read
    past its T0 while it was not maintained and, idle, starts no batch to catch it up. The
    watchdog's position rule restarts the stream and the index reaches the high seqnos."""
    rng = random.Random(20)
    path = tmp_path / "cluster"
    with (
        running_cluster(path, nodes=3),
        connect_local(path, as_node=True) as client,
        running_pipeline(spark, path, tmp_path / "ckpt", stall_after=60.0) as driver,
    ):
        client.create_keyspace(KEYSPACE, num_partitions=8, num_replicas=0)
        mutate(client, KEYSPACE, rng, 200)
        real_join = IndexRegistry.join
        held: list[str] = []

        def join(self: IndexRegistry, index_id: str, applied: Timestamp, **kw: Any) -> None:
            if not held:  # the build's join: writes come and go first, the stream reads them
                held.append(index_id)
                mutate(client, KEYSPACE, rng, 150)
                high = client.high_seqnos(KEYSPACE)
                kp = driver.keyspaces[KEYSPACE]

                def read_past() -> bool:
                    pos = kp.job.position()
                    return pos is not None and all(pos.seqno(p) >= e.seqno for p, e in high.items())

                wait_for(read_past, STABLE_TIMEOUT, what="the stream read every write")
            real_join(self, index_id, applied, **kw)

        monkeypatch.setattr(IndexRegistry, "join", join)
        client.create_index(KEYSPACE, INDEX, ["age", "name"], partition_by=["META().id"])
        client.wait_for_index(KEYSPACE, INDEX, timeout=STABLE_TIMEOUT)
        target = wait_stable(client, KEYSPACE, [INDEX], timeout=STABLE_TIMEOUT)
        assert held, "the build never joined the index"
        assert driver.keyspaces[KEYSPACE].stalls >= 1
        # At the published TS (at or past ``target``): a snapshot the indexers still keep.
        ts = published_ts(client, KEYSPACE, INDEX)
        assert ts is not None and ts.covers(target)
        check_oracle(client, KEYSPACE, INDEX, ts)
