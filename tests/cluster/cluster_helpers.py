"""Helpers for real-process cluster tests: free ports, running the CLI, cleanup."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from shardex.runtime.pidfile import pid_alive, read_pid
from shardex.testing.ports import free_base_port as free_base_port  # the tests' one picker
from shardex.testing.procs import CLI as CLI
from shardex.testing.procs import proc_env as proc_env
from shardex.testing.procs import wait_for as wait_for


def run_cli(
    *args: str, timeout: float = 60.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = proc_env()
    env["COLUMNS"] = "200"  # rich tables: no wrapping in assertions on text output
    proc = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"shardex {' '.join(args)} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def status_json(cluster_dir: Path) -> dict[str, Any]:
    proc = run_cli("cluster", "status", "--dir", str(cluster_dir), "--json")
    return json.loads(proc.stdout)  # exactly one JSON object on stdout


def kill_leftovers(cluster_dir: Path) -> None:
    """Last-resort cleanup: SIGKILL any node process still running in ``cluster_dir``."""
    for node_dir in cluster_dir.glob("node*"):
        pid = read_pid(node_dir)
        if pid is not None and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class LocalCluster:
    def __init__(self, path: Path, nodes: int, base_port: int) -> None:
        self.path = path
        self.nodes = nodes
        self.base_port = base_port

    def start(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return run_cli("cluster", "start", "--dir", str(self.path), "--no-pipeline", *extra)

    def address(self, i: int) -> str:
        return f"127.0.0.1:{self.base_port + i - 1}"

    def pid(self, i: int) -> int | None:
        return read_pid(self.path / f"node{i}")

    def secret(self) -> str:
        return (self.path / "secret").read_text().strip()
