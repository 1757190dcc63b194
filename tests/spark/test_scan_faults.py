"""Index scans under ``kill -9``: a real 3-node cluster, an index built by the Spark pipeline
(in this process, on the shared SparkSession), a large scan read slowly by the client while
an indexer node is killed with SIGKILL.

The rule checked: the iterator either raises a ``ShardexError`` that names the dead node (or
the connection to it), or yields exactly the oracle's rows (a retried, complete result). A
silent partial result - the iterator ending normally with rows missing - fails the test.
Two cases: the killed indexer is another node than the scan coordinator (the coordinator's
stream from it breaks), and the killed indexer is the coordinator itself (the client's
connection breaks). After each kill the node is restarted and a full scan must again equal
the oracle (the slices came back from RocksDB intact).

The index holds ``DOCS`` entries over 3 slices, one per node. Credit flow control bounds
what is in flight beyond a slice (the first 1,000 entries, then 2 blocks of 4,000 from an
indexer, 4 blocks of 1,000 to the client), so with ~16,000 entries per slice the killed
node still has unsent entries when the client has read its first rows:
the kill lands in the middle of the scan, not after it. The setup (cluster, documents, the
initial build on a loaded 2-core box) takes over a minute, so the tests are marked slow.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cluster_helpers import LocalCluster, wait_for
from data_helpers import running_cluster

from shardex.client import Client, connect, connect_local
from shardex.core.keycodec import decode_entry
from shardex.errors import ShardexError
from shardex.index.oracle import expected_entries
from shardex.meta.index_state import find_index, latest_index_topology
from shardex.pipeline.driver import PipelineDriver
from shardex.pipeline.indexers import index_state
from shardex.runtime.pidfile import pid_alive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "scanfaults"
INDEX = "by_age"
DOCS = 48_000
READ_BEFORE_KILL = 50  # rows the client reads before the kill (the scan is open and streaming)
PAUSE_EVERY = 500  # rows between the client's pauses: a slow reader
PAUSE = 0.005
RECOVER_TIMEOUT = 180.0

Row = tuple[list[Any], str]


def document(i: int) -> dict[str, Any]:
    return {"name": f"n{i % 97}", "age": (i * 7919) % 90, "city": ["oslo", "rome", "lima"][i % 3]}


@dataclass
class Env:
    path: Path
    cluster: LocalCluster
    client: Client
    oracle: list[Row]

    def owner_of_slices(self) -> dict[str, list[int]]:
        """Indexer node -> index partitions of ``INDEX`` it holds (latest topology)."""
        state = index_state(self.client)
        rec = find_index(state.indexes, KEYSPACE, INDEX)
        assert rec is not None
        topo = latest_index_topology(state.index_topologies, rec.id)
        assert topo is not None
        out: dict[str, list[int]] = {}
        for p, node in sorted(topo.assignment.items()):
            out.setdefault(node, []).append(p)
        return out


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("scan-faults")
    path = root / "cluster"
    with running_cluster(path, nodes=3) as cluster, connect_local(path, as_node=True) as client:
        client.create_keyspace(KEYSPACE, num_partitions=8)
        docs = {f"d{i:06d}": document(i) for i in range(DOCS)}
        client.keyspace(KEYSPACE).upsert_many(docs.items())
        client.create_index(
            KEYSPACE, INDEX, ["age", "name"], partition_by=["META().id"], num_partition=3
        )
        with connect_local(path, name="driver", as_node=True) as driver_client:
            driver = PipelineDriver(
                spark, driver_client, {"cluster_dir": str(path)}, root / "ckpt", poll=0.3
            )
            thread = threading.Thread(target=driver.run, name="pipeline-driver", daemon=True)
            thread.start()
            try:
                client.wait_for_index(KEYSPACE, INDEX, timeout=300)
                rec = find_index(index_state(client).indexes, KEYSPACE, INDEX)
                assert rec is not None
                defn = rec.definition
                entries = sorted(e for _, e in expected_entries(defn, docs))
                oracle = [decode_entry(e, defn.desc) for e in entries]
                assert len(oracle) == DOCS
                yield Env(path, cluster, client, oracle)
            finally:
                driver.stop()
                thread.join(timeout=60)


def slow_scan_with_kill(client: Client, kill: Any) -> tuple[list[Row], ShardexError | None]:
    """A full ordered scan read slowly; ``kill()`` runs after the first rows. Returns the
    rows read and the error that ended the iterator (None: it ended normally)."""
    rows: list[Row] = []
    result = client.scan(KEYSPACE, INDEX, consistency="not_bounded", timeout=60)
    try:
        for r in result:
            rows.append((r["key"], r["docid"]))
            if len(rows) == READ_BEFORE_KILL:
                kill()
            if len(rows) % PAUSE_EVERY == 0:
                time.sleep(PAUSE)
    except ShardexError as exc:
        return rows, exc
    finally:
        result.close()
    return rows, None


def node_index(name: str) -> int:
    assert name.startswith("node"), name
    return int(name.removeprefix("node"))


def kill9(cluster: LocalCluster, i: int) -> None:
    pid = cluster.pid(i)
    assert pid is not None and pid_alive(pid), f"node{i} is not running"
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 10, 0.05, f"node{i} (pid {pid}) to die")


def assert_error_or_complete(
    env: Env, rows: list[Row], error: ShardexError | None, victim: str, address: str
) -> None:
    outcome = "complete" if error is None else f"{error.code.name}: {error.message}"
    print(f"kill -9 {victim} after {READ_BEFORE_KILL} rows: {len(rows)} rows, {outcome}")
    if error is None:  # a complete result is the only acceptable normal end
        assert len(rows) == len(env.oracle), f"silent partial result: {len(rows)} rows"
        assert rows == env.oracle
        return
    text = f"{error.message} {error.details}"
    assert victim in text or address in text, f"the error names neither {victim}: {text}"
    assert len(rows) < len(env.oracle)
    assert rows == env.oracle[: len(rows)]  # what came before the error was right


def restart_and_check(env: Env, victim: int, client: Client) -> None:
    """Start the killed node again; a full scan equals the oracle once its slices serve."""
    env.cluster.start()
    last: list[str] = []

    def full_scan_ok() -> bool:
        try:
            got = [(r["key"], r["docid"]) for r in client.scan(KEYSPACE, INDEX, timeout=30)]
        except ShardexError as exc:  # the node is still starting / rejoining
            last[:] = [f"{exc.code.name}: {exc.message}"]
            return False
        assert got == env.oracle  # once it answers, it answers the whole index
        return True

    try:
        wait_for(full_scan_ok, RECOVER_TIMEOUT, 0.5, f"node{victim}'s slices to serve again")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last scan error: {last}") from None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_another_indexer_mid_scan_is_an_error_naming_it(env: Env) -> None:
    """The client's coordinator is node1; an indexer holding a slice on another node dies."""
    owners = env.owner_of_slices()
    victim = next(n for n in sorted(owners) if n != "node1")
    i = node_index(victim)
    with connect(env.cluster.address(1), secret=env.cluster.secret(), name="slow") as client:
        rows, error = slow_scan_with_kill(client, lambda: kill9(env.cluster, i))
        assert_error_or_complete(env, rows, error, victim, env.cluster.address(i))
        restart_and_check(env, i, client)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_the_coordinating_indexer_mid_scan_is_an_error_naming_it(env: Env) -> None:
    """The node the client scans through also holds a slice, and dies mid-stream."""
    owners = env.owner_of_slices()
    victim = next(n for n in sorted(owners) if n != "node1")
    i = node_index(victim)
    address = env.cluster.address(i)
    with connect(address, secret=env.cluster.secret(), name="slow") as client:
        rows, error = slow_scan_with_kill(client, lambda: kill9(env.cluster, i))
        assert_error_or_complete(env, rows, error, victim, address)
    # The dead node was this client's only address: check recovery through node1.
    with connect(env.cluster.address(1), secret=env.cluster.secret()) as client:
        restart_and_check(env, i, client)
