"""What delivering ahead takes off a batch's round: ``python -m bench.pipeline_early``.

On a 3-node local cluster (``shardex cluster start``, no pipeline), a keyspace of 64
partitions and the two indexes of ``bench.pipeline`` (created with ``defer_build``: their
slices exist, empty, and take deliveries and stabilises), each round writes ``--changes``
demo-user updates, reads and projects them on this process (``driver_read``), routes them
by the indexes' topologies and runs the batch's round, alternating two ways:

* ``all in the round``: one ``DeliverAndStabilize`` per indexer with every row (what a batch
  does without early delivery, or on a fallback);
* ``delivered ahead``: the rows first as ``DeliverKeyVersions`` (``indexers.deliver_rows``,
  timed apart: off the critical path when it happens between rounds), then the round with
  no rows, naming the incarnations that took them. ``--gap`` seconds pass between the two
  (default 0.2: in the pipeline Spark's trigger, planning and the batch's own read sit
  between a batch's early delivery and its round, and the indexer decides the early rows
  after its reply, ``index/slice_decisions.py``; with no gap the round waits for those decisions).

Per way, medians over ``--repeat`` rounds of the round's wall time, this process's CPU and
the nodes' CPU (from /proc), per change; the early delivery's own wall time; and the
timekeeper's check + publish that ends a batch's round (``advance_stability`` with the
round's replies, ms per round). The
machine is shared: the two ways alternate, so compare them within the run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.local_cluster import shardex_cluster
from bench.pipeline_build import create_indexes
from bench.pipeline_common import KEYSPACE, SEED, updates
from bench.pipeline_read import PARTITIONS, _node_cpu
from bench.runner import Row, load_average, print_table

DOCS = 20_000


def _plan(client: Any) -> tuple[Any, dict[str, Any], dict[str, list[str]]]:
    """The keyspace's index definitions, routes and node -> index ids, from the state."""
    from shardex.meta.index_state import latest_index_topology
    from shardex.pipeline.indexers import index_state
    from shardex.pipeline.router import IndexRoute

    state = index_state(client)
    defs, routes, plan = [], {}, {}
    for rec in state.indexes.values():
        if rec.keyspace != KEYSPACE:
            continue
        topo = latest_index_topology(state.index_topologies, rec.id)
        defs.append(rec.definition)
        routes[rec.id] = IndexRoute.of(rec.definition, topo)
        for node in topo.assignment.values():
            plan.setdefault(node, set()).add(rec.id)
    return defs, routes, {n: sorted(ids) for n, ids in plan.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=4000, help="changes per round")
    ap.add_argument("--repeat", type=int, default=8, help="rounds per way")
    ap.add_argument(
        "--gap", type=float, default=0.2, help="seconds between early delivery and round"
    )
    args = ap.parse_args(argv)

    from shardex.client import connect_local
    from shardex.pipeline.driver_read import read_and_project
    from shardex.pipeline.indexers import advance_stability, deliver_and_stabilize, deliver_rows
    from shardex.pipeline.router import route

    base = Path(tempfile.mkdtemp(prefix="shardex-bench-early-"))
    with shardex_cluster(base, 3) as cdir, connect_local(cdir) as client:
        client.create_keyspace(KEYSPACE, num_partitions=PARTITIONS)
        ks = client.keyspace(KEYSPACE)
        ks.upsert_many(updates(DOCS, DOCS, SEED))
        create_indexes(client)
        defs, routes, plan = _plan(client)
        start = client.high_seqnos(KEYSPACE)
        batch = 0

        def next_batch() -> tuple[Any, dict[str, list[Any]], int]:
            nonlocal start, batch
            batch += 1
            ks.upsert_many(updates(args.changes, DOCS, SEED + batch))
            end = client.high_seqnos(KEYSPACE)
            rows = read_and_project(client, KEYSPACE, defs, start, end)
            n = sum(e.seqno - start.seqno(p) for p, e in end.items())
            start = end
            return end, route(rows, routes).by_node, n

        # The slices start at the keyspace's load: stabilise there first (nothing queued).
        deliver_and_stabilize(client, KEYSPACE, 0, start, {}, plan)
        incarnations: dict[str, str] = {}
        changes: list[int] = []
        samples: dict[str, list[tuple[float, float, float, float, float]]] = {
            "all in the round": [],
            "delivered ahead": [],
        }
        for i in range(2 * args.repeat + 2):
            way = "all in the round" if i % 2 == 0 else "delivered ahead"
            end, by_node, n = next_batch()
            early = 0.0
            if way == "delivered ahead":
                t = time.perf_counter()
                report = deliver_rows(client, KEYSPACE, batch, by_node, incarnations)
                early = time.perf_counter() - t
                incarnations = dict(report.incarnations)
                by_node = {}
                time.sleep(args.gap)  # the pipeline's batch between the two (docstring)
            w0, c0, d0 = time.perf_counter(), time.process_time(), _node_cpu(cdir)
            report, replies = deliver_and_stabilize(
                client, KEYSPACE, batch, end, by_node, plan, early=incarnations
            )
            w1, c1, d1 = time.perf_counter(), time.process_time(), _node_cpu(cdir)
            index_ids = sorted({i for ids in plan.values() for i in ids})
            advance_stability(client, KEYSPACE, end, index_ids, batch_id=batch, stabilized=replies)
            publish = time.perf_counter() - w1
            incarnations = dict(report.incarnations)
            if i >= 2:  # the first of each way warms connections and caches
                changes.append(n)
                samples[way].append(
                    ((w1 - w0) / n, (c1 - c0) / n, (d1 - d0) / n, early / n, publish)
                )
        rows: list[Row] = []
        n_avg = statistics.median(changes)
        for way, got in samples.items():
            rows.append(
                {
                    "way": way,
                    "changes/round": args.changes,
                    "rounds": len(got),
                    "round wall us/change": round(statistics.median(s[0] for s in got) * 1e6, 1),
                    "round wall ms": round(statistics.median(s[0] for s in got) * n_avg * 1e3, 1),
                    "driver CPU us/change": round(statistics.median(s[1] for s in got) * 1e6, 1),
                    "nodes CPU us/change": round(statistics.median(s[2] for s in got) * 1e6, 1),
                    "early wall us/change": round(statistics.median(s[3] for s in got) * 1e6, 1),
                    "check+publish ms": round(statistics.median(s[4] for s in got) * 1e3, 1),
                }
            )
        print_table(
            f"a batch's round, with and without early delivery (load {load_average()})", rows
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
