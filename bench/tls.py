"""The cost of TLS: ``python -m bench.tls [--quick] [--docs N] [--build-docs N] [--seconds S]
[--rounds R]``.

Two local clusters side by side, alike but for TLS: 2 nodes each (real processes), one
plaintext and one started with ``--tls`` (TLS 1.3 on every connection, client to node and
node to node, ECDSA P-256 certificates). Each gets keyspace ``KEYSPACE`` (16 partitions, one
replica) loaded with ``--docs`` of the demo's users (``bench.common.dataset``) and the two
indexes built by the pipeline driver in this process, one cluster after the other (these
builds also warm Spark up).

The build: more clusters, alike, each loaded with ``--build-docs`` users (default
1,000,000), then BUILD INDEX of both indexes through the pipeline driver: four passes,
plain, TLS, TLS, plain, each on a fresh cluster stopped after its build; wall time until
both are ACTIVE and the driver's job time, and the ratio TLS/plain of their sums.

Then one client per cluster (this process, one request at a time; single-document requests
and scans over the calling thread's socket, as users' clients run) measures, the clusters
taking turns round by round so both see the same machine:

- ``get`` of a random loaded document;
- ``upsert`` of a loaded document (its own body again), default durability;
- a 100-row index scan (``bench.scan``'s "limit 100" queries on ``by_city_age``).

Per operation: ops/s, p50/p99 latency, and CPU time per operation of the cluster's nodes
and of this process (``/proc`` and ``time.process_time``: less disturbed by other work on a
shared machine than latency is) of each cluster (medians over rounds), and the ratios
TLS/plain of the p50 latency, of the time per operation (plain ops/s over TLS ops/s) and of
the CPU per operation. Goal line: the latency and time-per-operation ratios at most 1.15.
Shared machine: noisy figures, no exit status from the goal.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.proc_cpu import process_cpu
from bench.common.runner import Row, load1, log, percentile

NAME = "tls"
GOAL = 1.15
MODES = ("plain", "tls")
OPS = ("get", "upsert", "scan 100 rows")
BUILD = "build"


@dataclass
class Plan:
    docs: int = 50_000
    build_docs: int = 1_000_000
    seconds: float = 2.0  # per measurement
    rounds: int = 5
    partitions: int = 16
    load_files: int = 2
    seed: int = 20240601


QUICK = {"docs": 5_000, "build_docs": 20_000, "seconds": 1.0, "rounds": 3}


@contextmanager
def _cluster(
    base: Path, mode: str, plan: Plan, files: Sequence[Path], n_docs: int
) -> Iterator[Path]:
    """A 2-node cluster, plaintext or with ``--tls``, loaded from ``files`` (checked to hold
    ``n_docs``)."""
    from bench.common.dataset import KEYSPACE, shardex_load
    from bench.common.local_cluster import shardex_cluster
    from shardex.client import connect_local

    extra = ["--tls"] if mode == "tls" else []
    with shardex_cluster(base, 2, extra) as cdir:
        with connect_local(cdir) as client:
            client.create_keyspace(KEYSPACE, num_partitions=plan.partitions, num_replicas=1)
            seconds = shardex_load(cdir, files, base)
            total = client.keyspace_stats(KEYSPACE).total_docs
        if total != n_docs:
            raise RuntimeError(f"the {mode} cluster holds {total} documents, expected {n_docs}")
        log(f"{mode} cluster: {n_docs:,} docs loaded in {seconds:.1f} s")
        yield cdir


def _build(base: Path, spark: Any, cdir: Path, mode: str, docs: int, tag: str) -> list[Row]:
    from bench.common.dataset import create_indexes
    from bench.common.driver import BatchLog, InProcessDriver, shardex_build
    from bench.common.harness import DRIVER_POLL
    from shardex.client import connect_local

    with connect_local(cdir) as client:
        create_indexes(client)
        driver = InProcessDriver(spark, cdir, base / f"checkpoints-{tag}", BatchLog(), DRIVER_POLL)
        try:
            rows, _ = shardex_build(client, driver, docs, timeout=3600)
        finally:
            driver.stop()
    return [{"cluster": mode, **r} for r in rows]


# The build passes, in order: plain, TLS, TLS, plain (a drift over the run - the machine's
# other work, Spark warming up - weighs on both alike).
BUILD_PASSES = ("plain", "tls", "tls", "plain")


def _build_phase(base: Path, spark: Any, plan: Plan) -> list[Row]:
    """The ``build_docs`` build, once per ``BUILD_PASSES`` entry, each on a fresh cluster
    (loaded, built, stopped); every row of ``shardex_build`` per pass."""
    from bench.common.dataset import write_docs

    work = base / "build"
    work.mkdir()
    files, _ = write_docs(work, plan.build_docs, plan.seed, plan.load_files)
    rows: list[Row] = []
    for i, mode in enumerate(BUILD_PASSES, 1):
        log(f"build pass {i}/{len(BUILD_PASSES)}: {plan.build_docs:,} docs, {mode} cluster")
        with _cluster(work, mode, plan, files, plan.build_docs) as cdir:
            built = _build(work, spark, cdir, mode, plan.build_docs, f"build-{i}")
        rows += [{"pass": i, **r} for r in built]
    for f in files:
        f.unlink()
    return rows


def _ops(client: Any, docs: list[dict[str, Any]], queries: list[Any]) -> dict[str, Callable]:
    from bench.common.dataset import KEYSPACE

    ks = client.keyspace(KEYSPACE)
    rng = random.Random(7)
    hot = docs[:500]  # upserts cycle over these

    def get() -> None:
        ks.get(rng.choice(docs)["id"])

    def upsert() -> None:
        doc = rng.choice(hot)
        ks.upsert(doc["id"], doc)

    def scan() -> None:
        q = rng.choice(queries)
        rows = sum(1 for _ in client.scan(KEYSPACE, q.index, q.spans, limit=q.limit))
        if rows != q.expected_rows:
            raise RuntimeError(f"scan returned {rows} rows, expected {q.expected_rows}")

    return {"get": get, "upsert": upsert, "scan 100 rows": scan}


@dataclass
class Sample:
    rate: float  # ops/s
    lat: list[float]  # sorted latencies (s)
    node_cpu: float  # CPU seconds of the cluster's nodes per operation
    client_cpu: float  # CPU seconds of this process per operation


def _measure(op: Callable[[], None], seconds: float, node_pids: Sequence[int]) -> Sample:
    """Run ``op`` back to back for ``seconds``."""
    for _ in range(20):  # warm: sockets open, caches hot
        op()
    lat: list[float] = []
    cpu0, own0 = process_cpu(node_pids), time.process_time()
    start = time.perf_counter()
    end = start + seconds
    now = start
    while now < end:
        t = now
        op()
        now = time.perf_counter()
        lat.append(now - t)
    n = len(lat)
    node_cpu = (process_cpu(node_pids) - cpu0) / n
    return Sample(n / (now - start), sorted(lat), node_cpu, (time.process_time() - own0) / n)


def run(plan: Plan) -> dict[str, Any]:
    from bench.common.dataset import write_docs
    from bench.common.harness import bench_dir, spark_session
    from bench.common.local_cluster import node_pids
    from bench.scan.queries import LIMIT, KeyStats, build_queries
    from shardex.client import connect_local
    from shardex.demo.datagen import users

    with bench_dir(NAME, plan) as (base, extra), ExitStack() as stack:
        files, _ = write_docs(base, plan.docs, plan.seed, plan.load_files)
        docs = list(users(plan.docs, plan.seed))
        queries = build_queries(KeyStats.of(docs))[LIMIT]
        cdirs = {m: stack.enter_context(_cluster(base, m, plan, files, plan.docs)) for m in MODES}
        warm: list[Row] = []
        with spark_session(base, "shardex-bench-tls") as spark:
            for mode, cdir in cdirs.items():
                warm += _build(base, spark, cdir, mode, plan.docs, mode)
            builds = _build_phase(base, spark, plan)
        log("Spark stopped; measuring")
        ops, pids = {}, {}
        for mode, cdir in cdirs.items():
            client = stack.enter_context(connect_local(cdir, name=f"bench-tls-{mode}"))
            ops[mode] = _ops(client, docs, queries)
            pids[mode] = list(node_pids(cdir).values())
        samples: list[Row] = []
        for r in range(plan.rounds):
            for op in OPS:
                # Alternate which cluster goes first: neither always gets the warmer machine.
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    m = _measure(ops[mode][op], plan.seconds, pids[mode])
                    samples.append(
                        {
                            "round": r + 1,
                            "op": op,
                            "cluster": mode,
                            "ops/s": round(m.rate),
                            "p50 ms": round(percentile(m.lat, 50) * 1000, 3),
                            "p99 ms": round(percentile(m.lat, 99) * 1000, 3),
                            "node CPU µs/op": round(m.node_cpu * 1e6, 1),
                            "client CPU µs/op": round(m.client_cpu * 1e6, 1),
                            "load_1m": load1(),
                        }
                    )
            log(f"round {r + 1}/{plan.rounds} done")
    medians = _medians(samples)
    tables = {
        "get, upsert, 100-row scan (medians over rounds)": medians,
        "ratios TLS / plain": _ratios(medians),
        f"index build of {plan.build_docs:,} docs": builds,
        "build TLS / plain": _build_ratios(builds),
        f"index builds of the {plan.docs:,} docs measured on (Spark warm-up)": warm,
        "every measurement": samples,
    }
    return {"tables": tables, **extra}


def _medians(samples: Sequence[Row]) -> list[Row]:
    out: list[Row] = []
    for op in OPS:
        for mode in MODES:
            mine = [s for s in samples if s["op"] == op and s["cluster"] == mode]
            out.append(
                {
                    "op": op,
                    "cluster": mode,
                    "ops/s": round(statistics.median(s["ops/s"] for s in mine)),
                    "p50 ms": round(statistics.median(s["p50 ms"] for s in mine), 3),
                    "p99 ms": round(statistics.median(s["p99 ms"] for s in mine), 3),
                    "node CPU µs/op": round(
                        statistics.median(s["node CPU µs/op"] for s in mine), 1
                    ),
                    "client CPU µs/op": round(
                        statistics.median(s["client CPU µs/op"] for s in mine), 1
                    ),
                }
            )
    return out


def _ratios(medians: Sequence[Row]) -> list[Row]:
    by = {(m["op"], m["cluster"]): m for m in medians}
    out: list[Row] = []
    for op in OPS:
        plain, tls = by[(op, "plain")], by[(op, "tls")]
        p50 = round(tls["p50 ms"] / plain["p50 ms"], 3) if plain["p50 ms"] else None
        per_op = round(plain["ops/s"] / tls["ops/s"], 3) if tls["ops/s"] else None
        worst = max(r for r in (p50, per_op) if r is not None)
        out.append(
            {
                "op": op,
                "p50 TLS/plain": p50,
                "time per op TLS/plain": per_op,
                "node CPU TLS/plain": _ratio(tls["node CPU µs/op"], plain["node CPU µs/op"]),
                "client CPU TLS/plain": _ratio(tls["client CPU µs/op"], plain["client CPU µs/op"]),
                f"goal <= {GOAL}": "met" if worst <= GOAL else "MISSED",
            }
        )
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _build_ratios(builds: Sequence[Row]) -> list[Row]:
    """Per ``shardex_build`` case (wall until ACTIVE, the driver's job time): the seconds of
    every pass per cluster, and TLS/plain of their sums."""
    out: list[Row] = []
    for case in dict.fromkeys(b["case"] for b in builds):
        secs = {
            m: [b["seconds"] for b in builds if b["case"] == case and b["cluster"] == m]
            for m in MODES
        }
        ratio = _ratio(sum(secs["tls"]), sum(secs["plain"]))
        out.append(
            {
                "case": case,
                "docs": next(b["docs"] for b in builds if b["case"] == case),
                "plain s": " + ".join(f"{x:g}" for x in secs["plain"]),
                "TLS s": " + ".join(f"{x:g}" for x in secs["tls"]),
                "TLS/plain": ratio,
                f"goal <= {GOAL}": "met" if ratio is not None and ratio <= GOAL else "MISSED",
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from bench.common.harness import bench_main, parse_plan_args
    from bench.common.runner import machine_info

    ap = argparse.ArgumentParser(prog=f"python -m bench.{NAME}", add_help=False)
    ap.add_argument("--build-docs", type=int)
    ap.add_argument("--rounds", type=int)
    known, rest = ap.parse_known_args(argv)
    plan, path = parse_plan_args(rest, NAME, __doc__ or "", Plan, QUICK)
    if known.build_docs is not None:
        if known.build_docs < 1:
            ap.error(f"--build-docs must be >= 1, got {known.build_docs}")
        plan.build_docs = known.build_docs
    if known.rounds is not None:
        if known.rounds < 1:
            ap.error(f"--rounds must be >= 1, got {known.rounds}")
        plan.rounds = known.rounds

    def summary(out: dict[str, Any], elapsed: float) -> str:
        return (
            f"{plan.docs:,} docs (build: {plan.build_docs:,}), two 2-node clusters (plain, "
            "TLS) on "
            f"{machine_info()['cpu_count']} CPUs, one client each in this process, one "
            f"request at a time; {plan.rounds} rounds of {plan.seconds:g} s per measurement, "
            f"the clusters taking turns (medians over rounds); load average start "
            f"{out['load_avg_start']}, end {out['load_avg_end']}; {elapsed:.0f} s. "
            "Shared machine: noisy figures."
        )

    return bench_main(NAME, plan, path, run, summary)


if __name__ == "__main__":
    sys.exit(main())
