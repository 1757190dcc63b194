"""Where a 100-row scan's time goes: ``python -m bench.diagnostics.scan_profile setup|run DIR``.

A development tool beside ``bench.scan`` (which needs PostgreSQL and a Spark build per run):

* ``setup DIR``: a 3-node cluster in ``DIR/cluster`` (``--tls``: TLS on every connection,
  as ``shardex cluster start --tls``), the bench's documents (``--docs``, default 20,000),
  both indexes built once by the Spark pipeline, then the cluster is stopped. The
  directory is kept, so ``run`` can restart the same cluster many times.
* ``run DIR``: start the cluster (no pipeline), run ``--scans`` scans of every case at
  not_bounded and request_plus from one in-process client, the two taking turns in rounds
  of 20 (a load spike from other work hits both), print p50/p90 per case, the CPU time per
  scan of the three node processes and the client (less sensitive to a loaded machine than
  wall time) and the request_plus / not_bounded p50 ratio, and stop the cluster.
  ``--profile`` adds a cProfile of the client side, ``--profile-nodes OUT`` one of every
  node per case (``bench/diagnostics/node_profile.py``; compare two runs' files with ``pstats``);
  ``--case`` and ``--consistency`` narrow the run.

The cluster is always stopped before the command returns (``cluster stop``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common.dataset import KEYSPACE, SEED
from bench.common.local_cluster import free_base_port, shardex_cli
from bench.common.runner import load1, log, percentile
from bench.diagnostics.node_profile import node_profiling, start_profiles, stop_profiles
from bench.scan.queries import CASES, KeyStats, build_queries

CONSISTENCIES = ("not_bounded", "request_plus")
ROUND = 20  # scans of one consistency before the other's turn


@contextmanager
def running(
    cdir: Path, new: bool, env: dict[str, str] | None = None, tls: bool = False
) -> Iterator[None]:
    """The cluster in ``cdir`` started (its nodes with ``env``, default this one's), stopped
    on exit; a ``new`` one with TLS on every connection when ``tls``."""
    from shardex.meta.cluster_dir import HTTP_PORT_OFFSET

    cmd = [*shardex_cli(), "cluster", "start", "--dir", str(cdir), "--no-pipeline"]
    if new:
        cmd += ["--nodes", "3", "--base-port", str(free_base_port(3, HTTP_PORT_OFFSET))]
        cmd += ["--tls"] if tls else []
    try:
        proc = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        if proc.returncode != 0:
            raise RuntimeError(f"cluster start failed:\n{proc.stdout}")
        yield
    finally:
        subprocess.run(
            [*shardex_cli(), "cluster", "stop", "--dir", str(cdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def node_pids(cdir: Path) -> list[int]:
    """The node processes of the cluster in ``cdir`` (their command lines name it)."""
    pids = []
    # Either spelling: a symlinked directory is named as given on the nodes' command lines.
    markers = {str(cdir).encode(), str(cdir.resolve()).encode()}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if any(m in cmdline for m in markers):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def cpu_seconds(pids: Sequence[int]) -> tuple[float, float]:
    """User + system CPU seconds of ``pids`` (the nodes), and of this process (the client)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    t = os.times()
    return total, t.user + t.system


def setup(base: Path, docs: int, tls: bool = False) -> None:
    from bench.common.dataset import create_indexes
    from bench.common.driver import shardex_build

    def build(client: Any, driver: Any) -> None:
        create_indexes(client)
        shardex_build(client, driver, docs, timeout=3600)

    setup_cluster(base, docs, "shardex-scan-profile", build, tls=tls)


def setup_cluster(
    base: Path, docs: int, app_name: str, build: Callable[[Any, Any], None], tls: bool = False
) -> None:
    """The kept cluster of a ``setup DIR``: 3 nodes in ``DIR/cluster`` (TLS on every
    connection when ``tls``), ``docs`` demo users loaded, ``build(client, driver)`` run with
    a pipeline driver on a SparkSession of this process, then the cluster stopped
    (``DIR/docs.txt`` records the count)."""
    from bench.common.dataset import shardex_load, write_docs
    from bench.common.harness import spark_driver
    from shardex.client import connect_local

    base.mkdir(parents=True, exist_ok=True)
    files, _ = write_docs(base, docs, SEED, 3)
    cdir = base / "cluster"
    with running(cdir, new=True, tls=tls), connect_local(cdir) as client:
        client.create_keyspace(KEYSPACE, num_partitions=64, num_replicas=0)
        shardex_load(cdir, files, base)
        with spark_driver(base, cdir, app_name) as driver:
            build(client, driver)
    (base / "docs.txt").write_text(str(docs))
    log(f"set up {base}")


def measure(
    base: Path,
    scans: int,
    profile: bool,
    cases: Sequence[str] = CASES,
    consistencies: Sequence[str] = CONSISTENCIES,
    nodes_out: Path | None = None,
) -> None:
    with contextlib.ExitStack() as stack:
        if nodes_out is not None:  # before the nodes start: they inherit the hook
            stack.enter_context(node_profiling(nodes_out))
        _measure(base, scans, profile, cases, consistencies, nodes_out)


def _measure(
    base: Path,
    scans: int,
    profile: bool,
    cases: Sequence[str],
    consistencies: Sequence[str],
    nodes_out: Path | None,
) -> None:
    from shardex.client import connect_local
    from shardex.demo.datagen import users

    docs = int((base / "docs.txt").read_text())
    queries = build_queries(KeyStats.of(users(docs, SEED)))
    with running(base / "cluster", new=False), connect_local(base / "cluster") as client:
        pids = node_pids(base / "cluster")
        prof = cProfile.Profile() if profile else None
        for case in cases:
            qs = queries[case]
            lat: dict[str, list[float]] = {c: [] for c in consistencies}
            cpu: dict[str, list[float]] = {c: [0.0, 0.0] for c in consistencies}
            load = load1()
            for consistency in consistencies:
                for q in qs[:10]:  # warm
                    list(client.scan(KEYSPACE, q.index, q.spans, consistency=consistency))
            # The consistencies take turns in rounds of ROUND scans, so a load spike from
            # other work on the machine lands on both alike: their ratio is what to read.
            if nodes_out is not None:
                start_profiles(pids)
            k = 0
            while k < scans:
                n = min(ROUND, scans - k)
                for consistency in consistencies:
                    if prof is not None:
                        prof.enable()
                    before = cpu_seconds(pids)
                    for i in range(k, k + n):
                        q = qs[i % len(qs)]
                        t = time.perf_counter()
                        rows = list(
                            client.scan(
                                KEYSPACE, q.index, q.spans, consistency=consistency, limit=q.limit
                            )
                        )
                        lat[consistency].append(time.perf_counter() - t)
                        if len(rows) != q.expected_rows:
                            raise RuntimeError(f"{case}: {len(rows)} rows, not {q.expected_rows}")
                    after = cpu_seconds(pids)
                    if prof is not None:
                        prof.disable()
                    for j in range(2):
                        cpu[consistency][j] += after[j] - before[j]
                k += n
            if nodes_out is not None:
                files = stop_profiles(pids, nodes_out)
                for f in files:  # one set of files per case
                    f.rename(f.with_name(f"{_slug(case)}-{f.name}"))
            p50 = {}
            for consistency in consistencies:
                ls = sorted(lat[consistency])
                p50[consistency] = percentile(ls, 50)
                nodes_cpu, client_cpu = (c / len(ls) for c in cpu[consistency])
                print(
                    f"{case:22} {consistency:13} p50 {p50[consistency] * 1e3:6.2f} ms  "
                    f"p90 {percentile(ls, 90) * 1e3:6.2f} ms  "
                    f"cpu/scan nodes {nodes_cpu * 1e3:5.2f} client {client_cpu * 1e3:5.2f} ms  "
                    f"load {load}",
                    flush=True,
                )
            if set(CONSISTENCIES) <= set(p50):
                ratio = p50["request_plus"] / p50["not_bounded"]
                print(f"{case:22} request_plus / not_bounded p50 {ratio:.2f}", flush=True)
        if prof is not None:
            pstats.Stats(prof).sort_stats("cumulative").print_stats(40)


def _slug(case: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in case).strip("_")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diagnostics.scan_profile")
    ap.add_argument("command", choices=["setup", "run"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--scans", type=int, default=200)
    ap.add_argument("--tls", action="store_true", help="setup: TLS on every connection")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--case", action="append", choices=CASES, help="only these cases")
    ap.add_argument("--consistency", action="append", choices=CONSISTENCIES)
    ap.add_argument(
        "--profile-nodes",
        type=Path,
        metavar="OUT",
        help="cProfile the node processes: OUT/<case>-node-<pid>.prof",
    )
    args = ap.parse_args(argv)
    if args.command == "setup":
        setup(args.dir, args.docs, args.tls)
    else:
        measure(
            args.dir,
            args.scans,
            args.profile,
            args.case or CASES,
            args.consistency or CONSISTENCIES,
            args.profile_nodes,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
