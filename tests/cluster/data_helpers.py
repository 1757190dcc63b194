"""Helpers shared by the data-service cluster tests: a running 3-node cluster, docids that
land in a chosen partition, reading a partition's whole change stream."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from cluster_helpers import LocalCluster, free_base_port, kill_leftovers, run_cli, wait_for

from shardex.client import Change, Client, Keyspace, SnapshotMarker
from shardex.meta.partitioning import partition_of
from shardex.runtime.pidfile import pid_alive


@contextlib.contextmanager
def running_cluster(
    path: Path, nodes: int = 3, extra: tuple[str, ...] = ()
) -> Iterator[LocalCluster]:
    c = LocalCluster(path, nodes, free_base_port(nodes))
    try:
        c.start("--nodes", str(nodes), "--base-port", str(c.base_port), *extra)
        yield c
    finally:
        pids = [c.pid(i) for i in range(1, nodes + 1)]
        if any(p is not None and pid_alive(p) for p in pids):
            run_cli("cluster", "stop", "--dir", str(path), "--timeout", "5", check=False)
        kill_leftovers(path)


def docids_in(partition: int, num_partitions: int, n: int, prefix: str) -> list[str]:
    """``n`` docids (``prefix`` + number) that hash to ``partition``."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        d = f"{prefix}{i}"
        if partition_of(d, num_partitions) == partition:
            out.append(d)
        i += 1
    return out


def read_partition(
    ks: Keyspace, partition: int, from_seqno: int = 0
) -> tuple[list[SnapshotMarker], list[Change]]:
    """Every item of the partition's change stream from ``from_seqno`` to its high seqno."""
    markers: list[SnapshotMarker] = []
    changes: list[Change] = []
    with ks.stream(partition, from_seqno) as stream:
        for item in stream:
            if isinstance(item, SnapshotMarker):
                markers.append(item)
            else:
                changes.append(item)
    return markers, changes


def owner_of(client: Client, keyspace: str, partition: int) -> str:
    for ks in client.list_keyspaces():
        if ks.name == keyspace:
            return ks.assignment[partition]
    raise KeyError(keyspace)


# Fast failure detection for failover tests: a node silent for 2 s is failed over.
FAST_FAILOVER = (
    "--heartbeat-interval",
    "0.25",
    "--failure-timeout",
    "1",
    "--auto-failover-timeout",
    "2",
)


def kill9(cluster: LocalCluster, node: int) -> None:
    """SIGKILL node ``node`` (1-based) and wait until its process is gone."""
    pid = cluster.pid(node)
    assert pid is not None and pid_alive(pid)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 5, what=f"node{node} gone")


def chains_full(client: Client, keyspace: str) -> bool:
    """Every partition of ``keyspace`` has its configured replicas again."""
    ks = next(k for k in client.list_keyspaces() if k.name == keyspace)
    return ks.min_replicas == ks.num_replicas
