"""Node instructions per scan: ``python -m bench.diagnostics.scan_instructions DIR [--scans N]``.

CPU seconds per scan (``bench.diagnostics.scan_profile``) move with the machine's load; retired
instructions hardly do. This starts the cluster of ``bench.diagnostics.scan_profile setup DIR``
(no pipeline), runs ``--scans`` scans of every case at not_bounded and request_plus from one
in-process client, and prints, per case, the user and kernel instructions of the three node
processes (all their threads) per scan, read by ``perf stat -e instructions:u,instructions:k -p
PID`` around the scans (warm-up excluded). Compare two code versions by running it twice, the
nodes picking the code up from ``PYTHONPATH`` (``PYTHONPATH=/tmp/before/src python -m
bench.diagnostics.scan_instructions DIR``); the cluster is stopped before each run returns.
Needs ``perf`` (hardware counters). ``--per-node`` adds each node's user instructions per scan
(sorted by node pid: which node pays, e.g. the coordinator against the data nodes a
request_plus scan asks); ``--threads N`` runs N clients at once (threads of this process,
``--scans`` each), where concurrent request_plus scans share high-seqno rounds.
"""

from __future__ import annotations

import argparse
import itertools
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common.dataset import KEYSPACE, SEED
from bench.diagnostics.scan_profile import CONSISTENCIES, node_pids, running
from bench.scan.queries import CASES, KeyStats, build_queries

EVENTS = ("instructions:u", "instructions:k")


def parse_perf_stat(text: str) -> dict[str, float]:
    """``perf stat -x,`` output (stderr) -> {event: count}; "<not counted>" and
    "<not supported>" rows count 0, other lines are ignored."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) < 3 or not fields[2]:
            continue
        value = fields[0].strip()
        out[fields[2]] = out.get(fields[2], 0.0) + (float(value) if value[:1].isdigit() else 0.0)
    return out


def measure(
    base: Path,
    scans: int,
    cases: Sequence[str],
    consistencies: Sequence[str],
    *,
    per_node: bool = False,
    threads: int = 1,
) -> None:
    from shardex.client import connect_local
    from shardex.demo.datagen import users

    docs = int((base / "docs.txt").read_text())
    queries = build_queries(KeyStats.of(users(docs, SEED)))
    with running(base / "cluster", new=False), ThreadPoolExecutor(threads) as pool:
        clients = [connect_local(base / "cluster") for _ in range(threads)]
        try:
            pids = sorted(node_pids(base / "cluster"))
            for case in cases:
                qs = queries[case]
                for consistency in consistencies:
                    run = _runner(clients, qs, consistency)
                    # Warm: connections, prefer hints, caches.
                    list(pool.map(run, range(threads), itertools.repeat(20, threads)))
                    stats = [
                        subprocess.Popen(
                            ["perf", "stat", "-x,", "-e", ",".join(EVENTS), "-p", str(pid)],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE,
                            text=True,
                        )
                        for pid in pids
                    ]
                    time.sleep(0.3)  # perf attached
                    list(pool.map(run, range(threads), itertools.repeat(scans, threads)))
                    total = dict.fromkeys(EVENTS, 0.0)
                    nodes = []
                    for proc in stats:
                        proc.send_signal(signal.SIGINT)
                        counts = parse_perf_stat(proc.communicate()[1])
                        for e in EVENTS:
                            total[e] += counts.get(e, 0.0)
                        nodes.append(counts.get(EVENTS[0], 0.0))
                    n = scans * threads
                    user, kernel = (total[e] / n / 1e3 for e in EVENTS)
                    line = (
                        f"{case:20} {consistency:13} node instructions/scan "
                        f"user {user:7.0f}K kernel {kernel:6.0f}K"
                    )
                    if per_node:
                        line += "  per node user " + " / ".join(
                            f"{c / n / 1e3:.0f}K" for c in nodes
                        )
                    print(line, flush=True)
        finally:
            for client in clients:
                client.close()


def _runner(clients: Sequence[Any], qs: Sequence[Any], consistency: str) -> Any:
    """``run(j, n)``: ``n`` scans of ``qs`` on client ``j`` (each client starts elsewhere in
    ``qs``), their row counts checked."""

    def run(j: int, n: int) -> None:
        for q in itertools.islice(itertools.cycle(qs), j * 7, j * 7 + n):
            rows = list(
                clients[j].scan(KEYSPACE, q.index, q.spans, consistency=consistency, limit=q.limit)
            )
            if len(rows) != q.expected_rows:
                raise RuntimeError(f"{q.case}: {len(rows)} rows, not {q.expected_rows}")

    return run


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diagnostics.scan_instructions")
    ap.add_argument(
        "dir", type=Path, help="a directory made by `bench.diagnostics.scan_profile setup`"
    )
    ap.add_argument("--scans", type=int, default=500)
    ap.add_argument("--case", action="append", choices=CASES)
    ap.add_argument("--consistency", action="append", choices=CONSISTENCIES)
    ap.add_argument("--per-node", action="store_true", help="each node's user instructions too")
    ap.add_argument("--threads", type=int, default=1, help="concurrent clients (threads)")
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error("--threads must be at least 1")
    measure(
        args.dir,
        args.scans,
        args.case or CASES,
        args.consistency or CONSISTENCIES,
        per_node=args.per_node,
        threads=args.threads,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
