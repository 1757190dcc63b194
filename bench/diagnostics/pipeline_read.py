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
* ``read+project``: ``driver_read.read_and_project`` (what the job runs): stream items
  straight into columns, projected, rows kept as tuples.

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


def _definitions() -> list[Any]:
    from shardex.meta.index_definition import IndexDefinition, IndexKey

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
    args = ap.parse_args(argv)

    from shardex.client import connect_local
    from shardex.core.timestamp import Timestamp
    from shardex.pipeline.source.driver_read import read_and_project
    from shardex.pipeline.source.plan import plan_ranges
    from shardex.pipeline.source.read import read_ranges

    defs = _definitions()
    base = Path(tempfile.mkdtemp(prefix="shardex-bench-read-"))
    with shardex_cluster(base, 3) as cdir, connect_local(cdir) as client:
        client.create_keyspace(KEYSPACE, num_partitions=PARTITIONS, num_replicas=0)
        ks = client.keyspace(KEYSPACE)
        ks.upsert_many(updates(args.changes, args.changes, SEED))
        end = client.high_seqnos(KEYSPACE)
        start = Timestamp({})
        n = sum(e.seqno for _, e in end.items())
        ranges = plan_ranges(KEYSPACE, start, end)

        def read_only() -> int:
            return sum(b.num_rows for b in read_ranges(client, KEYSPACE, ranges))

        def column_path() -> int:
            return len(read_and_project(client, KEYSPACE, defs, start, end))

        steps: dict[str, Callable[[], int]] = {
            "read": read_only,
            "read+project": column_path,
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


if __name__ == "__main__":
    sys.exit(main())
