"""The node's data dir: identity, member list file, instance lock, pid helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardex.errors import ConfigError, StorageError
from shardex.meta.member_list import MemberInfo, self_entry
from shardex.node.state import FileMemberStore, load_or_create_identity
from shardex.runtime.files import atomic_write_json
from shardex.runtime.pidfile import InstanceLock, is_locked, pid_alive


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    atomic_write_json(path, {"a": 1})
    atomic_write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_identity_is_created_once_and_tied_to_the_name(tmp_path: Path) -> None:
    ident, new = load_or_create_identity(tmp_path, "n1")
    assert new and len(ident.member_id) == 36
    again, new = load_or_create_identity(tmp_path, "n1")
    assert not new and again == ident
    with pytest.raises(ConfigError) as info:
        load_or_create_identity(tmp_path, "n2")
    assert (
        "belongs to node 'n1'" in info.value.message and "--name n1" in info.value.details["hint"]
    )
    (tmp_path / "node.json").write_text("{not json")
    with pytest.raises(StorageError):
        load_or_create_identity(tmp_path, "n1")


def test_member_store_round_trip(tmp_path: Path) -> None:
    store = FileMemberStore(tmp_path)
    assert store.load() is None
    members = [
        MemberInfo(member_id="a", name="a", address="127.0.0.1:1", services=("manager",)),
        MemberInfo(
            member_id="b", name="b", address="127.0.0.1:2", services=("data",), incarnation=3
        ),
    ]
    store.save(members)
    assert store.load() == members
    assert json.loads((tmp_path / "members.json").read_text())["version"] == 4


def test_self_entry_bumps_incarnation_only_on_change() -> None:
    old = [MemberInfo(member_id="a", name="a", address="h:1", services=("data",), incarnation=2)]
    assert self_entry("a", "a", "h:1", ["data"], old).incarnation == 2
    assert self_entry("a", "a", "h:9", ["data"], old).incarnation == 3
    assert self_entry("a", "a", "h:1", ["data", "manager"], old).incarnation == 3
    assert self_entry("new", "n", "h:1", ["data"], old).incarnation == 1


def test_instance_lock_is_exclusive(tmp_path: Path) -> None:
    assert not is_locked(tmp_path)
    lock = InstanceLock(tmp_path)
    lock.acquire()
    try:
        assert is_locked(tmp_path)
        # flock is per open file description: a second acquire in-process conflicts too.
        with pytest.raises(ConfigError, match="is running on"):
            InstanceLock(tmp_path).acquire(wait=0.1)
    finally:
        lock.release()
    assert not is_locked(tmp_path)


def test_pid_alive_treats_zombies_as_dead() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # Wait for exit without reaping: the child is a zombie until we call wait().
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert not pid_alive(child.pid)
    child.wait()
    assert not pid_alive(child.pid)
