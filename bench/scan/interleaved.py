"""The 100-row measurements of ``bench.scan``, PostgreSQL and shardex interleaved
(``rounds.schedule``), both servers up for the whole run, with what the idle peer costs.

Two client pools stay open side by side (one per system, ``max(levels)`` processes each);
each step measures one arm on its pool. Around every measurement the CPU of the server
processes is read from ``/proc`` - the 3 shardex node processes, the PostgreSQL postmaster
and its children (backends, checkpointer, walwriter, ...: every process under it, and the
CPU of children it already reaped) - and that of each pool's client processes, so each
sample carries its own system's server CPU and the idle peer's (servers and clients) as a
percentage of one core over the measurement's wall time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.runner import Row, load1, log
from bench.scan.clients import ClientPool, Target
from bench.scan.queries import CASES, Query
from bench.scan.rounds import POSTGRESQL, SHARDEX, arms, sample_row, schedule

_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state is [0], ppid [1],
    utime [11], stime [12], cutime [13], cstime [14]), or None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _parents() -> dict[int, list[int]]:
    """Every process's children, by parent pid."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def tree_cpu(root: int, children: dict[int, list[int]]) -> float:
    """CPU seconds (user + system) of ``root`` and every process under it, counting also the
    children they already reaped (cutime, cstime): a backend that exits keeps counting."""
    total = 0
    todo = [root]
    while todo:
        pid = todo.pop()
        fields = _stat_fields(pid)
        if fields is None:
            continue
        total += sum(int(f) for f in fields[11:15])
        todo.extend(children.get(pid, ()))
    return total / _TICK


def postmaster_pid(data_dir: Path) -> int:
    """The first line of ``postmaster.pid`` (readable: the server runs as us or we are
    root)."""
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


def node_pids(cluster_dir: Path) -> list[int]:
    """The node processes of a local cluster, from their pid files."""
    from shardex.meta import cluster_dir as cdir
    from shardex.runtime.pidfile import read_pid

    spec = cdir.load(cluster_dir)
    pids = [read_pid(n.path(cluster_dir)) for n in spec.nodes]
    if any(p is None for p in pids):
        raise RuntimeError(f"a node of {cluster_dir} has no pid file: {pids}")
    return [p for p in pids if p is not None]


class CpuProbe:
    """Cumulative CPU seconds of named process trees: ``sample()`` reads them all at once."""

    def __init__(self, roots: dict[str, Sequence[int]]) -> None:
        self.roots = {k: list(v) for k, v in roots.items()}

    def sample(self) -> dict[str, float]:
        children = _parents()
        return {k: sum(tree_cpu(p, children) for p in pids) for k, pids in self.roots.items()}


def cpu_percent(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    """Per tree, the CPU used between the samples as % of one core over ``wall`` seconds."""
    return {k: round(100 * (after[k] - before[k]) / wall, 1) for k in before} if wall else {}


def measure_interleaved(
    pg_target: Target,
    pg_data_dir: Path,
    sx_target: Target,
    cluster_dir: Path,
    queries: dict[str, list[Query]],
    consistencies: Sequence[str],
    levels: Sequence[int],
    rounds: int,
    seconds: float,
) -> list[Row]:
    """Every step of the schedule: one sample row each, with its load and CPU columns."""
    size = max(levels)
    with ClientPool(pg_target, size) as pg_pool, ClientPool(sx_target, size) as sx_pool:
        pools: dict[str, Any] = {POSTGRESQL: pg_pool, SHARDEX: sx_pool}
        probe = CpuProbe(
            {
                POSTGRESQL: [postmaster_pid(pg_data_dir)],
                SHARDEX: node_pids(cluster_dir),
                f"{POSTGRESQL} clients": [p.pid for p in pg_pool.procs],
                f"{SHARDEX} clients": [p.pid for p in sx_pool.procs],
            }
        )
        samples: list[Row] = []
        for step in schedule(CASES, levels, arms(consistencies), rounds):
            peer = SHARDEX if step.arm.system == POSTGRESQL else POSTGRESQL
            load = load1()
            cpu0, t0 = probe.sample(), time.monotonic()
            m = pools[step.arm.system].measure(
                queries[step.case], step.arm.setting, step.clients, seconds
            )
            cpu = cpu_percent(cpu0, probe.sample(), time.monotonic() - t0)
            row = sample_row(step, m.summary(), load)
            row["own cpu %"] = cpu.get(step.arm.system)
            row["peer cpu %"] = cpu.get(peer)
            row["peer clients cpu %"] = cpu.get(f"{peer} clients")
            if m.errors:
                row["first error"] = m.errors[0]
            samples.append(row)
            log(
                f"round {step.round} {step.arm.system} {step.case} {step.arm.label} "
                f"x{step.clients}: p50 {row['p50 ms']} ms, {row['scans/s']} scans/s, "
                f"server cpu {row['own cpu %']}%, idle {peer} {row['peer cpu %']}% "
                f"(load {load})"
            )
    return samples
