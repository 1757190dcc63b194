"""Where a small SQL query's time goes: ``python -m bench.diagnostics.sql_profile setup|run DIR``.

A development tool beside ``bench.sql`` (which needs PostgreSQL and a Spark build per run):

* ``setup DIR``: a 3-node cluster in ``DIR/cluster``, the bench's documents (``--docs``,
  default 20,000), ``bench.sql``'s indexes (``SHARDEX_DDL``) built once by the Spark
  pipeline, then the cluster is stopped; the directory is kept for ``run``.
* ``run DIR``: start the cluster (no pipeline), run ``--queries`` queries of each case of
  ``bench.sql``'s mix (``--case`` narrows it) at request_plus from one in-process client, and
  print per case: p50/p90, the CPU time per query of the three node processes and of the
  client (less sensitive to a loaded machine than wall time). ``--profile-nodes OUT`` adds a
  cProfile of every node per case (``bench/diagnostics/node_profile.py``; read them
  with ``pstats``). ``--clients N``: N clients (one thread each, one connection each) run
  ``--queries`` queries each at once, and queries/s is printed too (the client CPU is then
  this process's, all of them).

The cluster is always stopped before the command returns.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common.dataset import SEED
from bench.common.runner import percentile
from bench.diagnostics.node_profile import node_profiling, start_profiles, stop_profiles
from bench.diagnostics.scan_profile import cpu_seconds, node_pids, running, setup_cluster
from bench.sql.queries import CASES, SX_SQL, DocStats, build_queries


def setup(base: Path, docs: int) -> None:
    from bench.sql.phases import create_and_build

    setup_cluster(
        base, docs, "shardex-sql-profile", lambda c, d: create_and_build(c, d, timeout=3600)
    )


def measure(
    base: Path, n: int, cases: Sequence[str], nodes_out: Path | None, clients: int = 1
) -> None:
    with contextlib.ExitStack() as stack:
        if nodes_out is not None:  # before the nodes start: they inherit the hook
            stack.enter_context(node_profiling(nodes_out))
        _measure(base, n, cases, nodes_out, clients)


def _measure(
    base: Path, n: int, cases: Sequence[str], nodes_out: Path | None, n_clients: int
) -> None:
    from shardex.client import connect_local
    from shardex.demo.datagen import users

    docs = int((base / "docs.txt").read_text())
    queries = build_queries(DocStats.of(users(docs, SEED)))
    with running(base / "cluster", new=False), contextlib.ExitStack() as stack:
        clients = [stack.enter_context(connect_local(base / "cluster")) for _ in range(n_clients)]
        pids = node_pids(base / "cluster")
        for case in cases:
            qs = queries[case]

            def run(i: int, count: int, qs: Sequence[Any] = qs, case: str = case) -> list[float]:
                """``count`` queries on client ``i`` (each client starts elsewhere in the
                list): their latencies."""
                lat = []
                for k in range(count):
                    q = qs[(i * 7 + k) % len(qs)]
                    t = time.perf_counter()
                    rows = list(clients[i].query(SX_SQL[case], list(q.params)))
                    lat.append(time.perf_counter() - t)
                    if len(rows) != q.expected_rows:
                        raise RuntimeError(f"{case}: {len(rows)} rows, not {q.expected_rows}")
                return lat

            with ThreadPoolExecutor(n_clients) as pool:
                # Warm: connections, statement caches (a lone client on this thread).
                if n_clients == 1:
                    run(0, 10)
                else:
                    list(pool.map(run, range(n_clients), [10] * n_clients))
                if nodes_out is not None:
                    start_profiles(pids)
                before = cpu_seconds(pids)
                t0 = time.perf_counter()
                if n_clients == 1:  # on this thread, as a lone client runs
                    lat = sorted(run(0, n))
                else:
                    lat = sorted(itertools.chain(*pool.map(run, range(n_clients), [n] * n_clients)))
                elapsed = time.perf_counter() - t0
                after = cpu_seconds(pids)
            if nodes_out is not None:
                for f in stop_profiles(pids, nodes_out):
                    f.rename(f.with_name(f"{case.replace(' ', '_')}-{f.name}"))
            nodes_cpu, client_cpu = ((a - b) / len(lat) for a, b in zip(after, before, strict=True))
            rate = f"  clients {n_clients} q/s {len(lat) / elapsed:7.0f}" if n_clients > 1 else ""
            print(
                f"{case:20} p50 {percentile(lat, 50) * 1e3:7.2f} ms  "
                f"p90 {percentile(lat, 90) * 1e3:7.2f} ms  cpu/query nodes "
                f"{nodes_cpu * 1e3:6.2f} client {client_cpu * 1e3:5.2f} ms{rate}",
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.diagnostics.sql_profile", description=__doc__
    )
    ap.add_argument("command", choices=("setup", "run"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--case", action="append", choices=CASES, help="default: every case")
    ap.add_argument("--profile-nodes", type=Path, help="write node cProfiles here")
    ap.add_argument("--clients", type=int, default=1, help="clients at once (default 1)")
    args = ap.parse_args(argv)
    if args.command == "setup":
        setup(args.dir, args.docs)
    else:
        measure(args.dir, args.queries, args.case or CASES, args.profile_nodes, args.clients)
    return 0


if __name__ == "__main__":
    sys.exit(main())
