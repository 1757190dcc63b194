"""A real 3-node cluster on loopback: CLI, client, kill -9, failure detection, rejoin, stop."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from cluster_helpers import (
    LocalCluster,
    free_base_port,
    kill_leftovers,
    run_cli,
    status_json,
    wait_for,
)

from shardex.client import connect, connect_local
from shardex.errors import AuthFailed, ErrorCode, NodeUnavailable
from shardex.runtime.pidfile import pid_alive

pytestmark = pytest.mark.cluster

HEARTBEAT_INTERVAL = 0.5  # the defaults the CLI writes into every node.toml
FAILURE_TIMEOUT = 3.0
# The bound we state (docs/operations.md): down within failure_timeout + 2 heartbeats.
# The slack covers process scheduling and our 0.1 s polling on a loaded CI machine.
DETECTION_BOUND = FAILURE_TIMEOUT + 2 * HEARTBEAT_INTERVAL
SLACK = 1.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("c3")
    c = LocalCluster(path, 3, free_base_port(3))
    try:
        c.start("--nodes", "3", "--base-port", str(c.base_port))
        yield c
    finally:
        if any(p is not None and pid_alive(p) for p in (c.pid(i) for i in (1, 2, 3))):
            run_cli("cluster", "stop", "--dir", str(path), "--timeout", "5", check=False)
        kill_leftovers(path)


def test_layout_and_status_json(cluster: LocalCluster) -> None:
    secret = cluster.path / "secret"
    assert secret.stat().st_mode & 0o777 == 0o600
    assert len(cluster.secret()) == 64
    doc = status_json(cluster.path)
    assert doc["up"] == doc["total"] == 3
    assert [n["name"] for n in doc["nodes"]] == ["node1", "node2", "node3"]
    for i, n in enumerate(doc["nodes"], start=1):
        assert n["address"] == cluster.address(i)
        assert n["state"] == "up"
        assert isinstance(n["pid"], int) and n["pid"] == cluster.pid(i)
        assert n["services"] == ["data", "index", "query", "manager"]
        assert n["members_up"] == 3
    view = doc["membership"]
    assert view["observer"] in {"node1", "node2", "node3"}
    assert sorted(m["name"] for m in view["members"]) == ["node1", "node2", "node3"]
    assert {m["state"] for m in view["members"]} == {"up"}
    assert view["version"] == 3  # three joins, each incarnation 1
    assert {m["group"] for m in view["members"]} == {""}  # no server groups configured
    assert doc["keyspaces"] == []  # none created yet
    assert doc["voters"] == ["node1", "node2", "node3"]  # every manager, once started


def test_start_twice_is_safe(cluster: LocalCluster) -> None:
    pids = [cluster.pid(i) for i in (1, 2, 3)]
    proc = cluster.start()
    assert "already running" in proc.stdout
    assert [cluster.pid(i) for i in (1, 2, 3)] == pids
    # Changing the shape of an existing cluster is refused, not silently ignored.
    bad = run_cli(
        "cluster", "start", "--dir", str(cluster.path), "--nodes", "5", "--no-pipeline", check=False
    )
    assert bad.returncode == 2 and "3 nodes" in bad.stderr


def test_client_connect_local_ping_and_view(cluster: LocalCluster) -> None:
    with connect_local(cluster.path) as client:
        st = client.ping()
        assert st.name == "node1" and st.address == cluster.address(1)
        assert st.pid == cluster.pid(1) and st.rtt < 1.0 and st.joined
        view = client.cluster_status()
        assert sorted(view.up) == ["node1", "node2", "node3"]
        assert view.observer == "node1" and view.failure_timeout == FAILURE_TIMEOUT


def test_client_falls_back_to_next_address(cluster: LocalCluster) -> None:
    dead = f"127.0.0.1:{free_base_port(1)}"  # nobody listens there
    with connect([dead, cluster.address(2)], secret=cluster.secret()) as client:
        assert client.ping().name == "node2"
        assert client.connected_address == cluster.address(2)


def test_wrong_secret_is_auth_failed(cluster: LocalCluster) -> None:
    with pytest.raises(AuthFailed) as info:
        connect(cluster.address(1), secret="not-the-cluster-secret")
    assert info.value.code == ErrorCode.AUTH_FAILED
    # A wrong secret is not "try the next node": it fails at once.
    with pytest.raises(AuthFailed):
        connect([cluster.address(1), cluster.address(2)], secret="x" * 64)


def test_no_node_reachable_is_node_unavailable() -> None:
    with pytest.raises(NodeUnavailable) as info:
        connect(f"127.0.0.1:{free_base_port(1)}", secret="s" * 32, connect_timeout=1.0)
    assert info.value.code == ErrorCode.NODE_UNAVAILABLE


def test_kill9_detected_then_restart_rejoins(cluster: LocalCluster) -> None:
    with connect(cluster.address(1), secret=cluster.secret()) as c:
        member_id = c.cluster_status().member("node2").member_id
    victim = cluster.pid(2)
    assert victim is not None

    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: not pid_alive(victim), 5, what="node2 process gone")

    observers = [connect(cluster.address(i), secret=cluster.secret()) for i in (1, 3)]
    try:

        def both_see_down() -> bool:
            return all(o.cluster_status().member("node2").state == "down" for o in observers)

        wait_for(both_see_down, DETECTION_BOUND + SLACK + 2, what="node2 marked down")
        elapsed = time.monotonic() - killed_at
    finally:
        for o in observers:
            o.close()
    assert elapsed <= DETECTION_BOUND + SLACK, f"down after {elapsed:.2f}s"
    # Not before the timeout could have expired: the detector waits for silence.
    assert elapsed >= FAILURE_TIMEOUT - HEARTBEAT_INTERVAL - 0.2, f"down after {elapsed:.2f}s"

    doc = status_json(cluster.path)
    by_name = {n["name"]: n for n in doc["nodes"]}
    assert by_name["node2"]["state"] == "down" and by_name["node2"]["pid"] is None
    assert doc["up"] == 2

    cluster.start()  # starts only node2 and waits until everyone sees everyone up
    assert cluster.pid(2) not in (None, victim)
    assert {cluster.pid(1), cluster.pid(3)} == {by_name["node1"]["pid"], by_name["node3"]["pid"]}
    for i in (1, 2, 3):
        with connect(cluster.address(i), secret=cluster.secret()) as c:
            view = c.cluster_status()
            node2 = view.member("node2")
            assert node2 is not None and node2.state == "up"
            assert node2.member_id == member_id  # same identity, not a new member
            assert len(view.members) == 3 and view.version == 3  # re-join changed nothing
    assert status_json(cluster.path)["up"] == 3


def test_stop_stops_all(cluster: LocalCluster) -> None:
    pids = [cluster.pid(i) for i in (1, 2, 3)]
    assert all(p is not None and pid_alive(p) for p in pids)
    proc = run_cli("cluster", "stop", "--dir", str(cluster.path))
    assert proc.stdout.count("stopped") == 3
    assert not any(pid_alive(p) for p in pids if p is not None)
    for i in (1, 2, 3):
        node_dir = cluster.path / f"node{i}"
        assert not (node_dir / "node.pid").exists()  # removed by the clean stop
        assert "stopped" in (node_dir / "node.log").read_text()
    doc = status_json(cluster.path)
    assert doc["up"] == 0 and all(n["pid"] is None for n in doc["nodes"])
    assert doc["membership"] is None and doc["keyspaces"] is None
    again = run_cli("cluster", "stop", "--dir", str(cluster.path))
    assert again.stdout.count("not running") == 3


def test_groups_label_the_nodes_and_spread_the_replicas(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path / "g", 3, free_base_port(3))
    try:
        bad = run_cli(
            "cluster", "start", "--dir", str(c.path), "--no-pipeline", "--groups", "a b",
            check=False,
        )  # fmt: skip
        assert bad.returncode == 2 and "'group'" in bad.stderr and not c.path.exists()
        c.start("--nodes", "3", "--base-port", str(c.base_port), "--groups", "rack1,rack2")
        doc = status_json(c.path)
        groups = {m["name"]: m["group"] for m in doc["membership"]["members"]}
        assert groups == {"node1": "rack1", "node2": "rack2", "node3": "rack1"}
        d = str(c.path)
        out = run_cli("keyspace", "create", "ks", "--partitions", "6", "--dir", d).stdout
        assert "1 replica(s) per partition" in out
        listed = json.loads(run_cli("keyspace", "list", "--dir", d, "--json").stdout)
        ks = next(k for k in listed if k["name"] == "ks")
        for p, active in ks["assignment"].items():
            chain = [active, *ks["replicas"][p]]
            assert {groups[n] for n in chain} == {"rack1", "rack2"}
        assert status_json(c.path)["keyspaces"] == [
            {"name": "ks", "num_partitions": 6, "num_replicas": 1, "min_replicas": 1}
        ]
    finally:
        run_cli("cluster", "stop", "--dir", str(c.path), "--timeout", "5", check=False)
        kill_leftovers(c.path)
