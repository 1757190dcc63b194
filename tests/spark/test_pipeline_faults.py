"""The index pipeline under faults, on a real 3-node cluster with a writer running: an
indexer (node) killed with ``kill -9`` and restarted, data partitions migrating to a new
node, and the pipeline driver process killed with ``kill -9`` and started again (it resumes
from its Spark checkpoint).

Every test stops writing, waits until the indexes' published stability TS reaches the
keyspace's high seqnos and ends with ``check_oracle`` at that TS: the entries of every slice
equal the definition over the documents as of the TS, and no entry is in two slices (nothing
lost, nothing doubled).

The node-kill and migration tests share one cluster and the in-process driver (on the shared
SparkSession; its setup, a cluster and one initial build of both indexes, takes ~30-60 s);
the driver-process test has its own cluster and runs ``shardex pipeline`` twice (two JVMs).
The node-kill and driver-process tests are marked slow (``-m slow``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cluster_helpers import LocalCluster, run_cli, wait_for
from data_helpers import running_cluster
from pipeline_helpers import Writer, check_oracle, mutate, stability_of, wait_stable

from shardex.api.delivery import DeliverKeyVersions
from shardex.cli.localcluster import spawn_pipeline
from shardex.client import Client, connect_local
from shardex.meta.index_state import find_index, latest_index_topology
from shardex.net.messages import Message
from shardex.pipeline.driver import PipelineDriver
from shardex.pipeline.indexers import index_state
from shardex.pipeline.process import LOG_FILE, pipeline_dir, pipeline_pid
from shardex.pipeline.rollback import current_generation
from shardex.pipeline.rounds import sender
from shardex.runtime.pidfile import pid_alive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "faults"
NAMES = ["by_name", "by_age"]
# The driver retries a batch's delivery for up to 300 s and restarts a failed query with a
# back-off of up to 30 s: stability may take a while to catch up after a fault.
STABLE_TIMEOUT = 360.0
# On a loaded 2-core machine a streaming query may need several starts before its Python
# source runner connects back to the JVM in time (Spark's fixed 10 s), each after the
# driver's growing back-off: the waits for a driver's first batches are generous.


def create_indexes(client: Client) -> None:
    """Two indexes, built by one job: a moving partition key (city) with a WHERE, and one
    partitioned by docid."""
    client.create_index(
        KEYSPACE,
        "by_name",
        ["name", "age"],
        where="type = 'user'",
        partition_by=["city"],
        num_partition=4,
        defer_build=True,
    )
    client.create_index(
        KEYSPACE,
        "by_age",
        ["age", "name DESC"],
        partition_by=["META().id"],
        num_partition=3,
        defer_build=True,
    )
    client.build_index(KEYSPACE, *NAMES)


def check_all(client: Client, timeout: float = STABLE_TIMEOUT) -> dict[str, int]:
    """Writes have stopped: wait for stability at the high seqnos, then the oracle."""
    ts = wait_stable(client, KEYSPACE, NAMES, timeout=timeout)
    counts = {n: check_oracle(client, KEYSPACE, n, ts) for n in NAMES}
    assert all(c > 0 for c in counts.values()), counts
    return counts


def slice_nodes(client: Client, name: str) -> set[str]:
    state = index_state(client)
    rec = find_index(state.indexes, KEYSPACE, name)
    assert rec is not None
    topo = latest_index_topology(state.index_topologies, rec.id)
    assert topo is not None
    return set(topo.assignment.values())


def stability_sum(client: Client) -> int:
    """The lowest total of published stability seqnos over the indexes (grows with batches)."""
    totals = []
    for n in NAMES:
        st = stability_of(client, KEYSPACE, n)
        totals.append(-1 if st is None else sum(st.values()))
    return min(totals)


def wait_progress(client: Client, timeout: float, what: str) -> None:
    """Wait until the published stability of both indexes moves forward (batches run)."""
    before = stability_sum(client)
    wait_for(lambda: stability_sum(client) > before, timeout, 0.2, what)


# --- in-process driver: kill -9 of a node, partition migration -------------------------------


@dataclass
class Env:
    path: Path
    cluster: LocalCluster
    client: Client
    driver: PipelineDriver


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("pipeline-faults")
    path = root / "cluster"
    with running_cluster(path, nodes=3) as cluster, connect_local(path, as_node=True) as client:
        client.create_keyspace(KEYSPACE, num_partitions=8)
        mutate(client, KEYSPACE, random.Random(3), 300)
        with connect_local(path, name="driver", as_node=True) as driver_client:
            driver = PipelineDriver(
                spark, driver_client, {"cluster_dir": str(path)}, root / "checkpoints", poll=0.3
            )
            thread = threading.Thread(target=driver.run, name="pipeline-driver", daemon=True)
            thread.start()
            try:
                create_indexes(client)
                for n in NAMES:
                    client.wait_for_index(KEYSPACE, n, timeout=180)
                yield Env(path, cluster, client, driver)
            finally:
                driver.stop()
                thread.join(timeout=60)


def batch_report(driver: PipelineDriver) -> str:
    kp = driver.keyspaces[KEYSPACE]
    retried = [(s.batch_id, s.retries) for s in kp.job.last if s.retries]
    return f"query restarts {kp.failures}, batches retried {retried}"


class Retries(logging.Handler):
    """Collects the maintenance job's "retrying" warnings (they name the error code) and the
    failures of stability rounds between batches (``rounds/between.py``: not retried, the
    next batch repairs them); both name the error code."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "retrying" in msg or ("between batches" in msg and "failed" in msg):
            self.messages.append(msg)


class DeliveryHook:
    """Wraps the pipeline's calls to indexers: once armed, the next batch that delivers rows
    to ``node`` runs ``action`` after one of its earlier frames (``DeliverKeyVersions``)
    returned and before its last one (``DeliverAndStabilise``): the window in which an
    indexer holds part of a batch only in its memory queue. Frames are cut at
    ``FRAME_ROWS`` rows here, so most batches have earlier frames."""

    FRAME_ROWS = 8

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed: tuple[str, Callable[[], None]] | None = None
        self.fired = threading.Event()
        # The round's frames go out through ``rounds/sender.py``'s ``to_node``.
        self._to_node = sender.to_node
        monkeypatch.setattr(sender, "to_node", self._wrapped)
        monkeypatch.setattr(sender, "MAX_ROWS_PER_FRAME", self.FRAME_ROWS)

    async def _wrapped(
        self, client: Client, node: str, msg: Message, expect: type[Any], timeout: Any = None
    ) -> Any:
        reply = await self._to_node(client, node, msg, expect, timeout)
        armed = self.armed
        # batch_id -1: rows delivered ahead of their batch (by an older pipeline), not a
        # batch's earlier frame.
        frame = isinstance(msg, DeliverKeyVersions) and msg.batch_id >= 0
        if armed is not None and node == armed[0] and frame:
            self.armed = None
            await asyncio.to_thread(armed[1])  # off the client's event loop
            self.fired.set()
        return reply

    def arm(self, node: str, action: Callable[[], None]) -> None:
        self.fired.clear()
        self.armed = (node, action)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kill_indexer_node_mid_stream(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each node (its data partitions and index slices) is killed with SIGKILL once while a writer
    runs: (0) node3 at an arbitrary moment, restarted after a few seconds; (1) node1 (the node the
    others joined through: coordinator master, and the node the driver's timekeeper calls go to)
    between a batch's first frames and its last (the stabilise), restarted after a few seconds: the
    batch's retries ride out the outage; (2) node2 killed and restarted inside that window: the last
    frame reaches a new incarnation that never saw the first ones and is refused (STALE_DELIVERY),
    the batch is delivered again."""
    client = env.client
    for i in (1, 2):
        assert f"node{i}" in slice_nodes(client, "by_name") & slice_nodes(client, "by_age")
    hook = DeliveryHook(monkeypatch)
    retries = Retries()
    logging.getLogger("shardex.pipeline.batch_steps").addHandler(retries)
    # The kills may hit a round between batches instead of a batch's (the default mode).
    between_log = logging.getLogger("shardex.pipeline.rounds.between")
    between_log.addHandler(retries)
    level = between_log.level
    between_log.setLevel(logging.INFO)

    def kill(i: int) -> None:
        pid = env.cluster.pid(i)
        assert pid is not None and pid_alive(pid)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, 0.05, f"node{i} gone")

    def restart(i: int) -> None:
        env.cluster.start()  # starts only the node that is not running
        pid = env.cluster.pid(i)
        assert pid is not None and pid_alive(pid)

    def kill_and_restart(i: int) -> None:
        kill(i)
        restart(i)

    try:
        with (
            connect_local(env.path, name="writer", as_node=True) as wclient,
            Writer(wclient, KEYSPACE, 21) as w,
        ):
            wait_progress(client, 240, "batches before the kills")
            # (0) node3 at any moment (most often the source's offset query fails: the
            # stream restarts from its checkpoint).
            kill(3)
            time.sleep(3)
            restart(3)
            wait_progress(client, 180, "batches after node3's restart")
            # (1) node1 mid-batch; restarted after a few seconds of writes.
            seen = len(retries.messages)
            hook.arm("node1", lambda: kill(1))
            assert hook.fired.wait(180), "no batch delivered to node1"
            time.sleep(4)  # writes go on (those to its partitions fail); the batch retries
            restart(1)
            wait_progress(client, 180, "batches after node1's restart")
            outage = retries.messages[seen:]
            seen = len(retries.messages)
            # (2) node2 killed and restarted between delivery and stabilise.
            hook.arm("node2", lambda: kill_and_restart(2))
            assert hook.fired.wait(180), "no batch delivered to node2"
            wait_progress(client, 180, "batches after node2's restart")
            time.sleep(1)
            assert w.done > 0
    finally:
        logging.getLogger("shardex.pipeline.batch_steps").removeHandler(retries)
        between_log.removeHandler(retries)
        between_log.setLevel(level)
    counts = check_all(client)
    stale = [m for m in retries.messages[seen:] if "STALE_DELIVERY" in m]
    print(
        f"\nkill -9 node3, node1, node2: {w.done} mutations, {counts}; "
        f"{batch_report(env.driver)}; retries during node1's outage {len(outage)}, "
        f"STALE_DELIVERY retries {len(stale)}"
    )
    assert outage, "the round hit by node1's kill was neither retried nor repaired"
    assert stale, "the stabilise after node2's restart was not refused as STALE_DELIVERY"


@pytest.mark.timeout(600)
def test_partition_migration_mid_stream(env: Env) -> None:
    client = env.client
    before = {ks.name: dict(ks.assignment) for ks in client.list_keyspaces()}[KEYSPACE]
    run_cli("cluster", "add-node", "--dir", str(env.path))
    with (
        connect_local(env.path, name="writer", as_node=True) as wclient,
        Writer(wclient, KEYSPACE, 31) as w,
    ):
        wait_progress(client, 240, "batches before the rebalance")
        result = client.rebalance()
        wait_progress(client, 180, "batches after the rebalance")
        time.sleep(1)
        assert w.done > 0
    assert result.state == "done" and result.moved, result
    after = {ks.name: dict(ks.assignment) for ks in client.list_keyspaces()}[KEYSPACE]
    assert "node4" in after.values() and after != before
    counts = check_all(client)
    print(
        f"\nrebalance: {len(result.moved)} move(s), {w.done} mutations, {counts}; "
        f"{batch_report(env.driver)}"
    )


# --- the driver as its own process: kill -9 and restart from the checkpoint ------------------


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (the driver's JVM and its Python workers)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (d / "stat").read_text()
            parent[int(d.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for child, ppid in parent.items():
            if ppid == p and child not in out:
                out.add(child)
                todo.append(child)
    return out


def batch_ids(checkpoints: Path, suffix: str) -> list[int]:
    """The batch ids in the Spark offset (``offsets``) or commit (``commits``) log of the
    keyspace's checkpoint."""
    found = sorted(checkpoints.glob(f"{KEYSPACE}-*"))
    if not found:
        return []
    gen = current_generation(found[0])
    return sorted(int(f.name) for f in (gen / suffix).glob("[0-9]*"))


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a driver we spawned and its session (its JVM, its workers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(1500)
def test_kill_driver_process_mid_stream(tmp_path_factory: pytest.TempPathFactory) -> None:
    if shutil.which("java") is None:
        pytest.skip("no Java runtime: the pipeline driver needs one (Java 17)")
    path = tmp_path_factory.mktemp("pipeline-driver-kill") / "cluster"
    home = pipeline_dir(path)
    checkpoints = home / "checkpoints"
    args = ["--poll", "0.3"]
    spawned: list[subprocess.Popen[bytes]] = []
    with running_cluster(path, nodes=3), connect_local(path, as_node=True) as client:
        try:
            client.create_keyspace(KEYSPACE, num_partitions=8)
            mutate(client, KEYSPACE, random.Random(7), 300)
            first = spawn_pipeline(path, args)
            spawned.append(first)
            wait_for(lambda: pipeline_pid(path) == first.pid, 180, 0.2, "first driver serving")
            # One driver per cluster: a second one refuses at once (the flock).
            refused = run_cli("pipeline", "--dir", str(path), check=False, timeout=60)
            assert refused.returncode != 0
            assert "another pipeline driver process" in refused.stdout + refused.stderr
            assert pipeline_pid(path) == first.pid
            create_indexes(client)
            for n in NAMES:
                client.wait_for_index(KEYSPACE, n, timeout=240)
            with (
                connect_local(path, name="writer", as_node=True) as wclient,
                Writer(wclient, KEYSPACE, 41, pause=0.2) as w,
            ):
                wait_progress(client, 300, "batches before the kill")
                wait_for(lambda: len(batch_ids(checkpoints, "commits")) >= 3, 120, 0.1, "batches")
                jvm = descendants(first.pid)
                assert jvm, "the driver runs no JVM?"
                # Kill while a batch runs: planned (in the offset log), not committed.
                wait_for(
                    lambda: (
                        max(batch_ids(checkpoints, "offsets"))
                        > max(batch_ids(checkpoints, "commits"))
                    ),
                    60,
                    0.01,
                    "a batch in flight",
                )
                os.kill(first.pid, signal.SIGKILL)
                first.wait(10)
                offsets_at_kill = batch_ids(checkpoints, "offsets")
                commits_at_kill = batch_ids(checkpoints, "commits")
                gen = current_generation(next(checkpoints.glob(f"{KEYSPACE}-*")))
                in_flight = (gen / "offsets" / str(max(offsets_at_kill))).read_text()
                # The JVM exits when its Python parent is gone (py4j: stdin closed).
                wait_for(lambda: not any(pid_alive(p) for p in jvm), 30, 0.2, "driver JVM gone")
                assert pipeline_pid(path) is None
                time.sleep(3)  # writes go on with no driver
                second = spawn_pipeline(path, args)
                spawned.append(second)
                wait_for(lambda: pipeline_pid(path) == second.pid, 180, 0.2, "second driver")
                # It replays the batch the kill interrupted (planned, not committed), then
                # goes on with new ones.
                last = max(offsets_at_kill)
                wait_for(
                    lambda: max(batch_ids(checkpoints, "commits"), default=-1) > last,
                    300,
                    0.2,
                    "batches of the second driver",
                )
                assert w.done > 0
            counts = check_all(client)
            # The second driver went on from the first one's checkpoint (same offset log, no
            # new initial build).
            assert batch_ids(checkpoints, "offsets")[: len(offsets_at_kill)] == offsets_at_kill
            assert (gen / "offsets" / str(max(offsets_at_kill))).read_text() == in_flight
            second_log = (home / LOG_FILE).read_text().split(f"(pid {second.pid})")[-1]
            assert "initial build of" not in second_log, "the second driver built again"
            print(
                f"\ndriver kill -9: {w.done} mutations, {counts}; at the kill offsets "
                f"{offsets_at_kill[-3:]} commits {commits_at_kill[-3:]}; now "
                f"{batch_ids(checkpoints, 'offsets')[-1]}"
            )
        finally:
            for proc in spawned:
                kill_group(proc)
