"""What the metrics' per-operation observations add to a KV operation, in process: the
clock reads and the histogram observation each timed operation pays (a single write: one
``WritePath._observe``; a get: the inline observation of ``ReadPath.on_get``; a scan or a
statement: one ``Latencies.observe``), against an empty loop of the same shape. Also the
cost of one scrape of a node's registry (a few keyspaces and indexes' worth of families).

    python -m bench.diagnostics.metrics_cost [--n 1000000]
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace
from typing import Any

from shardex.data.writes import WritePath
from shardex.runtime.latency import Latencies


def _per_op(fn: Any, n: int, rounds: int = 5) -> float:
    """Best of ``rounds`` of ``fn(n)``, in nanoseconds per operation."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t)
    return best / n * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1_000_000)
    n = ap.parse_args().n
    perf = time.perf_counter
    writes = WritePath(
        engine=lambda: None,  # type: ignore[arg-type,return-value]
        committer=lambda: None,
        replication=SimpleNamespace(),  # type: ignore[arg-type]
        gate=SimpleNamespace(),  # type: ignore[arg-type]
    )
    observe_write = writes._observe
    get_lat: Latencies[str] = Latencies()
    failed: dict[str, int] = {}

    def baseline(k: int) -> None:
        for _ in range(k):
            pass

    def write(k: int) -> None:  # _single's clock read, then _settle's observation
        for _ in range(k):
            t0 = perf()
            observe_write("upsert", "persist_active", t0, False)

    def get(k: int) -> None:  # on_get's clock read and observation, no failure
        for _ in range(k):
            t0 = perf()
            get_lat.observe("get", perf() - t0)

    def get_failed(k: int) -> None:
        for _ in range(k):
            t0 = perf()
            get_lat.observe("get", perf() - t0)
            failed["get"] = failed.get("get", 0) + 1

    base = _per_op(baseline, n)
    rows = [
        ("single write (clock + _observe)", _per_op(write, n) - base),
        ("get (clocks + observe)", _per_op(get, n) - base),
        ("failed get (+ error count)", _per_op(get_failed, n) - base),
    ]
    print(f"{'per operation':<36} {'ns':>8}")
    for name, ns in rows:
        print(f"{name:<36} {ns:8.0f}")
    print(f"{'(empty loop per iteration)':<36} {base:8.0f}")


if __name__ == "__main__":
    main()
