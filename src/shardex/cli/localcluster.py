"""Processes of a local cluster: which nodes run, spawning them detached, stopping them.

No UI here (``cli/cluster.py`` renders); everything returns plain data so tests and other
tools can reuse it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardex.client.probe import ProbeResult, committed_voters, probe_all
from shardex.meta import cluster_dir as cdir
from shardex.meta.cluster_dir import ClusterSpec, NodeSpec
from shardex.net.tcp import TcpTransport
from shardex.net.tls import TlsConfig
from shardex.node.state import LOG_FILE
from shardex.runtime.files import make_private_dir
from shardex.runtime.pidfile import is_locked, pid_alive, read_pid


@dataclasses.dataclass
class NodeProc:
    spec: NodeSpec
    data_dir: Path
    pid: int | None  # pid of the running process, None if not running

    @property
    def running(self) -> bool:
        return self.pid is not None


def node_procs(cluster_dir: Path, spec: ClusterSpec) -> list[NodeProc]:
    """Which nodes have a live process. The flock on node.lock is the truth (the kernel drops
    it at kill -9); the pid file only says which pid holds it."""
    procs = []
    for n in spec.nodes:
        d = n.path(cluster_dir)
        pid = read_pid(d) if is_locked(d) else None
        if pid is not None and not pid_alive(pid):
            pid = None
        procs.append(NodeProc(n, d, pid))
    return procs


def _spawn_detached(
    cmd: list[str], cwd: Path, log_path: Path, what: str
) -> subprocess.Popen[bytes]:
    """Start a process detached: own session (no terminal signals from the CLI's shell), stdin
    closed, stdout+stderr appended to ``log_path``, without a client's exported secret (it
    must use the cluster's secret file)."""
    make_private_dir(cwd)  # a node's data dir, or the pipeline's home: owner only
    env = dict(os.environ)
    env.pop("SHARDEX_SECRET", None)
    with open(log_path, "ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {what}\n".encode())
        log.flush()
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def spawn(cluster_dir: Path, node: NodeSpec) -> subprocess.Popen[bytes]:
    """Start one node detached, output appended to ``<node dir>/stdout.log``."""
    node_dir = node.path(cluster_dir)
    cmd = [
        sys.executable,
        "-m",
        "shardex.cli.node",
        "--config",
        str(node_dir / cdir.NODE_CONFIG_FILE),
    ]
    return _spawn_detached(cmd, node_dir, node_dir / cdir.STDOUT_FILE, node.name)


def spawn_pipeline(
    cluster_dir: Path, extra_args: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """Start the cluster's pipeline driver detached (``shardex pipeline --dir``), output
    appended to ``<cluster>/pipeline/stdout.log``."""
    from shardex.pipeline.process import STDOUT_FILE, pipeline_dir

    cluster_dir = cluster_dir.resolve()  # absolute: the child runs in its own directory
    home = pipeline_dir(cluster_dir)
    cmd = [sys.executable, "-m", "shardex.cli.main", "pipeline", "--dir", str(cluster_dir)]
    cmd += extra_args or []
    return _spawn_detached(cmd, home, home / STDOUT_FILE, "the pipeline")


def stop_pipeline(cluster_dir: Path, *, timeout: float, kill_wait: float = 5.0) -> StopOutcome:
    """SIGTERM the pipeline driver (it stops its queries), SIGKILL it after ``timeout``."""
    from shardex.pipeline.process import pipeline_pid

    pid = pipeline_pid(cluster_dir)
    if pid is None:
        return StopOutcome("pipeline", None, "not running")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return StopOutcome("pipeline", pid, "not running")
    _wait_gone({"pipeline": pid}, timeout)
    if not pid_alive(pid):
        return StopOutcome("pipeline", pid, "stopped")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait_gone({"pipeline": pid}, kill_wait)
    return StopOutcome("pipeline", pid, "still running" if pid_alive(pid) else "killed")


def probe_nodes(
    spec: ClusterSpec, secret: str, timeout: float = 2.0, *, tls: TlsConfig | None = None
) -> list[ProbeResult]:
    """``tls``: the cluster's client TLS settings (``cluster_dir.tls_config``), if it has."""
    addresses = [n.address for n in spec.nodes]
    transport = TcpTransport(tls=tls)
    return asyncio.run(probe_all(addresses, secret, timeout=timeout, transport=transport))


def readiness(spec: ClusterSpec, results: list[ProbeResult]) -> dict[str, str | None]:
    """Per node: ``None`` if it answers and its view has every member up, else why not."""
    names = {n.name for n in spec.nodes}
    why: dict[str, str | None] = {}
    for n, r in zip(spec.nodes, results, strict=True):
        if not r.up:
            why[n.name] = f"not answering ({r.error})" if r.error else "not answering"
            continue
        view = r.members
        if view is None:
            why[n.name] = "no membership view"
            continue
        states = {m.name: m.state for m in view.members}
        missing = sorted(names - states.keys())
        # A non-manager observer cannot see non-managers ("unknown"); only "down" counts.
        bad = sorted(k for k in names & states.keys() if states[k] == "down")
        if missing:
            why[n.name] = f"does not know {', '.join(missing)} yet"
        elif bad:
            why[n.name] = f"sees {', '.join(bad)} down"
        else:
            why[n.name] = None
    return why


def coordinator_voters(
    spec: ClusterSpec, secret: str, timeout: float, *, tls: TlsConfig | None = None
) -> list[str] | None:
    """The committed voters as the first manager node that answers reads them from the
    master (None: none answers, or no master)."""
    for n in spec.nodes:
        if "manager" in n.services:
            voters = asyncio.run(
                committed_voters(
                    n.address, secret, timeout=timeout, transport=TcpTransport(tls=tls)
                )
            )
            if voters is not None:
                return sorted(voters)
    return None


def voters_pending(
    spec: ClusterSpec, secret: str, *, tls: TlsConfig | None = None
) -> dict[str, str]:
    """Manager nodes of ``spec`` not yet among the coordinator's committed voters (a manager
    counts towards a majority only once the master admitted it, one at a time after it
    caught up): until then, losing the master could leave the others without a majority."""
    managers = {n.name for n in spec.nodes if "manager" in n.services}
    if not managers:
        return {}
    first = next(n for n in spec.nodes if n.name in managers)
    voters = asyncio.run(
        committed_voters(first.address, secret, timeout=0.5, transport=TcpTransport(tls=tls))
    )
    missing = managers - (voters or set())
    return {n: "not yet a coordinator voter" for n in sorted(missing)}


@dataclasses.dataclass
class StartOutcome:
    started: list[str]
    already_running: list[str]
    failed: dict[str, str]  # node -> reason (empty on success)
    results: list[ProbeResult]
    # node -> (old, new) HTTP port: the old one was taken by another process
    http_moved: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)


def start(
    cluster_dir: Path,
    spec: ClusterSpec,
    secret: str,
    *,
    timeout: float,
    progress: Callable[[str], None] = lambda _msg: None,
) -> StartOutcome:
    """Start the nodes that are not running, then wait (bounded) until every node answers an
    authenticated status and sees all members up, and every manager node is a committed
    coordinator voter."""
    procs = node_procs(cluster_dir, spec)
    children: dict[str, subprocess.Popen[bytes]] = {}
    already = [p.spec.name for p in procs if p.running]
    # A node's HTTP port taken by another process: the node gets a free one instead.
    spec, moved = cdir.reassign_http_ports(
        cluster_dir, spec, [p.spec.name for p in procs if not p.running]
    )
    if moved:
        procs = node_procs(cluster_dir, spec)
    for p in procs:
        if not p.running:
            children[p.spec.name] = spawn(cluster_dir, p.spec)
    deadline = time.monotonic() + timeout
    tls = cdir.tls_config(cluster_dir, spec)
    failed: dict[str, str] = {}
    results: list[ProbeResult] = []
    while True:
        # A child that already exited will not come up: report it now, not at the timeout.
        for name, child in children.items():
            rc = child.poll()
            if rc is not None and name not in failed:
                failed[name] = f"process exited with code {rc}"
        # Short probes: a child that died is noticed within a fraction of a second.
        results = probe_nodes(spec, secret, timeout=0.5, tls=tls)
        why = readiness(spec, results)
        pending = {k: v for k, v in why.items() if v is not None}
        if not pending:
            pending = voters_pending(spec, secret, tls=tls)
        progress(
            f"{len(spec.nodes) - len(pending)}/{len(spec.nodes)} nodes ready"
            + (f"; waiting for {', '.join(sorted(pending))}" if pending else "")
        )
        if failed or not pending:
            break
        if time.monotonic() >= deadline:
            failed.update({k: v for k, v in pending.items() if v is not None})
            break
        time.sleep(0.2)
    return StartOutcome(sorted(children), already, failed, results, moved)


@dataclasses.dataclass
class StopOutcome:
    node: str
    pid: int | None
    result: str  # "stopped" | "killed" | "not running" | "still running"


def stop(
    cluster_dir: Path, spec: ClusterSpec, *, timeout: float, kill_wait: float = 5.0
) -> list[StopOutcome]:
    """SIGTERM every running node, wait up to ``timeout``, SIGKILL the stragglers."""
    outcomes: dict[str, StopOutcome] = {}
    targets: dict[str, int] = {}
    for p in node_procs(cluster_dir, spec):
        if p.pid is None:
            outcomes[p.spec.name] = StopOutcome(p.spec.name, None, "not running")
            continue
        try:
            os.kill(p.pid, signal.SIGTERM)
            targets[p.spec.name] = p.pid
        except ProcessLookupError:
            outcomes[p.spec.name] = StopOutcome(p.spec.name, p.pid, "not running")
    _wait_gone(targets, timeout)
    for name, pid in targets.items():
        if not pid_alive(pid):
            outcomes[name] = StopOutcome(name, pid, "stopped")
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            outcomes[name] = StopOutcome(name, pid, "stopped")
            continue
        outcomes[name] = StopOutcome(name, pid, "killed")
    _wait_gone({k: v for k, v in targets.items() if outcomes[k].result == "killed"}, kill_wait)
    for name, pid in targets.items():
        if pid_alive(pid):
            outcomes[name] = StopOutcome(name, pid, "still running")
    return [outcomes[n.name] for n in spec.nodes]


def _wait_gone(pids: dict[str, int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)


def log_tail(node_dir: Path, lines: int = 20) -> str:
    """The end of the node's stdout.log (which has tracebacks too), else of node.log."""
    for name in (cdir.STDOUT_FILE, LOG_FILE):
        path = node_dir / name
        try:
            with path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 64 * 1024))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        return "\n".join(text.splitlines()[-lines:])
    return "(no log)"


def status_dict(
    cluster_dir: Path, spec: ClusterSpec, procs: list[NodeProc], results: list[ProbeResult]
) -> dict[str, Any]:
    """The ``cluster status --json`` document."""
    nodes = []
    view: dict[str, Any] | None = None
    for p, r in zip(procs, results, strict=True):
        n = p.spec
        st = r.status
        members_up = None
        if r.members is not None:
            members_up = sum(1 for m in r.members.members if m.state == "up")
            # The first live manager's view is the cluster view we show.
            if view is None and r.members.observer_is_manager:
                view = _view_dict(r)
        nodes.append(
            {
                "name": n.name,
                "address": n.address,
                "http_port": n.http_port,
                "pid": p.pid,
                "services": list(n.services),
                "state": "up" if r.up else "down",
                "member_id": st.member_id if st else None,
                "uptime": st.uptime if st else None,
                "membership_version": st.membership_version if st else None,
                "members_up": members_up,
                "data_dir": str(p.data_dir),
                "error": None if r.up or r.error is None else str(r.error),
            }
        )
    if view is None:
        view = next((_view_dict(r) for r in results if r.members is not None), None)
    up = sum(1 for x in nodes if x["state"] == "up")
    return {
        "dir": str(cluster_dir.absolute()),
        "nodes": nodes,
        "up": up,
        "total": len(nodes),
        "membership": view,
    }


def _view_dict(r: ProbeResult) -> dict[str, Any]:
    assert r.members is not None
    v = r.members
    return {
        "observer": v.observer,
        "observer_id": v.observer_id,
        "version": v.version,
        "digest": v.digest,
        "heartbeat_interval": v.heartbeat_interval,
        "failure_timeout": v.failure_timeout,
        "members": [
            {
                "name": m.name,
                "member_id": m.member_id,
                "address": m.address,
                "services": list(m.services),
                "state": m.state,
                "last_heartbeat_age": m.last_heartbeat_age,
                "incarnation": m.incarnation,
                "group": m.group,
            }
            for m in v.members
        ],
    }
