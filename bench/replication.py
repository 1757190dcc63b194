"""Replication: durable upserts against PostgreSQL with a synchronous standby, failover time,
and what a replica costs a write: ``python -m bench.replication [--quick] [--part N]``.

1. **Durable upserts.** A 3-node local cluster (real processes, default failure detection),
   keyspace ``dur`` of 64 partitions with ``num_replicas=1``; upserts of the data service's
   documents (~500 B - 1 KB) at every durability level, by 1 and 16 clients (client
   processes, ``bench/common/clients.py``: one interpreter each, so the GIL is not measured),
   each client on keys of its own. PostgreSQL in the same run, alone on the machine as
   shardex is: a primary and a streaming standby made with ``pg_basebackup`` in the
   benchmark's temp dir, the standby named in ``synchronous_standby_names``; table
   ``docs(id text primary key, body jsonb)``, one autocommit ``INSERT ... ON CONFLICT (id) DO
   UPDATE`` per document, each client's session at ``synchronous_commit`` = off, local,
   remote_write, on, remote_apply. Upserts/s, p50/p99 latency and the servers' CPU per
   upsert (nodes; postmasters and their children), then each shardex level against its
   PostgreSQL counterpart (``COUNTERPART``). The goal line: ``majority`` at 16 clients at or
   above PostgreSQL's ``remote_apply`` commits/s.
2. **Failover time.** A 3-node cluster started with ``--heartbeat-interval 0.25
   --failure-timeout 1 --auto-failover-timeout T`` (T = 2 s; and 5 s unless ``--quick``),
   keyspace ``fo`` of 16 partitions with ``num_replicas=1``. Per run: kill -9 of node2 or
   node3 (in turn; node1 answers the admin client), then the time to the first acknowledged
   write (``persist_active``: with one replica a majority is impossible until the node is
   back) on a document whose partition's active was on the victim, probed by 10 writers
   started 0.1 s apart so the client's retry backoff does not round the figure up; and the
   time until ``failed_over()`` lists the node. Then the node is restarted, recovered
   (delta) and rebalanced before the next run. Goal line: at most T + 1 s.
3. **Replica cost.** On the cluster of part 1, upserts at durability ``none`` into keyspace
   ``dur0`` (``num_replicas=0``) beside ``dur`` (1 replica): upserts/s and node CPU per
   upsert.
4. **Replica cost on the pipeline.** ``bench.pipeline``'s load, build, drain and freshness
   on a cluster with ``num_replicas=0`` and then one with ``num_replicas=1``: drain
   mutations/s, ack -> stability (request_plus visibility) p50/p99, and the ratios
   (``replication_pipeline.py``).

The machine may be shared and noisy (load average in the JSON): ratios are reported, only
the goal lines are checked, and never with an exit status.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import clients
from bench.common.runner import RESULTS_DIR, Row, percentile
from bench.replication_failover import (
    FAST_DETECTION,
    FO_PARTITIONS,
    PROBE_STAGGER,
    PROBES,
    failover_summary,
    measure_failover,
)
from bench.replication_pipeline import (
    PIPELINE_QUICK,
    PipelinePlan,
    measure_pipeline,
    pipeline_ratio_rows,
)

NAME = "replication"
SEED = 20240601
LEVELS = ("none", "persist_active", "majority", "majority_persist_active", "persist_majority")
PG_LEVELS = ("off", "local", "remote_write", "on", "remote_apply")
# Each shardex level against the PostgreSQL level that waits for the same things, and why.
# PostgreSQL has no level that waits for the standby without flushing its own WAL, so the
# levels without a flush on the active are compared with the nearest stronger one.
COUNTERPART: dict[str, tuple[str, str]] = {
    "none": ("off", "neither flushes a WAL nor waits for a copy"),
    "persist_active": ("local", "the WAL flushed on the active/primary, no copy waited for"),
    "majority": (
        "remote_apply",
        "the write applied (readable) on the replica/standby; shardex flushes neither WAL, "
        "PostgreSQL flushes the primary's (the goal line)",
    ),
    "majority_persist_active": (
        "remote_write",
        "the active/primary's WAL flushed and the write received by the replica/standby, "
        "not flushed there",
    ),
    "persist_majority": ("on", "the WAL flushed on both copies (active/primary and replica)"),
}
GOAL_LEVEL, GOAL_CLIENTS = "majority", 16
DUR_KS, DUR0_KS = "dur", "dur0"
DUR_PARTITIONS = 64

UPSERT_SQL = (
    "INSERT INTO docs (id, body) VALUES (%s, %s) "
    "ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body"
)


@dataclass
class Plan:
    seconds: float = 5.0  # per measurement
    clients: list[int] = field(default_factory=lambda: [1, 16])
    docs: int = 500  # documents each client cycles through (its own keys)
    failover_runs: int = 10
    failover_timeouts: list[float] = field(default_factory=lambda: [2.0, 5.0])
    pipeline: PipelinePlan = field(default_factory=PipelinePlan)
    parts: list[int] = field(default_factory=lambda: [1, 2, 3, 4])


QUICK = {
    "seconds": 2.0,
    "failover_runs": 3,
    "failover_timeouts": [2.0],
    "pipeline": PIPELINE_QUICK,
}


def log(msg: str) -> None:
    print(f"[{NAME}] {msg}", file=sys.stderr, flush=True)


# --- the client processes ----------------------------------------------------------------


def _json_dumps(obj: Any) -> str:
    """JSON for psycopg's ``Jsonb`` (module-level: psycopg warns about closures)."""
    import msgspec

    return msgspec.json.encode(obj).decode()


class UpsertRunner(clients.TargetRunner):
    """In a client process: upserts (docid, doc) pairs under keys of its own (``c<k>:``).
    Setting: shardex ``(keyspace, durability)``; PostgreSQL the ``synchronous_commit``."""

    NAME = "bench-replication"

    def __init__(self, target: clients.Target, k: int = 0) -> None:
        super().__init__(target, k)
        self.k = k
        self.ks: Any = None
        self.durability = "persist_active"
        if target.kind == "postgresql":
            from psycopg.types.json import set_json_dumps

            # The shardex client encodes with msgspec too: client-side costs alike.
            set_json_dumps(_json_dumps, self.conn)

    def prepare(self, queries: Sequence[Any], setting: Any) -> None:
        if self.target.kind == "shardex":
            keyspace, self.durability = setting
            self.ks = self.client.keyspace(keyspace)
        else:
            if setting not in PG_LEVELS:
                raise ValueError(f"synchronous_commit {setting!r} not one of {PG_LEVELS}")
            self.conn.execute(f"SET synchronous_commit = {setting}")

    def count(self, q: Any, setting: Any) -> int:
        docid, doc = q
        key = f"c{self.k}:{docid}"
        if self.target.kind == "shardex":
            self.ks.upsert(key, doc, durability=self.durability)
        else:
            self.conn.execute(UPSERT_SQL, (key, self.jsonb(doc)))
        return 1


POOL_CONFIG = clients.PoolConfig(answer_timeout=180.0, result_slack=120.0, stretch_seconds=True)


def measure_case(
    pool: clients.ClientPool,
    items: Sequence[Any],
    setting: Any,
    n: int,
    seconds: float,
    cpu: Callable[[], float],
) -> Row:
    """One case: ``n`` clients for ``seconds``; rate, latency, and the servers' and the
    client processes' CPU per upsert (over the warm-up and the measured upserts: the window
    the CPU is read around; the clients' includes their driver, psycopg or shardex's)."""
    from bench.common.proc_cpu import process_cpu

    client_pids = [p.pid for p in pool.procs[:n]]
    cpu0, client0 = cpu(), process_cpu(client_pids)
    m = pool.measure(items, setting, n, seconds)
    cpu_s, client_s = cpu() - cpu0, process_cpu(client_pids) - client0
    lat = sorted(m.latencies)
    ops = len(lat)
    attempts = ops + len(m.errors) + n * clients.WARMUP_QUERIES
    if m.errors:
        log(f"{setting}, {n} clients: {len(m.errors)} errors, first: {m.errors[0]}")
    return {
        "clients": n,
        "upserts": ops,
        "upserts/s": round(ops / m.seconds, 1) if m.seconds else None,
        "p50 ms": round(percentile(lat, 50) * 1e3, 2) if lat else None,
        "p99 ms": round(percentile(lat, 99) * 1e3, 2) if lat else None,
        "errors": len(m.errors),
        "server cpu ms/upsert": round(cpu_s * 1e3 / attempts, 3) if attempts else None,
        "client cpu ms/upsert": round(client_s * 1e3 / attempts, 3) if attempts else None,
    }


# --- part 1 and 3: durable upserts -------------------------------------------------------


def measure_postgres(base: Path, plan: Plan, items: Sequence[Any]) -> tuple[list[Row], Any]:
    """PostgreSQL primary + synchronous standby: every ``synchronous_commit`` level."""
    from bench.common.pg_standby import StandbyServer, sync_primary_settings
    from bench.common.postgres import PostgresServer
    from bench.common.proc_cpu import tree_cpu

    rows: list[Row] = []
    primary = PostgresServer(sync_primary_settings(), base_dir=base, replication=True)
    with primary, StandbyServer(primary) as standby:
        sync = standby.wait_sync()
        with primary.connect() as conn:
            conn.execute("CREATE TABLE docs (id text PRIMARY KEY, body jsonb NOT NULL)")
            conn.execute("CHECKPOINT")
        pids = [p for p in (primary.postmaster_pid(), standby.postmaster_pid()) if p]
        target = clients.Target("postgresql", conninfo=primary.conninfo())
        factory = functools.partial(UpsertRunner, target)
        with clients.ClientPool(factory, max(plan.clients), config=POOL_CONFIG) as pool:
            for level in PG_LEVELS:
                for n in plan.clients:
                    log(f"postgresql synchronous_commit={level}, {n} clients")
                    row = measure_case(pool, items, level, n, plan.seconds, lambda: tree_cpu(pids))
                    rows.append({"system": "postgresql", "level": level, **row})
        with primary.connect() as conn:
            lag = conn.execute(
                "SELECT pg_wal_lsn_diff(sent_lsn, replay_lsn) FROM pg_stat_replication"
            ).fetchone()
        info = {
            "primary": primary.describe(),
            "standby": standby.describe(),
            "replication": {**sync, "replay_lag_bytes_at_end": lag[0] if lag else None},
            "session_setting": "SET synchronous_commit = <level> in each client's session",
            "cpu": "postmaster and children (backends, walsender, walreceiver) of both servers",
        }
    return rows, info


def measure_shardex(base: Path, plan: Plan, items: Sequence[Any]) -> tuple[list[Row], Any]:
    """A 3-node cluster, keyspace ``dur`` (1 replica) at every level; part 3 adds ``dur0``
    (no replica) at durability none."""
    from bench.common.local_cluster import node_pids, shardex_cluster
    from bench.common.proc_cpu import process_cpu
    from shardex.client import connect_local

    rows: list[Row] = []
    info: dict[str, Any] = {}
    cases: list[tuple[str, int]] = []
    if 1 in plan.parts:
        cases += [(level, 1) for level in LEVELS]
    if 3 in plan.parts:
        cases += [("none", 0)] + ([] if 1 in plan.parts else [("none", 1)])
    with shardex_cluster(base, 3) as cdir, connect_local(cdir, name="bench-admin") as admin:
        for ks, replicas in ((DUR_KS, 1), (DUR0_KS, 0)):
            desc = admin.create_keyspace(ks, DUR_PARTITIONS, num_replicas=replicas)
            if desc.num_replicas != replicas:
                raise RuntimeError(f"{ks}: {desc.num_replicas} replicas, wanted {replicas}")
        pids = list(node_pids(cdir).values())
        factory = functools.partial(UpsertRunner, clients.shardex_target(cdir))
        with clients.ClientPool(factory, max(plan.clients), config=POOL_CONFIG) as pool:
            for level, replicas in cases:
                ks = DUR_KS if replicas else DUR0_KS
                for n in plan.clients:
                    log(f"shardex durability={level}, num_replicas={replicas}, {n} clients")
                    row = measure_case(
                        pool, items, (ks, level), n, plan.seconds, lambda: process_cpu(pids)
                    )
                    rows.append({"system": "shardex", "level": level, "replicas": replicas, **row})
        # A node failed over mid-run (a starved heartbeat) would make the figures moot.
        info["failed_over_during_measurement"] = admin.failed_over()
        if info["failed_over_during_measurement"]:
            log(f"WARNING: failed over during the run: {info['failed_over_during_measurement']}")
        info["cluster"] = "3 nodes, default failure detection, one temp dir on this machine"
        info["keyspaces"] = {DUR_KS: "64 partitions, 1 replica", DUR0_KS: "64, no replica"}
        info["cpu"] = "the 3 node processes"
    return rows, info


def ratio_rows(rows: Sequence[Row], plan: Plan) -> list[Row]:
    """Each shardex level (1 replica) against its PostgreSQL counterpart, per client count."""

    def rate(system: str, level: str, n: int) -> float | None:
        for r in rows:
            key = (r["system"], r["level"], r["clients"], r.get("replicas", 1))
            if key == (system, level, n, 1):
                return r["upserts/s"]
        return None

    out: list[Row] = []
    for level in LEVELS:
        pg_level = COUNTERPART[level][0]
        for n in plan.clients:
            s, p = rate("shardex", level, n), rate("postgresql", pg_level, n)
            if s is None or p is None:
                continue
            row: Row = {
                "shardex level": level,
                "postgresql level": pg_level,
                "clients": n,
                "shardex/s": s,
                "postgresql/s": p,
                "shardex/pg": round(s / p, 2) if p else None,
                "goal": "",
            }
            if (level, n) == (GOAL_LEVEL, GOAL_CLIENTS):
                row["goal"] = "met (>= 1)" if s >= p else "NOT met (< 1)"
            out.append(row)
    return out


def replica_cost_rows(rows: Sequence[Row], plan: Plan) -> list[Row]:
    """Durability none: no replica vs one, per client count."""

    def find(replicas: int, n: int) -> Row | None:
        return next(
            (
                r
                for r in rows
                if r["system"] == "shardex"
                and r["level"] == "none"
                and r.get("replicas") == replicas
                and r["clients"] == n
            ),
            None,
        )

    out: list[Row] = []
    for n in plan.clients:
        r0, r1 = find(0, n), find(1, n)
        if r0 is None or r1 is None:
            continue
        c0, c1 = r0["server cpu ms/upsert"], r1["server cpu ms/upsert"]
        out.append(
            {
                "clients": n,
                "0 replicas /s": r0["upserts/s"],
                "1 replica /s": r1["upserts/s"],
                "1 / 0 rate": round(r1["upserts/s"] / r0["upserts/s"], 2)
                if r0["upserts/s"]
                else None,
                "0 replicas cpu ms": c0,
                "1 replica cpu ms": c1,
                "1 / 0 cpu": round(c1 / c0, 2) if c0 else None,
            }
        )
    return out


# --- main --------------------------------------------------------------------------------


def run(plan: Plan) -> dict[str, Any]:
    from bench.common.dataset import doc_sizes, make_docs
    from bench.common.harness import bench_dir

    items, source = make_docs(plan.docs, SEED)
    tables: dict[str, list[Row]] = {}
    with bench_dir(NAME, plan) as (base, extra):
        extra["documents"] = {"source": source, **doc_sizes(items)}
        rows: list[Row] = []
        if 1 in plan.parts:
            pg_rows, extra["postgresql"] = measure_postgres(base, plan, items)
            rows += pg_rows
        if 1 in plan.parts or 3 in plan.parts:
            sx_rows, extra["shardex"] = measure_shardex(base, plan, items)
            rows += sx_rows
        fo_runs: list[Row] = []
        if 2 in plan.parts:
            for timeout in plan.failover_timeouts:
                fo_runs += measure_failover(base, timeout, plan.failover_runs)
        pipe_rows: list[Row] = []
        if 4 in plan.parts:
            pipe_rows, extra["pipeline"] = measure_pipeline(base, plan.pipeline, SEED)
    tables["durable upserts"] = rows
    tables["shardex / PostgreSQL (upserts/s; > 1: shardex faster)"] = ratio_rows(rows, plan)
    tables["replica cost at durability none (node CPU per upsert)"] = replica_cost_rows(rows, plan)
    tables["failover after kill -9"] = failover_summary(fo_runs)
    tables["pipeline with 0 and 1 replica"] = pipe_rows
    tables["pipeline: 1 replica / 0 (rates < 1, times > 1: what the replica costs)"] = (
        pipeline_ratio_rows(pipe_rows)
    )
    extra["failover_runs"] = fo_runs
    extra["failover_setup"] = {
        "cluster": "3 nodes, " + " ".join(FAST_DETECTION) + " --auto-failover-timeout T",
        "keyspace": f"{FO_PARTITIONS} partitions, 1 replica, idle but for the probes",
        "probe": f"{PROBES} writers at persist_active, started {PROBE_STAGGER:g} s apart "
        "from the kill, each on a document of a partition whose active was the victim",
        "between runs": "shardex cluster start (the victim), recover delta, rebalance",
    }
    extra["mapping"] = {
        level: {"postgresql": pg, "why": why} for level, (pg, why) in COUNTERPART.items()
    }
    extra["goal_lines"] = {
        "durable upserts": f"shardex {GOAL_LEVEL} at {GOAL_CLIENTS} clients >= PostgreSQL "
        "remote_apply commits/s",
        "failover": "first write after kill -9 at most auto-failover timeout + 1 s",
    }
    return {"tables": tables, **extra}


def summary(out: dict[str, Any], elapsed: float) -> str:
    parts = out["plan"]["parts"]
    lines: list[str] = []
    if 1 in parts:
        lines.append(
            "mapping (shardex level -> PostgreSQL synchronous_commit with a sync standby):"
        )
        for level, (pg, why) in COUNTERPART.items():
            lines.append(f"  {level} -> {pg}: {why}")
    if 1 in parts or 3 in parts:
        lines.append(
            "clients are processes, each on its own keys; shardex 3 nodes and PostgreSQL "
            f"primary + standby each alone on the same {os.cpu_count()} CPUs and disk."
        )
    if 4 in parts:
        pipe = out["plan"]["pipeline"]
        lines.append(
            f"pipeline: {pipe['docs']:,} docs, {pipe['mutations']:,} drained, freshness at "
            f"{pipe['rate']:g}/s for {pipe['seconds']:g} s; 3 nodes + Spark local[2] on "
            f"{os.cpu_count()} CPUs, one cluster per replica count."
        )
    lines.append(
        f"load average start {out.get('load_avg_start')}, end {out.get('load_avg_end')}; "
        "a shared machine: the figures are noisy."
    )
    lines.append(f"{NAME}: {elapsed:.0f} s")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    ap = argparse.ArgumentParser(prog=f"python -m bench.{NAME}", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="2 s per measurement, 3 failover runs at 2 s only, pipeline on 20k documents "
        "(about 8 minutes)",
    )
    ap.add_argument("--part", type=int, action="append", choices=(1, 2, 3, 4), help="parts to run")
    ap.add_argument("--seconds", type=float, help="seconds per measurement (default 5)")
    ap.add_argument("--runs", type=int, help="failover runs per timeout (default 10)")
    ap.add_argument("--json", type=Path, help="where to write the JSON")
    args = ap.parse_args(argv)
    plan = Plan(**QUICK) if args.quick else Plan()  # type: ignore[arg-type]
    if args.part:
        plan.parts = sorted(set(args.part))
    if args.seconds is not None:
        plan.seconds = args.seconds
    if args.runs is not None:
        plan.failover_runs = args.runs
    if plan.seconds <= 0 or plan.failover_runs < 1:
        ap.error("--seconds must be positive and --runs at least 1")
    default = f"{NAME}-quick.json" if args.quick else f"{NAME}.json"
    return plan, args.json or RESULTS_DIR / default


def main(argv: Sequence[str] | None = None) -> int:
    from bench.common.harness import bench_main

    plan, path = parse_args(argv)
    return bench_main(NAME, plan, path, run, summary)


if __name__ == "__main__":
    sys.exit(main())
