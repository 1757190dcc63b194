"""Users and roles on a real 3-node local cluster: the admin ``shardex cluster start`` made
(its password 0600 in the cluster dir), users made with ``shardex user``, each role against
each kind of operation (the RBAC matrix), and the audit log of what they did."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster, run_cli
from data_helpers import running_cluster

from shardex.client import Client, connect, connect_local
from shardex.errors import ErrorCode, ShardexError

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(300)]

KS, OTHER = "orders", "other"
PW = "pw-0123456789"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("users")) as c:
        with connect_local(Path(c.path)) as admin:
            for ks in (KS, OTHER):
                admin.create_keyspace(ks, 4)
                admin.keyspace(ks).upsert("d1", {"n": 1})
                # Never built (no pipeline runs here): a scan of it that is let through
                # fails for that reason, one that is not for the privilege.
                admin.create_index(ks, "ix", ["n"], defer_build=True)
        yield c


def _addresses(cluster: LocalCluster) -> list[str]:
    spec = json.loads((Path(cluster.path) / "cluster.json").read_text())
    return [n["address"] for n in spec["nodes"]]


def _user(cluster: LocalCluster, name: str, *roles: str) -> Client:
    """A client logged in as ``name``, created with ``roles`` through the CLI."""
    pw_file = Path(cluster.path) / f"{name}.pw"
    pw_file.write_text(PW + "\n")
    run_cli(
        "user", "create", name, *roles, "--dir", str(cluster.path), "--password-file", str(pw_file)
    )
    return connect(_addresses(cluster), username=name, password=PW, request_timeout=20)


# Each operation kind, run on a keyspace. A permitted call either succeeds or fails for a
# reason of its own (the index or node does not exist): never AUTH_FAILED.
OPS: dict[str, Callable[[Client, str], Any]] = {
    "get": lambda c, ks: c.keyspace(ks).get("d1"),
    "upsert": lambda c, ks: c.keyspace(ks).upsert("d2", {"n": 2}),
    "select": lambda c, ks: list(c.query(f"SELECT * FROM {ks} USE KEYS 'd1'")),
    "update": lambda c, ks: list(c.query(f"UPSERT INTO {ks} (KEY, VALUE) VALUES ('d3', {{}})")),
    "scan": lambda c, ks: list(c.scan(ks, "ix")),
    "page": lambda c, ks: c.scan_page(ks, "ix"),
    "ddl": lambda c, ks: c.drop_index(ks, "no_such_index"),
    "cluster": lambda c, ks: c.failover("no_such_node"),
    "users": lambda c, ks: c.list_users(),
}

# role -> the operation kinds it may run on KS (written out, not derived from the code)
ALLOWED: dict[str, set[str]] = {
    "admin": set(OPS),
    "cluster_admin": {"ddl", "cluster"},
    f"keyspace_admin({KS})": {"ddl"},
    f"data_reader({KS})": {"get"},
    f"data_writer({KS})": {"upsert"},
    f"query_select({KS})": {"select", "scan", "page"},
    f"query_update({KS})": {"update"},
    "data_reader(*)": {"get"},
}
# the roles that reach OTHER too (cluster-wide ones, and "*")
EVERY_KEYSPACE = {"admin", "cluster_admin", "data_reader(*)"}


def _denied(fn: Callable[..., Any], *args: Any) -> bool:
    try:
        fn(*args)
    except ShardexError as e:
        if e.code is ErrorCode.AUTH_FAILED:
            assert e.details.get("privilege"), e  # a denial names what is missing
            return True
    return False


def test_the_local_cluster_admin_password_is_private(cluster: LocalCluster) -> None:
    for name in ("admin-password", "admin.json", "secret"):
        mode = stat.S_IMODE((Path(cluster.path) / name).stat().st_mode)
        assert mode == 0o600, (name, oct(mode))
    with pytest.raises(ShardexError) as info:
        connect(_addresses(cluster), username="admin", password="wrong")
    assert info.value.code is ErrorCode.AUTH_FAILED


def test_each_role_against_each_operation(cluster: LocalCluster) -> None:
    for i, (role, allowed) in enumerate(ALLOWED.items()):
        with _user(cluster, f"u{i}", role) as c:
            for op, fn in OPS.items():
                denied = _denied(fn, c, KS)
                assert denied == (op not in allowed), (role, op, KS)
                if op in ("get", "upsert", "select", "update", "scan", "page"):
                    denied_other = _denied(fn, c, OTHER)
                    reach = op in allowed and role in EVERY_KEYSPACE
                    assert denied_other == (not reach), (role, op, OTHER)


def test_user_commands_and_the_audit_log(cluster: LocalCluster) -> None:
    with _user(cluster, "ann", f"data_reader({KS})") as c:
        assert _denied(lambda: c.keyspace(KS).upsert("x", {}))
        assert _denied(lambda: c.create_keyspace("anns"))
    d = ["--dir", str(cluster.path)]
    run_cli("user", "grant", "ann", f"data_writer({KS})", *d)
    listed = json.loads(run_cli("user", "list", "--json", *d).stdout)
    assert {"name": "ann", "roles": [f"data_reader({KS})", f"data_writer({KS})"]} in listed
    with connect(_addresses(cluster), username="ann", password=PW) as c:
        c.keyspace(KS).upsert("x", {"by": "ann"})
    run_cli("user", "revoke", "ann", f"data_writer({KS})", *d)
    run_cli("user", "drop", "ann", *d)
    with pytest.raises(ShardexError) as info:
        connect(_addresses(cluster), username="ann", password=PW)
    assert info.value.code is ErrorCode.AUTH_FAILED

    events = []
    for log in Path(cluster.path).glob("node*/audit.log"):
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        events += [json.loads(line) for line in log.read_text().splitlines()]
    kinds = {(e["event"], e.get("user"), e.get("type")) for e in events}
    assert ("login", "ann", None) in kinds
    assert ("login_failed", "ann", None) in kinds
    assert ("denied", "ann", "manager.CreateKeyspace") in kinds
    assert ("ddl", "admin", "manager.GrantRoles") in kinds
    assert ("ddl", "admin", "manager.DropUser") in kinds
    assert not any("stored_key" in json.dumps(e) for e in events)
