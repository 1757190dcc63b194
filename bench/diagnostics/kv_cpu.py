"""Client CPU per single-document call, calling-thread sockets vs the loop thread:
``python -m bench.diagnostics.kv_cpu [--ops N] [--round R] [--durability D]``.

A 3-node local cluster (``shardex cluster start``, as the benchmarks start it), keyspace
``kvcpu`` of 64 partitions with ``num_replicas=1``. Two clients in this process, one with
``direct_kv=True`` (the default: ``client/direct_kv.py``) and one with ``direct_kv=False``
(every call through the client's event-loop thread), take turns in rounds of ``R`` calls
from one thread (A, B, then B, A, ...), so a load spike from other work hits both alike.
Per side and call kind (``upsert`` at ``--durability``, ``get``): the process's CPU time
(user + system, ``resource.getrusage(RUSAGE_SELF)``: the calling thread and the loop
thread) per call and the p50 latency. Read the direct / loop ratio, not the absolute
figures: the nodes share the cores. Rows go to ``bench/results/kv_cpu.json``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common.local_cluster import shardex_cluster
from bench.common.runner import Row, load1, percentile, report

KEYSPACE = "kvcpu"
DOC = {"name": "a document", "tags": ["x", "y", "z"], "n": 12345, "text": "t" * 400}


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _round(call: Callable[[int], Any], start: int, n: int) -> tuple[float, list[float]]:
    """CPU seconds and the latencies of ``n`` calls ``call(start)`` .. ``call(start+n-1)``."""
    lat: list[float] = []
    cpu0 = _cpu()
    for i in range(start, start + n):
        t0 = time.perf_counter()
        call(i)
        lat.append(time.perf_counter() - t0)
    return _cpu() - cpu0, lat


def measure(cluster_dir: Path, ops: int, per_round: int, durability: str) -> list[Row]:
    from shardex.client import connect_local

    rows: list[Row] = []
    with (
        connect_local(cluster_dir, name="kvcpu-direct") as direct,
        connect_local(cluster_dir, name="kvcpu-loop", direct_kv=False) as loop,
    ):
        direct.create_keyspace(KEYSPACE, num_partitions=64, num_replicas=1)
        sides = {"direct": direct.keyspace(KEYSPACE), "loop": loop.keyspace(KEYSPACE)}
        for side, ks in sides.items():  # topology cached, sockets open, documents there
            for i in range(64):
                ks.upsert(f"{side}-{i}", DOC, durability=durability)
        for kind in ("upsert", "get"):
            cpu = {s: 0.0 for s in sides}
            lats: dict[str, list[float]] = {s: [] for s in sides}
            order = list(sides)
            done = 0
            while done < ops:
                n = min(per_round, ops - done)
                for side in order:
                    ks = sides[side]
                    if kind == "upsert":

                        def call(i: int, ks: Any = ks, side: str = side) -> Any:
                            return ks.upsert(f"{side}-{i}", DOC, durability=durability)
                    else:

                        def call(i: int, ks: Any = ks, side: str = side) -> Any:
                            return ks.get(f"{side}-{i % 64}")

                    c, lat = _round(call, done, n)
                    cpu[side] += c
                    lats[side] += lat
                order.reverse()
                done += n
            for side in sides:
                lats[side].sort()
                rows.append(
                    {
                        "call": kind if kind == "get" else f"upsert {durability}",
                        "path": side,
                        "ops": ops,
                        "client CPU us/op": round(cpu[side] / ops * 1e6, 1),
                        "p50 ms": round(percentile(lats[side], 50) * 1e3, 3),
                    }
                )
            d, lp = rows[-2], rows[-1]
            rows.append(
                {
                    "call": d["call"],
                    "path": "direct / loop",
                    "ops": ops,
                    "client CPU us/op": round(d["client CPU us/op"] / lp["client CPU us/op"], 2),
                    "p50 ms": round(d["p50 ms"] / lp["p50 ms"], 2),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diagnostics.kv_cpu", description=__doc__)
    ap.add_argument("--ops", type=int, default=3000, help="calls per side and kind")
    ap.add_argument("--round", type=int, default=250, help="calls per turn")
    ap.add_argument("--durability", default="majority")
    args = ap.parse_args(argv)
    start = time.monotonic()
    load_before = load1()
    with tempfile.TemporaryDirectory(prefix="kvcpu-") as tmp, shardex_cluster(Path(tmp), 3) as cd:
        rows = measure(cd, args.ops, args.round, args.durability)
    report(
        "kv_cpu",
        rows,
        elapsed=time.monotonic() - start,
        extra={"load_before": load_before, "round": args.round},
        title="client CPU per single-document call: calling thread vs loop thread",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
