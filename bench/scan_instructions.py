"""Node instructions per scan: ``python -m bench.scan_instructions DIR [--scans N]``.

CPU seconds per scan (``bench.scan_ab``) move with the machine's load; retired instructions
hardly do. This starts the cluster of ``bench.scan_profile setup DIR`` (no pipeline), runs
``--scans`` scans of every case at not_bounded and request_plus from one in-process client,
and prints, per case, the user and kernel instructions of the three node processes (all
their threads) per scan, read by ``perf stat -e instructions:u,instructions:k -p PID``
around the scans (warm-up excluded). Compare two code versions by running it twice, the
nodes picking the code up from ``PYTHONPATH`` (``PYTHONPATH=/tmp/before/src python -m
bench.scan_instructions DIR``); the cluster is stopped before each run returns. Needs
``perf`` (hardware counters).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.pipeline_common import KEYSPACE, SEED
from bench.scan_profile import CONSISTENCIES, node_pids, running
from bench.scan_queries import CASES, KeyStats, build_queries

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


def measure(base: Path, scans: int, cases: Sequence[str], consistencies: Sequence[str]) -> None:
    from shardex.client import connect_local
    from shardex.demo.datagen import users

    docs = int((base / "docs.txt").read_text())
    queries = build_queries(KeyStats.of(users(docs, SEED)))
    with running(base / "cluster", new=False), connect_local(base / "cluster") as client:
        pids = node_pids(base / "cluster")
        for case in cases:
            qs = queries[case]
            for consistency in consistencies:
                for q in qs[:20]:  # warm: connections, prefer hints, caches
                    list(client.scan(KEYSPACE, q.index, q.spans, consistency=consistency))
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
                for i in range(scans):
                    q = qs[i % len(qs)]
                    rows = list(
                        client.scan(
                            KEYSPACE, q.index, q.spans, consistency=consistency, limit=q.limit
                        )
                    )
                    if len(rows) != q.expected_rows:
                        raise RuntimeError(f"{case}: {len(rows)} rows, not {q.expected_rows}")
                total = dict.fromkeys(EVENTS, 0.0)
                for proc in stats:
                    proc.send_signal(signal.SIGINT)
                    counts = parse_perf_stat(proc.communicate()[1])
                    for e in EVENTS:
                        total[e] += counts.get(e, 0.0)
                user, kernel = (total[e] / scans / 1e3 for e in EVENTS)
                print(
                    f"{case:20} {consistency:13} node instructions/scan "
                    f"user {user:7.0f}K kernel {kernel:6.0f}K",
                    flush=True,
                )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scan_instructions")
    ap.add_argument("dir", type=Path, help="a directory made by `bench.scan_profile setup`")
    ap.add_argument("--scans", type=int, default=500)
    ap.add_argument("--case", action="append", choices=CASES)
    ap.add_argument("--consistency", action="append", choices=CONSISTENCIES)
    args = ap.parse_args(argv)
    measure(args.dir, args.scans, args.case or CASES, args.consistency or CONSISTENCIES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
