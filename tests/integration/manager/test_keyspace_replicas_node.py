"""Keyspaces with replica chains on real ``Node``s (manager + data, RocksDB, TCP on loopback,
in this process): three nodes with server groups, the client's create with and without
``num_replicas``, and the groups in the membership view."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardex.client import connect
from shardex.errors import ShardexError
from shardex.meta.member_list import MemoryMemberStore
from shardex.net.tcp import TcpTransport
from shardex.node.server import Node

pytestmark = pytest.mark.timeout(60)

SECRET = "keyspace-replicas-node-secret"
GROUPS = {"node1": "rack-a", "node2": "rack-b", "node3": "rack-a"}


class Cluster:
    """Nodes (name -> group) on one loop thread (the sync client runs on another)."""

    def __init__(self, root: Path, groups: dict[str, str]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nodes: list[Node] = []
        for name, group in groups.items():
            node = Node(
                transport=TcpTransport(),
                secret=SECRET,
                name=name,
                member_id=f"m-{name}",
                address="127.0.0.1:0",
                services=("manager", "data"),
                store=MemoryMemberStore(),
                seeds=[self.nodes[0].address] if self.nodes else [],
                heartbeat_interval=0.1,
                failure_timeout=0.6,
                data_dir=root / name,
                group=group,
            )
            self.run(node.start())
            self.nodes.append(node)

    def run(self, coro: object, timeout: float = 30) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def stop(self) -> None:
        for node in reversed(self.nodes):
            self.run(node.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, GROUPS)
    try:
        yield c
    finally:
        c.stop()


def test_three_nodes_create_keyspaces_with_chains_over_their_groups(cluster: Cluster) -> None:
    with connect(cluster.nodes[0].address, secret=SECRET) as c:
        deadline = time.monotonic() + 20
        while sorted(c.cluster_status().up) != sorted(GROUPS):
            assert time.monotonic() < deadline, "members not all up"
            time.sleep(0.05)
        status = c.cluster_status()
        assert {m.name: m.group for m in status.members} == GROUPS

        ks = c.create_keyspace("users", 6, num_replicas=1)
        assert ks.num_replicas == 1 and ks.warnings == [] and ks.min_replicas == 1
        for p, active in ks.assignment.items():
            chain = [active, *ks.replicas[p]]
            assert len(chain) == 2 and len(set(chain)) == 2
            assert {GROUPS[n] for n in chain} == {"rack-a", "rack-b"}

        default = c.create_keyspace("orders", 4)  # three data nodes up: one replica
        assert default.num_replicas == 1 and default.min_replicas == 1

        wide = c.create_keyspace("wide", 4, num_replicas=3)
        assert wide.min_replicas == 2 and "not enough data nodes" in wide.warnings[0]

        listed = {k.name: k for k in c.list_keyspaces()}
        assert listed["users"].replicas == ks.replicas
        assert listed["wide"].num_replicas == 3 and listed["wide"].min_replicas == 2


def test_a_single_data_node_creates_keyspaces_without_replicas(tmp_path: Path) -> None:
    single = Cluster(tmp_path, {"node1": ""})
    try:
        with connect(single.nodes[0].address, secret=SECRET) as c:
            deadline = time.monotonic() + 20
            while True:
                try:
                    ks = c.create_keyspace("users", 4)
                    break
                except ShardexError:  # no master elected yet
                    assert time.monotonic() < deadline, "no master"
                    time.sleep(0.05)
            assert ks.num_replicas == 0 and ks.replicas == {} and ks.warnings == []
            assert c.cluster_status().members[0].group == ""
    finally:
        single.stop()
