"""The operators' cluster REST (``GET /api/...``) on a real 3-node cluster: every listing
agrees with what the Python client reports, from any node, and the errors answer
``{"errors": [...]}`` with the status that fits (401, 404, 405). The index is created
deferred, so no Spark is needed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import LocalCluster, wait_for
from data_helpers import running_cluster
from n1ql_http import Answer, basic, call, http_port

from shardex.client import Client, connect_local

pytestmark = pytest.mark.cluster

KS = "restful"
PARTS = 8


class Env:
    def __init__(self, cluster: LocalCluster, admin: Client) -> None:
        self.cluster = cluster
        self.admin = admin
        path = Path(cluster.path)
        self.ports = [http_port(path, i) for i in (1, 2, 3)]
        self.auth = basic("admin", (path / "admin-password").read_text().strip())

    def get(self, path: str, node: int = 0, **kw: object) -> Answer:
        headers = kw.pop("headers", self.auth)
        return call(f"http://127.0.0.1:{self.ports[node]}{path}", headers=headers, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with (
        running_cluster(tmp_path_factory.mktemp("rest")) as c,
        connect_local(Path(c.path)) as admin,
    ):
        admin.create_keyspace(KS, PARTS, num_replicas=1)
        admin.create_index(KS, "by_n", ["n"], defer_build=True)
        yield Env(c, admin)


def test_nodes_match_the_cluster_status(env: Env) -> None:
    status = env.admin.cluster_status()
    want = {m.name: (m.address, sorted(m.services), m.group) for m in status.members}

    def all_up() -> Answer | None:
        a = env.get("/api/nodes", node=1)
        return a if all(n["state"] == "up" for n in a.body["nodes"]) else None

    answer, _ = wait_for(all_up, timeout=60, what="every node up in GET /api/nodes")
    assert answer.status == 200
    got = {
        n["name"]: (n["address"], sorted(n["services"]), n["server_group"])
        for n in answer.body["nodes"]
    }
    assert got == want
    assert len(got) == 3
    assert not any(n["failed_over"] for n in answer.body["nodes"])


def test_keyspaces_and_partition_map_match_the_client(env: Env) -> None:
    (desc,) = [d for d in env.admin.list_keyspaces() if d.name == KS]
    for node in range(3):
        listed = env.get("/api/keyspaces", node=node)
        assert listed.status == 200
        (row,) = [k for k in listed.body["keyspaces"] if k["name"] == KS]
        assert (row["num_partitions"], row["num_replicas"]) == (PARTS, 1)
        assert row["nodes"] == sorted(set(desc.assignment.values()))
    one = env.get(f"/api/keyspaces/{KS}", node=2)
    assert one.status == 200
    assert one.body["uuid"] == desc.uuid
    parts = {int(p): v for p, v in one.body["partitions"].items()}
    assert {p: v["active"] for p, v in parts.items()} == desc.assignment
    assert {p: v["replicas"] for p, v in parts.items()} == desc.replicas
    assert all(len(v["replicas"]) == 1 for v in parts.values())


def test_indexes_match_the_client(env: Env) -> None:
    want = {
        (i["keyspace"], i["name"]): (i["state"], i["num_replica"], i["id"])
        for i in env.admin.list_indexes(stats=False)
    }
    answer = env.get("/api/indexes")
    assert answer.status == 200
    got = {
        (i["keyspace"], i["name"]): (i["state"], i["num_replica"], i["id"])
        for i in answer.body["indexes"]
    }
    assert got == want
    assert (KS, "by_n") in got
    (row,) = [i for i in answer.body["indexes"] if i["name"] == "by_n"]
    assert "progress" in row and "items_count" in row


def test_rebalance_matches_the_client(env: Env) -> None:
    answer = env.get("/api/rebalance")
    assert answer.status == 200
    status = env.admin.rebalance_status()
    if status is None:
        assert answer.body == {"rebalance": None}
    else:
        assert answer.body["rebalance"]["id"] == status.id
        assert answer.body["rebalance"]["state"] == status.state


def test_errors(env: Env) -> None:
    unknown = env.get("/api/keyspaces/no_such_keyspace")
    assert unknown.status == 404
    assert unknown.body["errors"][0]["msg"].startswith("no keyspace 'no_such_keyspace'")
    assert env.get("/api/nodes", headers={}).status == 401
    wrong = env.get("/api/nodes", headers=basic("admin", "not-the-password"))
    assert wrong.status == 401
    post = env.get("/api/nodes", data=b"{}", method="POST")
    assert post.status == 405
    assert post.headers["Allow"] == "GET"
    assert env.get("/api/nothing_here").status == 404
