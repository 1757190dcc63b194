"""SQL within a memory budget: ``python -m bench.sql_memory [--quick] [--docs N] [--json PATH]``.

A 3-node local cluster, the benchmark users (``bench/common/dataset.py``, ~0.7 KB each) loaded
and a primary index built by the Spark pipeline (stopped before measuring). Then, each with a
``memory_quota`` of 256 MiB (the node default):

* ``ORDER BY`` an unindexed field, whole documents: the leaf (the primary index is one
  partition: one node) sorts every document (more than the budget at 1M documents: it
  spills) and the initiator merges;
* ``GROUP BY META().id`` (one group per document) with COUNT and ARRAY_AGG: the initiator's
  FINAL aggregate holds every group (spills), the leaves' PARTIAL ones hand groups on;
* the ORDER BY again with a 64 MiB quota;
* the same GROUP BY with ``spill=False``: must fail with QUERY_MEMORY_LIMIT (the budget binds;
  with fewer documents than 1M, at a quota scaled down alike).

Every node's RSS (``/proc/PID/status`` VmRSS) is sampled every ``SAMPLE_S`` during each query.
Before each query the nodes are restarted (CPython keeps memory a query freed, so a query after
another would start from its predecessor's peak) and a warm-up query reads every document
(the storage caches fill); the baseline is each node's RSS then. Allowed: baseline +
budget + ``OVERHEAD``, per node. Why ``OVERHEAD`` (128 MiB): the budget counts the operators'
data, not what flows past them: the exchanges' credit windows (1 MiB per stream), the bridge
queue and Arrow batches, a leaf's document fetches (blocks of 500 documents), the storage
engine's caches warming on a full scan, CPython's allocator keeping freed blocks for reuse,
and ``value_size``'s under-counts (non-ASCII text, allocator rounding). The rows are checked
(count, order, one document per group), not stored. A test would take tens of minutes
(load, a Spark build, 1M-row queries on a shared machine): this is a benchmark, run by hand.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.dataset import KEYSPACE, SEED
from bench.common.harness import (
    bench_dir,
    bench_main,
    loaded_cluster,
    parse_plan_args,
    spark_driver,
)
from bench.common.local_cluster import node_pids
from bench.common.runner import log, machine_info

NAME = "sql_memory"
MiB = 1 << 20
BUDGET = 256 * MiB
OVERHEAD = 128 * MiB
SAMPLE_S = 0.1


@dataclass
class Plan:
    docs: int = 1_000_000
    seconds: float = 0.0  # unused: each query runs once (parse_plan_args' common flag)
    partitions: int = 64
    load_files: int = 3
    seed: int = SEED


QUICK = {"docs": 50_000, "seconds": 0.0}

PRIMARY = f'CREATE PRIMARY INDEX ON {KEYSPACE} WITH {{"defer_build": true}}'
ORDER = f"SELECT META(u).id AS _id, u.* FROM {KEYSPACE} u ORDER BY u.age, META(u).id"
GROUP = (
    f"SELECT META(u).id AS id, COUNT(*) AS n, ARRAY_AGG(u.age) AS ages FROM {KEYSPACE} u "
    "GROUP BY META(u).id"
)


def rss(pid: int) -> int:
    """A process's resident set, bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class RssSampler:
    """Every node's peak RSS while the block runs, sampled every ``SAMPLE_S``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak = {n: rss(p) for n, p in pids.items()}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            for n, p in self.pids.items():
                self.peak[n] = max(self.peak[n], rss(p))
            self.samples += 1

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _check_order(rows: Any) -> int:
    n = 0
    last: tuple[Any, str] | None = None
    for r in rows:
        key = (r["age"], r["_id"])  # ints, and ids as strings: Python orders them alike
        if last is not None and key < last:
            raise RuntimeError(f"ORDER BY out of order at row {n}: {key} after {last}")
        last = key
        n += 1
    return n


def _check_groups(rows: Any) -> int:
    n = 0
    for r in rows:
        if r["n"] != 1 or len(r["ages"]) != 1:
            raise RuntimeError(f"a group of one document has {r}")
        n += 1
    return n


def restarted(cluster_dir: Path) -> dict[str, int]:
    """Every node stopped and started again (its data and index kept); their new pids."""
    import subprocess

    from bench.common.local_cluster import shardex_cli, start_stopped_nodes

    cmd = [*shardex_cli(), "cluster", "stop", "--dir", str(cluster_dir)]
    subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    start_stopped_nodes(cluster_dir)
    return node_pids(cluster_dir)


def measure(
    cluster_dir: Path,
    name: str,
    sql: str,
    check: Callable[[Any], int],
    docs: int,
    budget: int = BUDGET,
) -> list[dict[str, Any]]:
    from shardex.client import connect_local

    pids = restarted(cluster_dir)
    with connect_local(cluster_dir) as client:
        client.wait_for_index(KEYSPACE, "#primary", timeout=600)
        warm = f"SELECT COUNT(*) AS c FROM {KEYSPACE} u WHERE u.age IS NOT MISSING"
        list(client.query(warm, timeout=600))
        base = {n: rss(p) for n, p in pids.items()}
        t = time.perf_counter()
        with RssSampler(pids) as s:
            count = check(client.query(sql, timeout=3600, memory_quota=budget))
        seconds = time.perf_counter() - t
    if count != docs:
        raise RuntimeError(f"{name}: {count} rows, expected {docs}")
    rows = []
    for n in sorted(pids):
        limit = base[n] + budget + OVERHEAD
        rows.append(
            {
                "query": name,
                "budget_MiB": budget // MiB,
                "node": n,
                "rows": count,
                "seconds": round(seconds, 1),
                "baseline_MiB": round(base[n] / MiB),
                "peak_MiB": round(s.peak[n] / MiB),
                "growth_MiB": round((s.peak[n] - base[n]) / MiB),
                "allowed_MiB": round(limit / MiB),
                "within": s.peak[n] <= limit,
                "samples": s.samples,
            }
        )
    log(f"{name}: {count} rows in {seconds:.1f} s; peaks {[r['peak_MiB'] for r in rows]} MiB")
    return rows


def refused_without_spilling(client: Any, docs: int) -> dict[str, Any]:
    """The GROUP BY with spilling off fails: at 1M documents with the 256 MiB quota (the
    budget binds), with fewer a quota scaled down alike."""
    from shardex.errors import ErrorCode, ShardexError

    quota = max(MiB, BUDGET * docs // 1_000_000)
    try:
        list(client.query(GROUP, timeout=3600, memory_quota=quota, spill=False))
    except ShardexError as e:
        if e.code is not ErrorCode.QUERY_MEMORY_LIMIT:
            raise
        return {
            "quota": quota,
            "code": e.code.value,
            "operator": e.details.get("operator"),
            "message": e.message,
        }
    raise RuntimeError(f"GROUP BY of every document fit {quota} bytes without spilling")


def spill_lines(cluster_dir: Path) -> list[str]:
    return [
        line.strip()
        for log_file in sorted(cluster_dir.glob("*/node.log"))
        for line in log_file.read_text().splitlines()
        if " spilled " in line
    ]


def run(plan: Plan) -> dict[str, Any]:
    from bench.common.dataset import write_docs
    from shardex.client import connect_local

    with bench_dir(NAME, plan) as (base, extra):
        files, size = write_docs(base, plan.docs, plan.seed, plan.load_files)
        extra["documents"] = {"count": plan.docs, "jsonl_bytes": size}
        with loaded_cluster(base, files, plan.docs, plan.partitions) as (cdir, client, load_s):
            # The pipeline driver (in this process) builds the index the DDL asks for.
            with spark_driver(base, cdir, "shardex-bench-sql-memory"):
                client.execute_ddl(PRIMARY)
                t = time.perf_counter()
                client.build_index(KEYSPACE, "#primary")
                client.wait_for_index(KEYSPACE, "#primary", timeout=7200)
                build_s = time.perf_counter() - t
            log(f"#primary ACTIVE after {build_s:.1f} s; Spark stopped; querying")
            rows = measure(cdir, "ORDER BY unindexed", ORDER, _check_order, plan.docs)
            rows += measure(cdir, "GROUP BY 1 group/doc", GROUP, _check_groups, plan.docs)
            # The sort again at a quarter of the budget: more runs, less held.
            small = BUDGET // 4
            rows += measure(cdir, "ORDER BY unindexed", ORDER, _check_order, plan.docs, small)
            with connect_local(cdir) as c:
                extra["refused_without_spilling"] = refused_without_spilling(c, plan.docs)
            extra["spills"] = spill_lines(cdir)
            extra["shardex"] = {"load_seconds": load_s, "build_seconds": build_s}
    extra["budget_bytes"] = BUDGET
    extra["overhead_bytes"] = OVERHEAD
    return {"tables": {"node RSS during budgeted queries": rows}, **extra}


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse_plan_args(argv, NAME, __doc__ or "", Plan, QUICK)

    def summary(out: dict[str, Any], elapsed: float) -> str:
        ok = rss_within(out)
        return (
            f"{plan.docs:,} docs, 3 nodes on {machine_info()['cpu_count']} CPUs; allowed RSS "
            f"baseline + budget + {OVERHEAD // MiB} MiB: "
            f"{'every node within' if ok else 'OVER on some node'}; without spilling: "
            f"{out['refused_without_spilling']['code']}; {len(out['spills'])} spilling "
            f"fragments logged; load average start {out['load_avg_start']}, end "
            f"{out['load_avg_end']}; {elapsed:.0f} s"
        )

    code = bench_main(NAME, plan, path, run, summary)
    if code == 0 and not rss_within(json.loads(path.read_text())):
        print("a node's RSS went over baseline + budget + overhead", file=sys.stderr)
        return 1  # the check this benchmark stands for: it fails, after its table and JSON
    return code


def rss_within(out: dict[str, Any]) -> bool:
    """Every node's sampled RSS stayed within its allowance during every query."""
    return all(r["within"] for r in out["tables"]["node RSS during budgeted queries"])


if __name__ == "__main__":
    sys.exit(main())
