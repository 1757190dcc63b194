"""One ``shardex node`` process: refusal without a secret, clean SIGTERM, persisted identity,
one process per data dir, and a ``cluster start`` that reports a node that cannot start."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import free_base_port, kill_leftovers, proc_env, run_cli, wait_for

from shardex.client import connect
from shardex.runtime.pidfile import pid_alive, read_pid

pytestmark = pytest.mark.cluster

SECRET = "process-test-secret-0123456789"


def node_cmd(data_dir: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "shardex.cli.node",
        "--name",
        "solo",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        *extra,
    ]


def spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = proc_env()
    with log.open("ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)


def test_refuses_to_start_without_secret(tmp_path: Path) -> None:
    env = proc_env()
    proc = subprocess.run(
        node_cmd(tmp_path / "d", free_base_port(1)), capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2
    assert "no cluster secret" in proc.stderr and "--secret-file" in proc.stderr
    bad = subprocess.run(
        [*node_cmd(tmp_path / "d", 70000), "--secret", SECRET],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 2 and "'port'" in bad.stderr and "70000" in bad.stderr


def test_sigterm_identity_and_single_instance(tmp_path: Path) -> None:
    data = tmp_path / "d"
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)  # a node refuses a secret other users may read
    port = free_base_port(1)
    cmd = node_cmd(data, port, "--secret-file", str(secret_file))
    p = spawn(cmd, tmp_path / "out1.log")
    try:
        wait_for(lambda: read_pid(data) == p.pid, 60, what="pid file")
        with connect(f"127.0.0.1:{port}", secret=SECRET) as c:
            first = c.ping()
        assert first.name == "solo" and first.pid == p.pid

        # A second process on the same data dir is refused (the flock), not started.
        second = subprocess.run(
            [*cmd, "--port", str(port + 1)], capture_output=True, text=True, env=proc_env()
        )
        assert second.returncode == 2 and "is running on" in second.stderr

        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == 0
        assert not (data / "node.pid").exists()
        log = (data / "node.log").read_text()
        assert "received SIGTERM" in log and "node solo stopped" in log
        assert "event loop uvloop" in log  # the default (``shardex.net.loops``)
        # Each line: timestamp, level, node name.
        assert all(" solo " in line for line in log.splitlines() if line[:2] == "20")

        identity = json.loads((data / "node.json").read_text())
        assert identity["member_id"] == first.member_id
        members = json.loads((data / "members.json").read_text())
        assert [m["name"] for m in members["members"]] == ["solo"]

        p = spawn(cmd, tmp_path / "out2.log")
        wait_for(lambda: read_pid(data) == p.pid, 60, what="pid file after restart")
        with connect(f"127.0.0.1:{port}", secret=SECRET) as c:
            assert c.ping().member_id == first.member_id  # same identity after restart
            assert c.cluster_status().version == 1  # and no phantom membership change
        # The data dir is tied to its node name.
        other = subprocess.run(
            [*node_cmd(data, port + 2, "--secret-file", str(secret_file)), "--name", "other"],
            capture_output=True,
            text=True,
            env=proc_env(),
        )
        assert other.returncode == 2
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_cluster_start_reports_a_node_that_cannot_start(tmp_path: Path) -> None:
    base = free_base_port(2)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", base + 1))  # node2's port is taken by someone else
    blocker.listen()
    try:
        proc = run_cli(
            "cluster",
            "start",
            "--no-pipeline",
            "--dir",
            str(tmp_path / "c"),
            "--nodes",
            "2",
            "--base-port",
            str(base),
            "--timeout",
            "20",
            check=False,
        )
        assert proc.returncode == 1
        assert "node2 failed" in proc.stderr
        assert "cannot listen" in proc.stderr  # the tail of node2's log is shown
        pid1 = read_pid(tmp_path / "c" / "node1")
        assert pid1 is not None and pid_alive(pid1)  # the healthy node keeps running
    finally:
        blocker.close()
        kill_leftovers(tmp_path / "c")
