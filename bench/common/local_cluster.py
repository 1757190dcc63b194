"""A throwaway local shardex cluster for a benchmark: ``shardex cluster start`` (no
pipeline) on a free range of loopback ports in a fresh directory, always stopped and
removed afterwards; and the CLI command line the benchmarks run.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.common.postgres import no_interrupts
from shardex.testing.ports import free_base_port, ports_free

__all__ = [
    "free_base_port",
    "node_pids",
    "ports_free",
    "shardex_cli",
    "shardex_cluster",
    "start_stopped_nodes",
]


def _log(msg: str) -> None:
    print(f"[local_cluster] {msg}", file=sys.stderr, flush=True)


def shardex_cli() -> list[str]:
    """The ``shardex`` CLI beside this interpreter, else the module run by it."""
    exe = Path(sys.executable).with_name("shardex")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "shardex.cli.main"]


def _start(cmd: list[str]) -> None:
    _log(f"running: {' '.join(cmd)}")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"shardex cluster start failed ({proc.returncode}):\n{proc.stdout}")


def start_stopped_nodes(cluster_dir: Path) -> None:
    """``shardex cluster start`` again: starts the nodes that are not running (after a kill
    -9) and waits until every node answers and sees all members up."""
    _start([*shardex_cli(), "cluster", "start", "--dir", str(cluster_dir), "--no-pipeline"])


def node_pids(cluster_dir: Path) -> dict[str, int]:
    """Node name -> pid of every node of the cluster whose pid file names one."""
    from shardex.meta import cluster_dir as cdir
    from shardex.runtime.pidfile import read_pid

    pids = {n.name: read_pid(n.path(cluster_dir)) for n in cdir.load(cluster_dir).nodes}
    return {name: pid for name, pid in pids.items() if pid is not None}


@contextlib.contextmanager
def shardex_cluster(base_dir: Path, nodes: int, extra: Sequence[str] = ()) -> Iterator[Path]:
    """``shardex cluster start --nodes N [extra]`` in a fresh dir under ``base_dir`` (``extra``:
    more options of a new cluster, e.g. ``--auto-failover-timeout 2``); always stopped."""
    from shardex.meta.cluster_dir import HTTP_PORT_OFFSET

    cdir = Path(tempfile.mkdtemp(prefix=f"shardex-{nodes}n-", dir=base_dir)) / "cluster"
    port = free_base_port(nodes, HTTP_PORT_OFFSET)
    cmd = [*shardex_cli(), "cluster", "start", "--nodes", str(nodes), "--dir", str(cdir)]
    cmd += ["--no-pipeline", "--base-port", str(port), *extra]
    try:
        _start(cmd)
        yield cdir
    finally:
        with no_interrupts():
            stop = subprocess.run(
                [*shardex_cli(), "cluster", "stop", "--dir", str(cdir)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            if stop.returncode != 0 and cdir.exists():
                _log(f"shardex cluster stop: {stop.stdout.strip()}")
            shutil.rmtree(cdir.parent, ignore_errors=True)
            _log(f"stopped the {nodes}-node cluster and removed {cdir.parent}")
