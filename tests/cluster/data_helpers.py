"""Helpers shared by the data-service cluster tests: a running 3-node cluster, docids that
land in a chosen partition, reading a partition's whole change stream."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from cluster_helpers import LocalCluster, free_base_port, kill_leftovers, run_cli, wait_for

from shardex.client import Change, Client, Keyspace, SnapshotMarker, connect_local
from shardex.errors import ErrorCode, ShardexError
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


# For tests that kill -9 a node and start it again expecting the same history (no failover):
# a restart slowed by a loaded machine must not be taken for a lost node.
NO_AUTO_FAILOVER = ("--auto-failover-timeout", "120")

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


# Refusals that applied nothing: the write did not happen.
NOT_APPLIED = {
    ErrorCode.DURABILITY_IMPOSSIBLE,
    ErrorCode.NOT_MY_PARTITION,
    ErrorCode.NODE_FAILED_OVER,
    ErrorCode.BAD_REQUEST,
}


@dataclasses.dataclass
class KeyHistory:
    acked: int = 0  # the last acknowledged counter
    maybe: set[int] = dataclasses.field(default_factory=set)  # ambiguous, after ``acked``
    inflight: int = 0  # the write under way (a concurrent read may see it)


class Writers:
    """Threads upserting their own keys of ``keyspace`` at durability majority, recording
    every outcome. A key's value carries its writer's counter ``v``: each key must read its
    last acknowledged ``v``, or a later one whose write was ambiguous (it may have taken
    effect). A lower one is a lost acknowledged write."""

    def __init__(
        self,
        cluster: LocalCluster | None,
        keyspace: str,
        writers: int = 3,
        keys_per_writer: int = 20,
        *,
        connect: Callable[[str], Client] | None = None,
    ) -> None:
        """Clients of ``cluster``'s directory, or made by ``connect(name)`` (a cluster
        without a local directory, e.g. nodes on other hosts)."""
        if connect is None:
            assert cluster is not None
            path = cluster.path

            def connect(name: str) -> Client:
                return connect_local(path, name=name, request_timeout=10)

        self.keyspace = keyspace
        self.keys_per_writer = keys_per_writer
        self.keys: dict[str, KeyHistory] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.acks = 0
        self.errors: dict[str, int] = {}
        self.clients = [connect(f"writer{t}") for t in range(writers)]
        self.threads = [threading.Thread(target=self._run, args=(t,)) for t in range(writers)]

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        for c in self.clients:
            c.close()

    def _run(self, t: int) -> None:
        ks = self.clients[t].keyspace(self.keyspace)
        counter = 0
        while not self.stop.is_set():
            counter += 1
            key = f"w{t}-{counter % self.keys_per_writer}"
            with self.lock:
                hist = self.keys.setdefault(key, KeyHistory())
                hist.inflight = counter
            try:
                ks.upsert(key, {"t": t, "v": counter}, durability="majority")
            except ShardexError as exc:
                with self.lock:
                    self.errors[exc.code.value] = self.errors.get(exc.code.value, 0) + 1
                    if exc.code not in NOT_APPLIED:
                        hist.maybe.add(counter)
                if exc.code in (ErrorCode.DURABILITY_IMPOSSIBLE, ErrorCode.NODE_UNAVAILABLE):
                    time.sleep(0.05)
                continue
            with self.lock:
                hist.acked = counter
                hist.maybe = {v for v in hist.maybe if v > counter}
                self.acks += 1

    def check(self, client: Client) -> None:
        """Every key holds its last acknowledged counter or a later ambiguous one."""
        with self.lock:
            snapshot = {k: h.acked for k, h in self.keys.items()}
        ks = client.keyspace(self.keyspace)
        lost = []
        for key, acked in snapshot.items():
            if acked == 0:
                continue
            v = ks.get(key)["v"]
            if v < acked or (v > acked and not self._newer(key, v)):
                lost.append((key, acked, v))
        assert not lost, f"acknowledged writes lost (key, acked, read): {lost[:10]}"

    def _newer(self, key: str, v: int) -> bool:
        with self.lock:
            h = self.keys[key]
            return v <= h.acked or v in h.maybe or v == h.inflight
