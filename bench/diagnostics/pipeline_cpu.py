"""The pipeline's CPU budget at a sustained write rate:
``python -m bench.diagnostics.pipeline_cpu``.

Runs ``bench.pipeline --quick --part 3`` (freshness at ``--rate`` offered mutations/s for
``--seconds``; extra ``bench.pipeline`` options pass through after ``--``) and, while its
writers load the cluster, samples every thread of every process involved from ``/proc``
(``utime + stime`` of ``/proc/<pid>/task/<tid>/stat``, 10 ms ticks): the 3 node processes
(split by thread: the event loop, the data write/stream pool ``data-io``, the indexer's
``index-io``, RocksDB's background threads, the rest), the writer processes (the bench's
load generator, not the product), the Spark JVM, Spark's Python processes (workers and the
streaming source runner), the driver's Python (this process; its threads by their Python
names, this sampler apart) and the bench's poller. The window is the writers' first to last
acknowledgement, so process start-up and the drain after the load are outside it.

``--drain N`` budgets part 2 instead: a backlog of N updates written with the pipeline
stopped, then drained by a new driver; the window runs from the drain's first batch to the
moment every index covered the backlog (the writers are outside it), per mutation drained.

Prints CPU seconds per second of the window (cores) and microseconds of CPU per
acknowledged mutation for each, the machine's total CPU from ``/proc/stat`` beside them (the
rest is other work on a shared machine), and the indexers' ``index-io`` threads node by node
(how evenly the index load is placed; ``-- --rebalance`` rebalances the indexers first), and
writes JSON (``bench/results/pipeline-cpu.json`` unless ``--json``) with the per-thread
detail.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import bench.pipeline.maintain as maintain_bench
import bench.pipeline.run as pipeline_bench
from bench.common.harness import bench_main
from bench.common.runner import RESULTS_DIR, Row, machine_info

TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(text: str) -> tuple[str, list[str]]:
    """(comm, the fields after it) of a ``/proc/.../stat`` line (comm may hold spaces)."""
    lo, hi = text.index("("), text.rindex(")")
    return text[lo + 1 : hi], text[hi + 2 :].split()


def read_threads(pid: int) -> dict[int, tuple[str, int, int]]:
    """tid -> (comm, utime + stime, stime) in ticks for every thread of ``pid``; {} once it
    is gone."""
    out: dict[int, tuple[str, int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                comm, rest = _stat_fields(f.read())
        except OSError:  # the thread ended between listdir and open
            continue
        out[int(t)] = (comm, int(rest[11]) + int(rest[12]), int(rest[12]))
    return out


def parents() -> dict[int, int]:
    """pid -> parent pid of every process on the machine."""
    out: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                _, rest = _stat_fields(f.read())
        except OSError:
            continue
        out[int(name)] = int(rest[1])
    return out


def descendants(roots: Iterable[int], ppid: dict[int, int]) -> set[int]:
    kids: dict[int, list[int]] = defaultdict(list)
    for pid, parent in ppid.items():
        kids[parent].append(pid)
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(kids.get(pid, ()))
    return seen


def machine_ticks() -> int:
    """Busy ticks of all CPUs (user, nice, system, irq, softirq, steal) from /proc/stat."""
    with open("/proc/stat") as f:
        cpu = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in cpu[:8])
    return user + nice + system + irq + softirq + steal


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


@dataclass
class Series:
    """One thread's CPU ticks over time, (time, all, system) per sample (from its first
    sample if it ran when the sampler started, else from 0: a thread born later used
    everything it used inside the sampling)."""

    pid: int
    tid: int
    comm: str
    points: list[tuple[float, int, int]] = field(default_factory=list)
    born_after_start: bool = False

    def at(self, t: float, col: int = 1) -> float:
        """Ticks (``col`` 1: all, 2: system) at time ``t``, linear between samples; 0
        before a late-born thread's first sample, the last value after its end."""
        pts = self.points
        if t <= pts[0][0]:
            return 0.0 if self.born_after_start else float(pts[0][col])
        if t >= pts[-1][0]:
            return float(pts[-1][col])
        ts = [p[0] for p in pts]
        i = int(np.searchsorted(ts, t))
        t0, v0, t1, v1 = pts[i - 1][0], pts[i - 1][col], pts[i][0], pts[i][col]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


class CpuSampler:
    """Samples every thread of ``roots()`` and their descendants every ``interval`` s on a
    thread of its own (whose CPU is reported apart), plus the machine's busy ticks."""

    def __init__(self, roots: Callable[[], set[int]], interval: float = 0.5) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, not {interval}")
        self.roots = roots
        self.interval = interval
        self.series: dict[tuple[int, int], Series] = {}
        self.cmdlines: dict[int, str] = {}
        self.ppid: dict[int, int] = {}
        self.machine: list[tuple[float, int, int]] = []
        self.py_names: dict[int, str] = {}  # native id -> Python name, threads of this process
        self.sampler_tid: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._started = False

    def start(self) -> None:
        self._sample(first=True)
        self._started = True
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sample(first=False)

    def _run(self) -> None:
        self.sampler_tid = threading.get_native_id()
        while not self._stop.wait(self.interval):
            self._sample(first=False)

    def _sample(self, first: bool) -> None:
        now = time.time()
        ppid = parents()
        pids = descendants(self.roots(), ppid)
        for pid in pids:
            if pid not in self.cmdlines:
                self.cmdlines[pid] = cmdline(pid)
                self.ppid[pid] = ppid.get(pid, 0)
            for tid, (comm, ticks, sys_ticks) in read_threads(pid).items():
                s = self.series.get((pid, tid))
                if s is None:
                    s = Series(pid, tid, comm, born_after_start=not first)
                    self.series[(pid, tid)] = s
                s.comm = comm
                s.points.append((now, ticks, sys_ticks))
        for t in threading.enumerate():
            if t.native_id is not None:
                self.py_names[t.native_id] = t.name
        self.machine.append((now, machine_ticks(), 0))

    def window(self, a: float, b: float) -> dict[tuple[int, int], tuple[float, float]]:
        """(CPU seconds, of which system) of each (pid, tid) between times ``a`` and ``b``."""
        return {
            k: ((s.at(b) - s.at(a)) / TICK, (s.at(b, 2) - s.at(a, 2)) / TICK)
            for k, s in self.series.items()
            if s.points
        }

    def machine_seconds(self, a: float, b: float) -> float:
        m = Series(0, 0, "machine", self.machine)
        return (m.at(b) - m.at(a)) / TICK


# --- attribution ----------------------------------------------------------------------------


def node_thread(pid: int, tid: int, comm: str) -> str:
    if tid == pid:
        return "event loop"
    if comm.startswith(("data-io", "index-io", "index-scan")):
        return comm
    if comm.startswith("rocksdb"):
        return "rocksdb background"
    return "other threads"


def jvm_thread(comm: str) -> str:
    if comm.startswith(("C1 ", "C2 ")):
        return "JIT"
    if comm.startswith(("GC ", "VM Thread", "G1 ")) or comm in ("VM Periodic Tas",):
        return "GC + VM"
    if comm.startswith("stream executi"):
        return "stream execution"
    if comm.startswith("Executor task"):
        return "task threads"
    return "other threads"


@dataclass
class Roles:
    """Which process is what: filled in by the bench hook as it learns the pids."""

    nodes: dict[int, str] = field(default_factory=dict)  # pid -> node name
    writers: set[int] = field(default_factory=set)
    poller: set[int] = field(default_factory=set)

    def component(self, sampler: CpuSampler, pid: int, tid: int, comm: str) -> tuple[str, str]:
        """(process group, thread group) of one thread."""
        if pid in self.nodes:
            return "nodes (3)", node_thread(pid, tid, comm)
        if pid in self.writers:
            return "writers (bench load)", "all"
        if pid in self.poller:
            return "poller (bench)", "all"
        me = os.getpid()
        if pid == me:
            if tid == sampler.sampler_tid:
                return "this sampler (bench)", "all"
            name = sampler.py_names.get(tid, "")
            return "driver Python", _driver_thread(name, tid == me)
        cmd = sampler.cmdlines.get(pid, "")
        if "java" in cmd.split(" ", 1)[0]:
            return "Spark JVM", jvm_thread(comm)
        if "python" in cmd and _under_java(sampler, pid):
            if "daemon" in cmd:
                return "Spark Python", "pyspark daemon + workers"
            return "Spark Python", "worker / source runner"
        return "other (bench children)", cmd[:40]


def _driver_thread(name: str, main: bool) -> str:
    if main:
        return "main"
    if not name:
        return "native (no Python name)"
    # Thread names carry counters ("Thread-12 (run)", "shardex-client-3"): group by stem.
    for stem in ("read-ahead", "deliver-taken", "shardex-client", "Thread-"):
        if name.startswith(stem):
            return stem.rstrip("-")
    return name.split(" ")[0]


def _under_java(sampler: CpuSampler, pid: int) -> bool:
    seen = set()
    while pid and pid not in seen:
        seen.add(pid)
        pid = sampler.ppid.get(pid, 0)
        if "java" in sampler.cmdlines.get(pid, "").split(" ", 1)[0]:
            return True
    return False


def budget(
    sampler: CpuSampler, roles: Roles, a: float, b: float, mutations: int
) -> tuple[list[Row], list[Row], dict[str, Any]]:
    """(process rows, thread rows, detail) for the window [a, b]."""
    secs = b - a
    per_proc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    per_thread: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    detail: dict[str, list[Any]] = defaultdict(list)
    for (pid, tid), (cpu, sys_cpu) in sampler.window(a, b).items():
        comm = sampler.series[(pid, tid)].comm
        proc, thr = roles.component(sampler, pid, tid, comm)
        for acc in (per_proc[proc], per_thread[(proc, thr)]):
            acc[0] += cpu
            acc[1] += sys_cpu
        if cpu >= 0.01:
            detail[proc].append(
                {"pid": pid, "tid": tid, "comm": comm, "group": thr, "cpu_s": cpu, "sys_s": sys_cpu}
            )
    ours = sum(v[0] for v in per_proc.values())
    machine = sampler.machine_seconds(a, b)

    def row(name: str, cpu: float, sys_cpu: float | None, **extra: Any) -> Row:
        return {
            **extra,
            "component": name,
            "cpu s": round(cpu, 2),
            "cores": round(cpu / secs, 3),
            "us / mutation": round(cpu / mutations * 1e6, 1) if mutations else float("nan"),
            "share %": round(100 * cpu / ours, 1) if ours else float("nan"),
            "system %": "" if sys_cpu is None or cpu <= 0 else round(100 * sys_cpu / cpu),
        }

    order = sorted((k for k in per_proc if per_proc[k][0] > 0), key=lambda k: -per_proc[k][0])
    procs = [row(k, *per_proc[k]) for k in order]
    procs.append(row("all of the above", ours, sum(v[1] for v in per_proc.values())))
    procs.append(row("machine (all processes, /proc/stat)", machine, None))
    threads = [
        row(thr, cpu, sys_cpu, process=proc)
        for (proc, thr), (cpu, sys_cpu) in sorted(
            per_thread.items(), key=lambda kv: (kv[0][0], -kv[1][0])
        )
        if cpu >= 0.005
    ]
    for rows in detail.values():
        rows.sort(key=lambda r: -r["cpu_s"])
    # The indexers' I/O threads node by node: how evenly the index load is placed.
    index_io: dict[str, float] = defaultdict(float)
    for rows in detail.values():
        for r in rows:
            if r["pid"] in roles.nodes and r["group"].startswith("index-io"):
                index_io[roles.nodes[r["pid"]]] += r["cpu_s"]
    info = {
        "index_io_us_per_mutation": {
            n: round(cpu / mutations * 1e6, 1) if mutations else float("nan")
            for n, cpu in sorted(index_io.items())
        },
        "window_s": secs,
        "mutations": mutations,
        "machine_cpu_s": machine,
        "node_pids": roles.nodes,
        "threads": dict(detail),
    }
    return procs, threads, info


# --- the hook into bench.pipeline -------------------------------------------------------------


@dataclass
class Capture:
    sampler: CpuSampler | None = None
    roles: Roles = field(default_factory=Roles)
    windows: list[tuple[float, float, int]] = field(default_factory=list)
    results: list[tuple[list[Row], list[Row], dict[str, Any]]] = field(default_factory=list)


def node_pids(cluster_dir: Path) -> dict[int, str]:
    out: dict[int, str] = {}
    for f in sorted(Path(cluster_dir).glob("*/node.pid")):
        try:
            out[int(f.read_text().split()[0])] = f.parent.name
        except (OSError, ValueError, IndexError):
            continue
    if not out:
        raise RuntimeError(f"no node.pid under {cluster_dir}: is the cluster running?")
    return out


def install(capture: Capture, interval: float) -> Callable[[], None]:
    """Wrap ``write_updates`` (what part 3's ``freshness`` calls) so the sampler runs while
    the writers run; returns the function that restores it."""
    original = maintain_bench.write_updates

    def write_updates(procs: Any, work: Path, cluster_dir: Path, **kw: Any) -> np.ndarray:
        roles = capture.roles
        roles.nodes = node_pids(cluster_dir)
        # Part 3 starts its poller before the writers: what runs already is the poller.
        before = {p.pid for p in procs.procs if p.is_alive()}
        roles.poller |= before
        sampler = CpuSampler(lambda: {os.getpid(), *roles.nodes}, interval)
        capture.sampler = sampler
        sampler.start()
        try:
            acks = original(procs, work, cluster_dir, **kw)
        finally:
            roles.writers |= {p.pid for p in procs.procs if p.pid not in before}
            sampler.stop()
        if len(acks) > 1:
            a, b = float(acks[:, 2].min()), float(acks[:, 2].max())
            capture.windows.append((a, b, len(acks)))
            capture.results.append(budget(sampler, roles, a, b, len(acks)))
        return acks

    maintain_bench.write_updates = write_updates

    def restore() -> None:
        maintain_bench.write_updates = original

    return restore


def install_drain(capture: Capture, interval: float) -> Callable[[], None]:
    """Wrap part 2's ``drain`` so the sampler runs through it, and ``wait_covered`` to learn
    when the backlog was covered; the window is the drain's first batch to that moment."""
    original_drain = pipeline_bench.drain
    original_wait = maintain_bench.wait_covered
    covered: list[float] = []

    def wait_covered(*args: Any, **kw: Any) -> Any:
        out = original_wait(*args, **kw)
        covered.append(time.time())
        return out

    def drain(ctx: Any, driver: Any, mutations: int, *args: Any, **kw: Any) -> Any:
        roles = capture.roles
        roles.nodes = node_pids(ctx.cluster_dir)
        sampler = CpuSampler(lambda: {os.getpid(), *roles.nodes}, interval)
        capture.sampler = sampler
        sampler.start()
        try:
            rows, stats, new_driver = original_drain(ctx, driver, mutations, *args, **kw)
        finally:
            sampler.stop()
        b = covered[-1]
        a = b - float(rows[0]["from 1st batch s"])
        n = int(rows[0]["mutations"])
        capture.windows.append((a, b, n))
        capture.results.append(budget(sampler, roles, a, b, n))
        return rows, stats, new_driver

    pipeline_bench.drain = drain
    maintain_bench.wait_covered = wait_covered

    def restore() -> None:
        pipeline_bench.drain = original_drain
        maintain_bench.wait_covered = original_wait

    return restore


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(
        prog="python -m bench.diagnostics.pipeline_cpu", description=__doc__
    )
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    ap.add_argument("--json", type=Path, default=RESULTS_DIR / "pipeline-cpu.json")
    ap.add_argument("--drain", type=int, metavar="N", help="budget a drain of N updates")
    ap.add_argument("rest", nargs="*", help="after --: more bench.pipeline options")
    args = ap.parse_args(argv)
    if args.interval <= 0:
        ap.error("--interval must be > 0")
    if args.drain is not None:
        return args, ["--quick", "--part", "2", "--mutations", str(args.drain), *args.rest]
    return args, ["--quick", "--part", "3", *args.rest]


def main(argv: Sequence[str] | None = None) -> int:
    args, pipeline_argv = parse_args(argv)
    plan, _ = pipeline_bench.parse_args(pipeline_argv)
    capture = Capture()
    if args.drain is not None:
        restore = install_drain(capture, args.interval)
    else:
        restore = install(capture, args.interval)

    def run(plan: Any) -> dict[str, Any]:
        out = pipeline_bench.run(plan)
        for i, (procs, threads, info) in enumerate(capture.results):
            tag = "" if len(capture.results) == 1 else f" #{i + 1}"
            out["tables"][f"CPU by process{tag} ({info['window_s']:.1f} s window)"] = procs
            out["tables"][f"CPU by thread group{tag}"] = threads
            out["tables"][f"index-io per node{tag}"] = [
                {"node": n, "us / mutation": us}
                for n, us in info["index_io_us_per_mutation"].items()
            ]
            out.setdefault("cpu", []).append(info)
        return out

    def summary(out: dict[str, Any], elapsed: float) -> str:
        windows = ", ".join(f"{b - a:.1f} s / {n} mutations" for a, b, n in capture.windows)
        return (
            f"CPU budget of bench.pipeline {' '.join(pipeline_argv)} on "
            f"{machine_info()['cpu_count']} CPUs; window(s) {windows}; load average start "
            f"{out['load_avg_start']}, end {out['load_avg_end']}; {elapsed:.0f} s"
        )

    try:
        return bench_main("pipeline-cpu", plan, args.json, run, summary)
    finally:
        restore()


if __name__ == "__main__":
    sys.exit(main())
