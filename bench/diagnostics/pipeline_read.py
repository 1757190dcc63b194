"""The driver's read + project of one micro-batch:
``python -m bench.diagnostics.pipeline_read [--changes N]``.

What ``MaintenanceJob`` does for a batch it reads on the driver (``driver_read.py``), step
by step, on a 3-node local cluster (``shardex cluster start``), a keyspace of 64 partitions
holding ``--changes`` demo users, the two indexes of ``bench.pipeline`` (definitions only:
nothing is built or delivered). Each step runs ``--repeat`` times over the whole range
(0, high seqnos]; per step the median wall time per change (us) and this process's CPU per
change (us), and the data nodes' CPU per change (us, from /proc: what serving the streams
cost them). Steps:

* ``read``: ``read_ranges`` to Arrow batches (streams, frame decode, ``Change`` objects,
  columns);
* ``read+project (arrow)``: the former path, ``read_ranges`` then ``project_arrow`` then
  ``from_arrow`` (the Arrow round trip both ways);
* ``read+project (columns)``: ``driver_read.read_and_project`` (what the job runs now):
  stream items straight into columns, projected, rows kept as tuples.

With ``--ab`` the steps are instead the two ways of reading small ranges, alternated in the
same process: one change stream per partition (``small_range=0``) against one ``ReadRanges``
per owner node (every range through it), read only (``read_ranges`` to Arrow) and read +
project (``read_and_project``), over the last ``--per-partition`` changes of every partition
(several sizes from one loaded keyspace: ``--per-partition 10,100,312``), ``--inner`` reads
per sample so the nodes' 10 ms CPU ticks resolve. ``--one-range N`` adds a read of one
partition's last N changes (N changes written to it first). The nodes' CPU is also given net
of their idle rate (measured for ``--idle`` seconds before the samples, times each sample's
wall time).

The machine is shared: compare the steps of one run (ratios), with the load beside them.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common.dataset import INDEXES, KEYSPACE, SEED, updates
from bench.common.local_cluster import shardex_cluster
from bench.common.runner import Row, load_average, print_table

PARTITIONS = 64
ALL_RANGES = 10**9  # small_range: every range through ReadRanges


def _definitions() -> list[Any]:
    from shardex.index.definition import IndexDefinition, IndexKey

    return [
        IndexDefinition(
            id=f"bench.{i}",
            name=spec["name"],
            keyspace=KEYSPACE,
            keys=[IndexKey(expr=k) for k in spec["keys"]],
            where=spec["where"],
            partition_by=spec["partition_by"],
            num_partition=spec["num_partition"] or 1,
        )
        for i, spec in enumerate(INDEXES)
    ]


def _node_cpu(cdir: Path) -> float:
    """CPU seconds (user + system) of the cluster's node processes so far."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid_file in cdir.glob("node*/node.pid"):
        try:
            fields = Path(f"/proc/{pid_file.read_text().split()[0]}/stat").read_text()
        except OSError:
            continue
        after = fields.rsplit(")", 1)[1].split()
        total += (int(after[11]) + int(after[12])) / tick
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=6000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="cProfile one run of each step")
    ap.add_argument("--ab", action="store_true", help="streams vs ReadRanges, alternated")
    ap.add_argument("--per-partition", default="10,100", help="--ab: sizes, comma-separated")
    ap.add_argument("--inner", type=int, default=0, help="--ab: reads per sample (0: auto)")
    ap.add_argument("--one-range", type=int, default=0, help="--ab: one partition's N changes")
    ap.add_argument("--idle", type=float, default=5.0, help="--ab: seconds to time idle nodes")
    args = ap.parse_args(argv)
    if args.ab:
        return ab_main(args)

    from shardex.client import connect_local
    from shardex.core.timestamp import Timestamp
    from shardex.index.keyversion import from_arrow
    from shardex.pipeline.driver_read import read_and_project
    from shardex.pipeline.projector import project_arrow
    from shardex.pipeline.source_plan import plan_ranges
    from shardex.pipeline.source_read import read_ranges

    defs = _definitions()
    base = Path(tempfile.mkdtemp(prefix="shardex-bench-read-"))
    with shardex_cluster(base, 3) as cdir, connect_local(cdir) as client:
        client.create_keyspace(KEYSPACE, num_partitions=PARTITIONS)
        ks = client.keyspace(KEYSPACE)
        ks.upsert_many(updates(args.changes, args.changes, SEED))
        end = client.high_seqnos(KEYSPACE)
        start = Timestamp({})
        n = sum(e.seqno for _, e in end.items())
        ranges = plan_ranges(KEYSPACE, start, end)

        def read_only() -> int:
            return sum(b.num_rows for b in read_ranges(client, KEYSPACE, ranges))

        def arrow_path() -> int:
            out: list[Any] = []
            for b in read_ranges(client, KEYSPACE, ranges):
                kv, _ = project_arrow(defs, b, error_rows=True)
                out.extend(from_arrow(kv))
            return len(out)

        def column_path() -> int:
            return len(read_and_project(client, KEYSPACE, defs, start, end))

        steps: dict[str, Callable[[], int]] = {
            "read": read_only,
            "read+project (arrow)": arrow_path,
            "read+project (columns)": column_path,
        }
        for fn in steps.values():
            fn()  # warm up: connections, compiled projectors
        samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in steps}
        for _ in range(args.repeat):
            for name, fn in steps.items():  # interleaved: load drifts hit every step alike
                w0, c0, d0 = time.perf_counter(), time.process_time(), _node_cpu(cdir)
                fn()
                w1, c1, d1 = time.perf_counter(), time.process_time(), _node_cpu(cdir)
                samples[name].append((w1 - w0, c1 - c0, d1 - d0))
        rows: list[Row] = []
        for name, got in samples.items():
            rows.append(
                {
                    "step": name,
                    "changes": n,
                    "wall us/change": round(statistics.median(s[0] for s in got) / n * 1e6, 1),
                    "driver CPU us/change": round(
                        statistics.median(s[1] for s in got) / n * 1e6, 1
                    ),
                    "nodes CPU us/change": round(statistics.median(s[2] for s in got) / n * 1e6, 1),
                }
            )
        print_table(f"driver read + project (load {load_average()})", rows)
        if args.profile:
            for name, fn in steps.items():
                prof = cProfile.Profile()
                prof.enable()
                fn()
                prof.disable()
                print(f"--- {name}")
                pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    return 0


def ab_main(args: argparse.Namespace) -> int:
    """Streams against ReadRanges (see the module doc), interleaved sample by sample."""
    from shardex.client import connect_local
    from shardex.core.timestamp import Timestamp
    from shardex.pipeline.driver_read import read_and_project
    from shardex.pipeline.source_plan import plan_ranges
    from shardex.pipeline.source_read import read_ranges

    sizes = [int(x) for x in args.per_partition.split(",") if x]
    defs = _definitions()
    base = Path(tempfile.mkdtemp(prefix="shardex-bench-read-ab-"))
    with shardex_cluster(base, 3) as cdir, connect_local(cdir) as client:
        client.create_keyspace(KEYSPACE, num_partitions=PARTITIONS)
        ks = client.keyspace(KEYSPACE)
        total = max(args.changes, max(sizes) * PARTITIONS * 2)
        ks.upsert_many(updates(total, total, SEED))
        cases: list[tuple[str, Timestamp, Timestamp]] = []
        end = client.high_seqnos(KEYSPACE)
        for k in sizes:
            start = Timestamp(
                {p: (max(0, e.seqno - k), e.uuid) for p, e in end.items() if e.seqno > k}
            )
            cases.append((f"{k}/partition", start, end))
        if args.one_range:
            from shardex.data.partitioning import partition_of

            mine = [
                (d, b)
                for d, b in updates(total, total, SEED + 1)
                if partition_of(d, PARTITIONS) == 0
            ]
            ks.upsert_many((mine * (args.one_range // len(mine) + 1))[: args.one_range])
            e1 = client.high_seqnos(KEYSPACE)
            one = e1[0]
            cases.append(
                (
                    f"one range of {args.one_range}",
                    Timestamp({0: (one.seqno - args.one_range, one.uuid)}),
                    Timestamp({0: (one.seqno, one.uuid)}),
                )
            )
        # The nodes' own background (heartbeats, reconcile, WAL sync) over the same windows,
        # taken out of their CPU per change: at 10 changes per partition a ReadRanges read
        # costs the nodes less than their idle second does.
        c0, t0 = _node_cpu(cdir), time.perf_counter()
        time.sleep(args.idle)
        idle = (_node_cpu(cdir) - c0) / (time.perf_counter() - t0)
        rows: list[Row] = []
        for label, start, stop in cases:
            ranges = plan_ranges(KEYSPACE, start, stop)
            n = sum(r.count for r in ranges)

            def read(small: int, ranges: Any = ranges) -> int:
                return sum(
                    b.num_rows for b in read_ranges(client, KEYSPACE, ranges, small_range=small)
                )

            def project(small: int, start: Timestamp = start, stop: Timestamp = stop) -> int:
                return len(read_and_project(client, KEYSPACE, defs, start, stop, small_range=small))

            steps: dict[str, Callable[[], int]] = {
                "read, streams": lambda f=read: f(0),
                "read, ReadRanges": lambda f=read: f(ALL_RANGES),
                "read+project, streams": lambda f=project: f(0),
                "read+project, ReadRanges": lambda f=project: f(ALL_RANGES),
            }
            inner = args.inner or max(1, 20_000 // max(n, 1))
            for fn in steps.values():
                fn()  # warm up
            samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in steps}
            for _ in range(args.repeat):
                for name, fn in steps.items():
                    w0, c0, d0 = time.perf_counter(), time.process_time(), _node_cpu(cdir)
                    for _ in range(inner):
                        fn()
                    w1, c1, d1 = time.perf_counter(), time.process_time(), _node_cpu(cdir)
                    samples[name].append((w1 - w0, c1 - c0, d1 - d0))
            per = n * inner
            for name, got in samples.items():
                rows.append(
                    {
                        "case": label,
                        "step": name,
                        "changes": n,
                        "wall us/change": round(
                            statistics.median(s[0] for s in got) / per * 1e6, 2
                        ),
                        "driver CPU us/change": round(
                            statistics.median(s[1] for s in got) / per * 1e6, 2
                        ),
                        "nodes CPU us/change": round(
                            statistics.median(s[2] for s in got) / per * 1e6, 2
                        ),
                        "net of idle": round(
                            statistics.median(s[2] - idle * s[0] for s in got) / per * 1e6, 2
                        ),
                    }
                )
        title = f"streams vs ReadRanges (load {load_average()}; nodes idle {idle:.3f} cores)"
        print_table(title, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
