"""The stream source's per-batch calls without Spark: ``python -m bench.source_offsets
[--rate N] [--rounds N]``.

A 3-node cluster (``shardex cluster start``), a keyspace of 64 partitions, and in this
process, alternating call by call (the order reversed every round, so neither side always
runs first on a warm cache): the high seqnos gathered by one data node
(``Client.high_seqnos``) against asked of each owner (``source.seqnos.OwnerSeqnos``, the
stream readers' default), and the partitioned reader's ``partitions`` work (ranges, tasks
grouped by owner, each task pickled as Spark's runner pickles it) with the owner map read
from the client per call (the former path: a hand-off to the client's loop thread) against
kept (``_OffsetSource.owners``). ``--rate`` writes that many updates/s per writer thread
(two threads, in batches of 50) so the nodes are busy; process CPU per call is only given
without writers (they run in this process). Wall ms p50/p90 per call. The machine may be
shared: the two sides alternate, so compare within one run.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.local_cluster import shardex_cluster

KEYSPACE = "offsets"
PARTITIONS = 64


def _writer(cluster: Path, rate: float, stop: threading.Event, tag: str) -> None:
    from shardex.client import connect_local

    with connect_local(cluster) as c:
        ks = c.keyspace(KEYSPACE)
        i = 0
        while not stop.is_set():
            t = time.perf_counter()
            ks.upsert_many([(f"{tag}-{i}-{j}", {"j": j}) for j in range(50)])
            i += 1
            time.sleep(max(0.0, 50 / rate - (time.perf_counter() - t)))


def measure(cluster: Path, rate: float, rounds: int) -> dict[str, dict[str, float]]:
    from shardex.client import connect_local
    from shardex.pipeline.source.options import SourceOptions, task_partitions
    from shardex.pipeline.source.plan import plan_ranges
    from shardex.pipeline.source.read import partition_owners
    from shardex.pipeline.source.seqnos import OwnerSeqnos
    from shardex.pipeline.source.stream import _OffsetSource

    with connect_local(cluster) as c:
        c.create_keyspace(KEYSPACE, num_partitions=PARTITIONS)
        c.keyspace(KEYSPACE).upsert_many([(f"d{i}", {"i": i}) for i in range(2000)])
        opts = SourceOptions.parse({"cluster_dir": str(cluster), "keyspace": KEYSPACE})
        offsets = _OffsetSource(opts)
        offsets._client = c
        owners = OwnerSeqnos(c, KEYSPACE)
        start = c.high_seqnos(KEYSPACE)

        def plan(owner_map: Callable[[], dict[int, str]]) -> None:
            ranges = plan_ranges(KEYSPACE, start, end)
            for task in task_partitions(opts, ranges, owner_map()):
                pickle.dumps(task)

        end = c.high_seqnos(KEYSPACE)
        calls: dict[str, Callable[[], object]] = {
            "high seqnos, gathered": lambda: c.high_seqnos(KEYSPACE),
            "high seqnos, owners": owners,
            "partitions, map per call": lambda: plan(lambda: partition_owners(c, KEYSPACE)),
            "partitions, map kept": lambda: plan(offsets.owners),
        }
        stop = threading.Event()
        writers = [
            threading.Thread(target=_writer, args=(cluster, rate, stop, f"w{n}"), daemon=True)
            for n in range(2 if rate > 0 else 0)
        ]
        for w in writers:
            w.start()
        wall: dict[str, list[float]] = {k: [] for k in calls}
        cpu = dict.fromkeys(calls, 0.0)
        try:
            for f in calls.values():
                f()  # connections and caches warm
            for n in range(rounds):
                order = list(calls.items())
                for name, f in order if n % 2 == 0 else order[::-1]:
                    c0, t0 = time.process_time(), time.perf_counter()
                    f()
                    wall[name].append(time.perf_counter() - t0)
                    cpu[name] += time.process_time() - c0
        finally:
            stop.set()
            for w in writers:
                w.join()
        if owners.fallbacks:
            print(f"note: {owners.fallbacks} owner asks fell back to the gathered RPC")
    out: dict[str, dict[str, float]] = {}
    for name, v in wall.items():
        v.sort()
        row = {
            "wall p50 ms": round(statistics.median(v) * 1e3, 3),
            "wall p90 ms": round(v[int(len(v) * 0.9)] * 1e3, 3),
        }
        if rate <= 0:
            row["cpu ms/call"] = round(cpu[name] / rounds * 1e3, 3)
        out[name] = row
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.source_offsets", description=__doc__)
    ap.add_argument("--rate", type=float, default=0.0, help="updates/s per writer thread (0)")
    ap.add_argument("--rounds", type=int, default=300, help="calls of each kind (300)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    base = Path(os.environ.get("TMPDIR", "/tmp"))
    with shardex_cluster(base, 3) as cluster:
        rows = measure(cluster, args.rate, args.rounds)
        load = os.getloadavg()[0]
    writers = f"2 x {args.rate:g}/s" if args.rate else "none"
    print(f"{args.rounds} rounds, writers {writers}, load {load:.1f}")
    for name, row in rows.items():
        print(f"  {name:26} " + "  ".join(f"{k} {v:8.3f}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
