"""The operators' cluster REST (``/api/...``) on a real 3-node cluster and a data-only
fourth node (no coordinator: it reads the state from a manager and sends the actions to
one): every listing agrees with what the Python client reports, from any node, and the
errors answer ``{"errors": [...]}`` with the status that fits (400, 401, 403, 404, 405,
409); a keyspace created and dropped over HTTP is what the client lists. The index is
created deferred, so no Spark is needed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import LocalCluster, run_cli, wait_for
from data_helpers import running_cluster
from n1ql_http import Answer, basic, call, http_port

from shardex.client import Client, connect_local

pytestmark = pytest.mark.cluster

KS = "restful"
PARTS = 8
PW = "reader-password-1"


class Env:
    def __init__(self, cluster: LocalCluster, admin: Client) -> None:
        self.cluster = cluster
        self.admin = admin
        path = Path(cluster.path)
        # node4 runs only the data service: it reads the state from a manager and sends
        # the keyspace actions to one
        self.ports = [http_port(path, i) for i in (1, 2, 3, 4)]
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
        d = ("--dir", str(c.path))
        run_cli("cluster", "add-node", *d, "--services", "data", timeout=120)
        admin.create_keyspace(KS, PARTS, num_replicas=1)
        admin.create_index(KS, "by_n", ["n"], defer_build=True)
        pw_file = Path(c.path) / "reader.pw"
        pw_file.write_text(PW + "\n")
        run_cli(
            "user", "create", "reader", f"data_reader({KS})", *d, "--password-file", str(pw_file)
        )
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
    assert len(got) == 4
    assert got["node4"][1] == ["data"]
    assert not any(n["failed_over"] for n in answer.body["nodes"])
    from_data_node = env.get("/api/nodes", node=3).body["nodes"]
    assert {n["name"]: n["address"] for n in from_data_node} == {k: v[0] for k, v in want.items()}


def test_keyspaces_and_partition_map_match_the_client(env: Env) -> None:
    (desc,) = [d for d in env.admin.list_keyspaces() if d.name == KS]
    for node in range(4):
        listed = env.get("/api/keyspaces", node=node)
        assert listed.status == 200
        (row,) = [k for k in listed.body["keyspaces"] if k["name"] == KS]
        assert (row["num_partitions"], row["num_replicas"]) == (PARTS, 1)
        assert row["nodes"] == sorted(set(desc.assignment.values()))
    one = env.get(f"/api/keyspaces/{KS}", node=3)
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
    answer = env.get("/api/indexes", node=3)
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
    assert env.get("/api/rebalance").body == {"rebalance": None}
    (desc,) = [d for d in env.admin.list_keyspaces() if d.name == KS]
    moved = env.admin.move_partition(KS, 0, "node4" if desc.assignment[0] != "node4" else "node1")
    # node4 has no coordinator: it asks one, as the client does
    answer = env.get("/api/rebalance", node=3)
    assert answer.status == 200
    got = answer.body["rebalance"]
    assert (got["id"], got["kind"], got["state"]) == (moved.id, "move", "done")
    assert [(m["partition"], m["target"], m["status"]) for m in got["moves"]] == [
        (m.partition, m.target, m.status) for m in moved.moves
    ]
    assert got["progress"] == 1.0


def test_errors(env: Env) -> None:
    unknown = env.get("/api/keyspaces/no_such_keyspace")
    assert unknown.status == 404
    assert unknown.body["errors"][0]["code"] == "keyspace_not_found"
    assert unknown.body["errors"][0]["msg"].startswith("no keyspace 'no_such_keyspace'")
    assert env.get("/api/nodes", headers={}).status == 401
    wrong = env.get("/api/nodes", headers=basic("admin", "not-the-password"))
    assert wrong.status == 401
    post = env.get("/api/nodes", data=b"{}", method="POST")
    assert post.status == 405
    assert post.headers["Allow"] == "GET"
    assert env.get("/api/nothing_here").status == 404


def test_create_and_drop_a_keyspace(env: Env) -> None:
    body = json.dumps({"name": "made_by_http", "partitions": 4, "replicas": 1}).encode()
    made = env.get("/api/keyspaces", node=3, data=body, method="POST")
    assert made.status == 201, made.body
    assert (made.body["num_partitions"], made.body["num_replicas"]) == (4, 1)
    (desc,) = [d for d in env.admin.list_keyspaces() if d.name == "made_by_http"]
    parts = {int(p): v["active"] for p, v in made.body["partitions"].items()}
    assert parts == desc.assignment
    again = env.get("/api/keyspaces", node=3, data=body, method="POST")
    assert again.status == 409
    assert again.body["errors"][0]["code"] == "keyspace_exists"
    dropped = env.get("/api/keyspaces/made_by_http", node=1, method="DELETE")
    assert dropped.status == 200, dropped.body
    assert "made_by_http" not in [d.name for d in env.admin.list_keyspaces()]
    assert env.get("/api/keyspaces/made_by_http", method="DELETE").status == 404


def test_bad_create_requests(env: Env) -> None:
    for raw, code in (
        (b"{not json", "bad_json"),
        (b'["a list"]', "bad_request"),
        (b'{"name": "x", "colour": "red"}', "bad_request"),
        (b'{"name": "bad name!"}', "bad_request"),
        (b'{"name": "x", "partitions": -3}', "bad_request"),
        (b'{"name": "x", "replicas": 9}', "bad_request"),
    ):
        answer = env.get("/api/keyspaces", data=raw, method="POST")
        assert (answer.status, answer.body["errors"][0]["code"]) == (400, code), raw
    assert "x" not in [d.name for d in env.admin.list_keyspaces()]


def test_a_reader_may_list_but_not_create_or_drop(env: Env) -> None:
    reader = basic("reader", PW)
    assert env.get("/api/keyspaces", headers=reader).status == 200
    body = json.dumps({"name": "not_allowed"}).encode()
    made = env.get("/api/keyspaces", headers=reader, data=body, method="POST")
    assert made.status == 403
    assert "keyspace.manage" in made.body["errors"][0]["msg"]
    assert env.get(f"/api/keyspaces/{KS}", headers=reader, method="DELETE").status == 403
    assert KS in [d.name for d in env.admin.list_keyspaces()]


def test_index_create_build_and_drop(env: Env) -> None:
    # created deferred from its fields on the data-only node (it sends the DDL to a manager)
    fields = {"keyspace": KS, "name": "by_m", "keys": ["m", "n DESC"], "defer_build": True}
    made = env.get("/api/indexes", node=3, data=json.dumps(fields).encode(), method="POST")
    assert made.status == 201, made.body
    assert (made.body["name"], made.body["state"], made.body["keys"]) == (
        "by_m",
        "READY",
        ["m", "n DESC"],
    )
    (listed,) = [i for i in env.admin.list_indexes(KS) if i["name"] == "by_m"]
    one = env.get(f"/api/indexes/{KS}/by_m")
    assert one.status == 200
    assert (one.body["id"], one.body["state"]) == (listed["id"], "READY")
    assert one.body["progress"] == 0.0 and one.body["stability_lag"] is None
    again = env.get("/api/indexes", data=json.dumps(fields).encode(), method="POST")
    assert (again.status, again.body["errors"][0]["code"]) == (409, "index_exists")
    # BUILD: READY -> BUILDING (the pipeline, not running here, would take it to ACTIVE)
    built = env.get(f"/api/indexes/{KS}/by_m/build", node=1, method="POST")
    assert built.status == 202, built.body
    assert (built.body["state"], built.body["started"]) == ("BUILDING", True)
    assert env.admin.wait_for_index(KS, "by_m", "BUILDING", timeout=30)["state"] == "BUILDING"
    # a statement works too, and DROP by name; the primary index by its name #primary
    stmt = {"statement": f"CREATE PRIMARY INDEX ON {KS} WITH {{'defer_build': true}}"}
    primary = env.get("/api/indexes", data=json.dumps(stmt).encode(), method="POST")
    assert (primary.status, primary.body["name"]) == (201, "#primary"), primary.body
    assert env.get(f"/api/indexes/{KS}/%23primary", method="DELETE").status == 200
    dropped = env.get(f"/api/indexes/{KS}/by_m", node=2, method="DELETE")
    assert (dropped.status, dropped.body["dropped"]) == (200, "by_m"), dropped.body
    names = [i["name"] for i in env.admin.list_indexes(KS)]
    assert "by_m" not in names and "#primary" not in names
    gone = env.get(f"/api/indexes/{KS}/by_m")
    assert (gone.status, gone.body["errors"][0]["code"]) == (404, "index_not_found")
    assert env.get(f"/api/indexes/{KS}/by_m", method="DELETE").status == 404


def test_bad_index_requests(env: Env) -> None:
    for raw, code in (
        (b"{not json", "bad_json"),
        (b'{"keyspace": "restful", "name": "x", "colour": 1}', "bad_request"),
        (b'{"keyspace": "restful", "name": "x", "keys": "n"}', "bad_request"),
        (b'{"keyspace": "restful", "name": "bad name!", "keys": ["n"]}', "bad_request"),
        (b'{"statement": "CREATE INDEX x ON restful(n"}', "sql_syntax"),
        (b'{"statement": "DROP INDEX restful.by_n"}', "bad_request"),
        (b'{"keyspace": "no_such_ks", "name": "x", "keys": ["n"]}', "keyspace_not_found"),
    ):
        answer = env.get("/api/indexes", data=raw, method="POST")
        want = 404 if code == "keyspace_not_found" else 400
        assert (answer.status, answer.body["errors"][0]["code"]) == (want, code), raw
    assert "x" not in [i["name"] for i in env.admin.list_indexes(KS)]
    build = env.get(f"/api/indexes/{KS}/no_such_index/build", method="POST")
    assert build.status == 404, build.body
    get = env.get(f"/api/indexes/{KS}/by_n/build")
    assert (get.status, get.headers["Allow"]) == (405, "POST")
    reader = basic("reader", PW)
    body = json.dumps({"keyspace": KS, "name": "not_allowed", "keys": ["n"]}).encode()
    assert env.get("/api/indexes", headers=reader, data=body, method="POST").status == 403
    assert env.get(f"/api/indexes/{KS}/by_n", headers=reader, method="DELETE").status == 403
    assert env.get(f"/api/indexes/{KS}/by_n", headers=reader).status == 200


def test_rebalance_failover_and_recover(env: Env) -> None:
    bad = env.get("/api/rebalance", data=b'{"max_parallel": 0}', method="POST")
    assert (bad.status, bad.body["errors"][0]["code"]) == (400, "bad_request")
    started = env.get("/api/rebalance", node=1, data=b"{}", method="POST")
    assert started.status == 202, started.body
    rid = started.body["rebalance"]["id"]

    def over() -> dict | None:
        got = env.get("/api/rebalance", node=3).body["rebalance"]
        return got if got["id"] == rid and got["state"] != "running" else None

    done, _ = wait_for(over, timeout=120, what="the rebalance started over HTTP to end")
    assert (done["state"], done["progress"]) == ("done", 1.0), done
    # node4 holds partitions now; failing it over promotes their replicas
    (desc,) = [d for d in env.admin.list_keyspaces() if d.name == KS]
    holds = [p for p, n in desc.assignment.items() if n == "node4"]
    failed = env.get("/api/nodes/node4/failover", node=0, data=b"{}", method="POST")
    assert failed.status == 200, failed.body
    assert failed.body["failed_over"] == "node4"
    promoted = {int(p) for p in failed.body["promoted"].get(KS, {})}
    assert promoted == set(holds) and failed.body["lost"] == {}
    assert env.admin.failed_over().keys() == {"node4"}
    nodes = {n["name"]: n for n in env.get("/api/nodes").body["nodes"]}
    assert nodes["node4"]["failed_over"] and not nodes["node1"]["failed_over"]
    kind = env.get("/api/nodes/node4/recover", data=b'{"kind": "sideways"}', method="POST")
    assert (kind.status, kind.body["errors"][0]["code"]) == (400, "bad_request")
    back = env.get("/api/nodes/node4/recover", data=b'{"kind": "delta"}', method="POST")
    assert (back.status, back.body["recovered"], back.body["kind"]) == (200, "node4", "delta")
    assert env.admin.failed_over() == {}
    reader = basic("reader", PW)
    assert env.get("/api/rebalance", headers=reader, method="POST").status == 403
    assert env.get("/api/nodes/node4/failover", headers=reader, method="POST").status == 403
