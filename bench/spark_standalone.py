"""Index builds with Spark executors on another host: ``python -m bench.spark_standalone
[--quick] [--docs N]`` (root: it makes network namespaces).

Four hosts (network namespaces on one bridge, ``shardex.testing.hosts``): two shardex nodes
(TLS) on hosts 1 and 2 holding keyspace ``KEYSPACE`` (the demo's users, one copy of each
document), the pipeline driver on host 3, and a Spark standalone cluster (master on host 3, one
worker with 2 cores on host 4, ``spark.authenticate`` on). The same build of the two
benchmark indexes (``bench.common.dataset.INDEXES``, deferred, then BUILD INDEX both at once)
runs once per round in each mode, the order alternating:

- ``local``: ``shardex pipeline --master local[2]``, the executors inside the driver's
  process on host 3;
- ``standalone``: ``shardex pipeline --master spark://host3:7077``, the executors on host 4:
  every read task and every projected batch crosses the bridge to the nodes.

Per build: the wall time from BUILD INDEX until both indexes are ACTIVE, and the driver's
own build job time (from its log). Ratio standalone / local of both (medians over rounds).
One machine: both modes share its cores, so the ratio is the cost of running the executors
elsewhere (a separate JVM, task shipping, Spark's encrypted RPC), not the speed-up of a
second machine's cores.
"""

from __future__ import annotations

import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.runner import Row, load1, log

NAME = "spark_standalone"
MODES = ("local", "standalone")
NODES, DRIVER, WORKER = 2, 3, 4
_BUILT = re.compile(
    r"built \[.*?\]: (\d+) documents, (\d+) entries, (\d+) evaluation errors in ([\d.]+) s"
)


@dataclass
class Plan:
    docs: int = 1_000_000
    seconds: float = 0.0  # unused: builds run to completion
    rounds: int = 3
    partitions: int = 16
    seed: int = 20240601


QUICK = {"docs": 20_000, "seconds": 0.0, "rounds": 2}


def _load(client: Any, plan: Plan) -> float:
    from bench.common.dataset import KEYSPACE
    from shardex.demo.datagen import users

    client.create_keyspace(KEYSPACE, num_partitions=plan.partitions, num_replicas=0)
    ks = client.keyspace(KEYSPACE)
    t = time.perf_counter()
    batch: list[tuple[str, dict[str, Any]]] = []
    for i, doc in enumerate(users(plan.docs, plan.seed), 1):
        batch.append((doc["id"], doc))
        if len(batch) == 5000:
            ks.upsert_many(batch)
            batch = []
        if i % 100_000 == 0:
            log(f"loaded {i:,} documents")
    if batch:
        ks.upsert_many(batch)
    return time.perf_counter() - t


def _wait_ready(home: Path, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    log_file = home / "pipeline.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log_file.exists() and "pipeline driver ready" in log_file.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the pipeline driver exited {proc.returncode} (see {home})")
        time.sleep(0.2)
    raise RuntimeError(f"the pipeline driver was not ready within {timeout:.0f} s (see {home})")


def _build_once(client: Any, nodes: Any, spark: Any, mode: str, run: int, docs: int) -> Row:
    from bench.common.dataset import INDEX_NAMES, KEYSPACE, create_indexes

    home = spark.root / f"pipeline-{run}-{mode}"
    master = "local[2]" if mode == "local" else None
    proc = spark.start_pipeline(
        DRIVER, nodes.addresses, nodes.secret_file, nodes.tls_ca, master=master, home=home
    )
    try:
        _wait_ready(home, proc)
        create_indexes(client)
        load = load1()
        log(f"{mode}: BUILD INDEX {', '.join(INDEX_NAMES)} ({docs:,} documents)")
        t = time.perf_counter()
        client.build_index(KEYSPACE, *INDEX_NAMES)
        for name in INDEX_NAMES:
            client.wait_for_index(KEYSPACE, name, timeout=7200)
        wall = time.perf_counter() - t
        log(f"{mode}: both indexes ACTIVE after {wall:.1f} s")
        m = None
        deadline = time.monotonic() + 30
        while m is None and time.monotonic() < deadline:
            m = _BUILT.search((home / "pipeline.log").read_text(errors="replace"))
            time.sleep(0.2 if m is None else 0)
        job = float(m.group(4)) if m else None
        built = int(m.group(1)) if m else None
        if built is not None and built != docs:
            raise RuntimeError(f"the build indexed {built:,} documents, {docs:,} were loaded")
        for name in INDEX_NAMES:
            client.drop_index(KEYSPACE, name)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {
        "round": run + 1,
        "executors": mode,
        "docs": docs,
        "built docs": built,
        "BUILD -> ACTIVE s": round(wall, 2),
        "build job s": job,
        "docs/s": round(docs / wall),
        "load_1m": load,
    }


def run(plan: Plan) -> dict[str, Any]:
    from bench.common.harness import bench_dir
    from shardex.testing.hosts.netns import Hosts, netns_problem
    from shardex.testing.hosts.nodes import NodesOnHosts
    from shardex.testing.hosts.spark import SparkOnHosts

    problem = netns_problem()
    if problem is not None:
        raise SystemExit(f"bench.{NAME}: {problem}")
    with bench_dir(NAME, plan) as (base, extra), Hosts(4) as hosts:
        nodes = NodesOnHosts(hosts, base / "nodes", count=NODES)
        spark = SparkOnHosts(hosts, base / "spark", master_host=DRIVER, worker_host=WORKER)
        nodes.start_all()
        spark.start()
        nodes.wait_formed()
        builds: list[Row] = []
        with nodes.connect(name="bench-standalone", request_timeout=120) as client:
            log(f"loading {plan.docs:,} documents into {NODES} nodes")
            extra["load_seconds"] = round(_load(client, plan), 1)
            for r in range(plan.rounds):
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    builds.append(_build_once(client, nodes, spark, mode, r, plan.docs))
        extra["executor_logs"] = len(spark.executor_logs())
    tables = {"index builds": builds, "ratio standalone / local (medians)": _ratios(builds)}
    return {"tables": tables, **extra}


def _ratios(builds: Sequence[Row]) -> list[Row]:
    out: list[Row] = []
    for col in ("BUILD -> ACTIVE s", "build job s"):
        by = {
            m: [b[col] for b in builds if b["executors"] == m and b[col] is not None] for m in MODES
        }
        if by["local"] and by["standalone"]:
            local, standalone = statistics.median(by["local"]), statistics.median(by["standalone"])
            out.append(
                {
                    "measure": col,
                    "local": round(local, 2),
                    "standalone": round(standalone, 2),
                    "standalone / local": round(standalone / local, 3),
                }
            )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from bench.common.harness import bench_main, parse_plan_args
    from bench.common.runner import machine_info

    plan, path = parse_plan_args(argv, NAME, __doc__ or "", Plan, QUICK)

    def summary(out: dict[str, Any], elapsed: float) -> str:
        return (
            f"{plan.docs:,} docs on {NODES} TLS nodes (network namespaces, one bridge), "
            f"{plan.rounds} round(s) of one build per mode, order alternating, on "
            f"{machine_info()['cpu_count']} CPUs shared by every host; "
            f"documents loaded in {out['load_seconds']} s; "
            f"load average start {out['load_avg_start']}, end {out['load_avg_end']}; "
            f"{elapsed:.0f} s. Shared machine: noisy figures."
        )

    return bench_main(NAME, plan, path, run, summary)


if __name__ == "__main__":
    sys.exit(main())
