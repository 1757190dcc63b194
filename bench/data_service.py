"""Data service vs PostgreSQL: ``python -m bench.data_service [--docs N] [--quick]``.

One run, the same generated documents, the same machine, one client each, sequential:

- shardex: a local cluster started with the CLI (``shardex cluster start``) in a temp dir,
  1 node (the fair comparison to one PostgreSQL server) and, unless ``--quick``, 3 nodes;
  a keyspace of 64 partitions; writes with the default durability (WAL synced before the
  ack).
- PostgreSQL: a private server from the Debian package (``bench/common/postgres.py``), table
  ``docs(id text primary key, body jsonb)``, ``fsync=on`` and ``synchronous_commit=on``.

Each system, in the same order on the same documents:

1. single durable upserts, one at a time (shardex ``ks.upsert``; PostgreSQL one autocommit
   ``INSERT ... ON CONFLICT (id) DO UPDATE`` each, so one WAL flush per document);
2. batched durable upserts of the rest, 1000 per batch (one ``ks.upsert_many`` call per
   batch; PostgreSQL ``executemany`` of the same upsert in one transaction per batch,
   pipelined by psycopg); one batch in flight at a time on both sides;
3. point gets of random existing ids, one at a time (latency p50/p99); every document read
   back is compared with the one written.

Both clients encode JSON with msgspec (shardex does; psycopg is set to), so the client-side
cost is alike. It prints the figures and the ratios shardex/PostgreSQL (throughput: > 1 means
shardex is faster; latency: > 1 means shardex is slower) and writes them with the machine
info, the load average at start and end, the disk's fsync time and every non-default
PostgreSQL setting to ``bench/results/data_service.json``. The machine may be shared and
noisy: the ratios are reported, never checked against a threshold.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from bench.common.dataset import Doc, Item, doc_sizes, make_docs
from bench.common.local_cluster import shardex_cluster
from bench.common.postgres import PostgresServer, signals_raise
from bench.common.runner import Row, fs_type, load_average, percentile, print_table, report
from shardex.errors import ShardexError

KEYSPACE = "bench"
NUM_PARTITIONS = 64
BATCH = 1000
SEED = 20240601
WARMUP = 50  # untimed upserts + gets before each system's measurements


@dataclass
class Plan:
    docs: int
    single: int  # how many of the docs are written one at a time
    gets: int
    nodes: list[int]
    single_time_cap: float  # stop the single-upsert phase after this many seconds
    get_time_cap: float
    batch: int = BATCH
    seed: int = SEED


DEFAULT_PLAN = Plan(
    docs=50_000, single=3_000, gets=10_000, nodes=[1, 3], single_time_cap=20, get_time_cap=15
)
QUICK_PLAN = Plan(
    docs=10_000, single=1_000, gets=2_000, nodes=[1], single_time_cap=8, get_time_cap=6
)


def log(msg: str) -> None:
    print(f"[data_service] {msg}", file=sys.stderr, flush=True)


# --- measuring ---------------------------------------------------------------------------


class Target(Protocol):
    """One system under test, reached by one client."""

    system: str

    def upsert(self, docid: str, doc: Doc) -> None: ...
    def upsert_batch(self, items: Sequence[Item]) -> None: ...
    def get(self, docid: str) -> Doc: ...


@dataclass
class Figures:
    system: str
    rows: list[Row] = field(default_factory=list)
    by_case: dict[str, Row] = field(default_factory=dict)

    def add(self, case: str, row: Row) -> None:
        full = {"system": self.system, "case": case, **row}
        self.rows.append(full)
        self.by_case[case] = full


def _latency_row(lat: list[float], elapsed: float) -> Row:
    lat.sort()
    return {
        "ops": len(lat),
        "seconds": round(elapsed, 3),
        "ops_per_s": len(lat) / elapsed if elapsed > 0 else float("nan"),
        "p50_ms": percentile(lat, 50) * 1e3,
        "p99_ms": percentile(lat, 99) * 1e3,
    }


def measure(target: Target, items: Sequence[Item], plan: Plan) -> Figures:
    """The three phases on ``target``; every document in ``items`` exists afterwards."""
    fig = Figures(target.system)
    clock = time.perf_counter
    rng = random.Random(plan.seed + 2)  # which ids the gets read

    # Warm-up: connections, prepared statements, caches. Ids outside the data set.
    for k in range(WARMUP):
        target.upsert(f"warmup::{k}", items[k % len(items)][1])
    for k in range(WARMUP):
        target.get(f"warmup::{k}")

    # 1. single durable upserts, one at a time
    load0 = load_average()
    lat: list[float] = []
    n_single = min(plan.single, len(items))
    start = clock()
    deadline = start + plan.single_time_cap
    written = 0
    for docid, doc in items[:n_single]:
        t0 = clock()
        target.upsert(docid, doc)
        t1 = clock()
        lat.append(t1 - t0)
        written += 1
        if t1 > deadline:
            break
    fig.add("single upsert", {**_latency_row(lat, clock() - start), "load_1m": _l1(load0)})
    if written < n_single:
        log(f"{target.system}: single upserts capped at {plan.single_time_cap:.0f} s ({written})")

    # 2. batched durable upserts of all the rest
    load0 = load_average()
    rest = items[written:]
    batch_lat: list[float] = []
    start = clock()
    for i in range(0, len(rest), plan.batch):
        t0 = clock()
        target.upsert_batch(rest[i : i + plan.batch])
        batch_lat.append(clock() - t0)
    elapsed = clock() - start
    batch_lat.sort()
    fig.add(
        f"batched upsert ({plan.batch}/batch)",
        {
            "ops": len(rest),
            "seconds": round(elapsed, 3),
            "ops_per_s": len(rest) / elapsed if elapsed > 0 else float("nan"),
            "p50_ms": percentile(batch_lat, 50) * 1e3,  # per batch
            "p99_ms": percentile(batch_lat, 99) * 1e3,
            "load_1m": _l1(load0),
        },
    )

    # 3. point gets of random existing ids, checked against what was written
    load0 = load_average()
    picks = [rng.randrange(len(items)) for _ in range(plan.gets)]
    lat = []
    mismatches = 0
    start = clock()
    deadline = start + plan.get_time_cap
    for idx in picks:
        docid, want = items[idx]
        t0 = clock()
        got = target.get(docid)
        t1 = clock()
        lat.append(t1 - t0)
        if got != want:
            mismatches += 1
        if t1 > deadline:
            break
    elapsed = clock() - start
    fig.add("point get", {**_latency_row(lat, elapsed), "load_1m": _l1(load0)})
    if mismatches:
        raise RuntimeError(f"{target.system}: {mismatches} documents read back differ")
    return fig


def _l1(load: list[float] | None) -> float | None:
    return load[0] if load else None


# --- PostgreSQL --------------------------------------------------------------------------

UPSERT_SQL = (
    "INSERT INTO docs (id, body) VALUES (%s, %s) "
    "ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body"
)


class PostgresTarget:
    def __init__(self, server: PostgresServer) -> None:
        from psycopg.types.json import Jsonb, set_json_dumps, set_json_loads

        self.system = "postgresql"
        self._jsonb = Jsonb
        self.conn = server.connect(autocommit=True)  # one commit (one WAL flush) per insert
        # Same JSON codec as the shardex client, so client-side encoding costs alike.
        set_json_dumps(lambda o: msgspec.json.encode(o).decode(), self.conn)
        set_json_loads(msgspec.json.decode, self.conn)
        self.conn.execute("DROP TABLE IF EXISTS docs")
        self.conn.execute("CREATE TABLE docs (id text PRIMARY KEY, body jsonb NOT NULL)")
        self.conn.execute("CHECKPOINT")

    def upsert(self, docid: str, doc: Doc) -> None:
        self.conn.execute(UPSERT_SQL, (docid, self._jsonb(doc)))

    def upsert_batch(self, items: Sequence[Item]) -> None:
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.executemany(UPSERT_SQL, [(d, self._jsonb(doc)) for d, doc in items])

    def get(self, docid: str) -> Doc:
        row = self.conn.execute("SELECT body FROM docs WHERE id = %s", (docid,)).fetchone()
        if row is None:
            raise KeyError(docid)
        body: Doc = row[0]
        return body

    def count(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM docs").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.conn.close()


# --- shardex -----------------------------------------------------------------------------


class ShardexTarget:
    def __init__(self, cluster_dir: Path, nodes: int) -> None:
        from shardex.client import connect_local

        self.system = f"shardex {nodes} node{'s' if nodes > 1 else ''}"
        self.client: Any = connect_local(cluster_dir, name="bench-data-service")
        try:
            # one copy, like PostgreSQL's table (bench.replication measures replicas)
            self.client.create_keyspace(KEYSPACE, num_partitions=NUM_PARTITIONS, num_replicas=0)
        except BaseException:
            self.client.close()
            raise
        self.ks: Any = self.client.keyspace(KEYSPACE)

    def upsert(self, docid: str, doc: Doc) -> None:
        self.ks.upsert(docid, doc)

    def upsert_batch(self, items: Sequence[Item]) -> None:
        results = self.ks.upsert_many(items)
        errors = [r for r in results or () if isinstance(r, BaseException)]
        if errors:
            raise RuntimeError(f"upsert_many: {len(errors)} failed, first: {errors[0]!r}")

    def get(self, docid: str) -> Doc:
        doc: Doc = self.ks.get(docid)
        return doc

    def count(self) -> int:
        return int(self.client.keyspace_stats(KEYSPACE).total_docs)

    def close(self) -> None:
        self.client.close()


def shardex_missing() -> str | None:
    """What of the client API this benchmark needs is not there yet (None: all there)."""
    try:
        from shardex.client import Client, connect_local  # noqa: F401
    except ImportError as e:
        return f"shardex.client: {e}"
    missing = [m for m in ("create_keyspace", "keyspace") if not hasattr(Client, m)]
    return f"shardex.client.Client lacks {', '.join(missing)}" if missing else None


# --- machine -----------------------------------------------------------------------------


def fsync_probe(directory: Path, n: int = 200) -> dict[str, float]:
    """8 KiB write + fdatasync, n times, in ``directory``: what one durable commit costs on
    this disk at best (like pg_test_fsync)."""
    path = directory / "fsync-probe"
    lat: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        block = b"x" * 8192
        for _ in range(n):
            t0 = time.perf_counter()
            os.pwrite(fd, block, 0)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    lat.sort()
    return {
        "fdatasync_8k_p50_us": round(percentile(lat, 50) * 1e6, 1),
        "fdatasync_8k_p99_us": round(percentile(lat, 99) * 1e6, 1),
    }


# --- ratios ------------------------------------------------------------------------------

RATIO_METRICS: list[tuple[str, str, str, str]] = [
    # (metric label, case, column, kind)
    ("single upsert docs/s", "single upsert", "ops_per_s", "throughput"),
    ("single upsert p50 ms", "single upsert", "p50_ms", "latency"),
    ("batched upsert docs/s", f"batched upsert ({BATCH}/batch)", "ops_per_s", "throughput"),
    ("point get p50 ms", "point get", "p50_ms", "latency"),
    ("point get p99 ms", "point get", "p99_ms", "latency"),
]


def _verdict(ratio: float, kind: str) -> str:
    better = ratio > 1 if kind == "throughput" else ratio < 1
    return "shardex better" if better else "postgresql better"


def ratios(shardex: Figures, pg: Figures, batch: int) -> list[Row]:
    rows: list[Row] = []
    for label, case, col, kind in RATIO_METRICS:
        case = case.replace(f"({BATCH}/batch)", f"({batch}/batch)")
        s, p = shardex.by_case.get(case, {}).get(col), pg.by_case.get(case, {}).get(col)
        ratio = s / p if s is not None and p else None
        rows.append(
            {
                "system": shardex.system,
                "metric": label,
                "shardex": s,
                "postgresql": p,
                "shardex/pg": ratio,
                "reads": "" if ratio is None else _verdict(ratio, kind),
            }
        )
    return rows


# --- main --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> Plan:
    ap = argparse.ArgumentParser(
        prog="python -m bench.data_service", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--docs", type=int, help="documents (default 50000; --quick 10000)")
    ap.add_argument("--quick", action="store_true", help="small, 1 node only: under a minute")
    ap.add_argument("--nodes", type=int, action="append", help="shardex cluster sizes (1, 3)")
    ap.add_argument("--single", type=int, help="docs written one at a time")
    ap.add_argument("--gets", type=int, help="point gets")
    ap.add_argument("--no-shardex", action="store_true", help="PostgreSQL side only")
    args = ap.parse_args(argv)
    plan = Plan(**asdict(QUICK_PLAN if args.quick else DEFAULT_PLAN))
    if args.docs is not None:
        plan.docs = args.docs
    if args.single is not None:
        plan.single = args.single
    if args.gets is not None:
        plan.gets = args.gets
    if args.nodes:
        plan.nodes = args.nodes
    if args.no_shardex:
        plan.nodes = []
    if plan.docs < 1 or plan.single < 0 or plan.gets < 1:
        ap.error("--docs and --gets must be positive, --single non-negative")
    plan.single = min(plan.single, plan.docs)
    return plan


def run(plan: Plan) -> tuple[list[Row], str | None]:
    """Measure, print, write the JSON. Returns the rows and why shardex was not measured
    (None if it was, or was not asked for)."""
    t_start = time.perf_counter()
    load_start = load_average()
    log(f"plan: {plan}; load average at start {load_start}")
    items, source = make_docs(plan.docs, plan.seed)
    sizes = doc_sizes(items)
    log(f"{len(items)} documents from {source}: {sizes}")

    missing = shardex_missing() if plan.nodes else None
    if missing:
        log(f"shardex side NOT measured: {missing}")
    figures: list[Figures] = []
    extra: dict[str, Any] = {"plan": asdict(plan), "documents": {"source": source, **sizes}}
    base = Path(tempfile.mkdtemp(prefix="shardex-bench-"))
    base.chmod(0o711)  # the postgres OS user must reach its dir inside
    extra["disk"] = {"dir": str(base), "fs_type": fs_type(base), **fsync_probe(base)}
    try:
        with signals_raise():
            with PostgresServer(base_dir=base) as server:
                extra["postgresql"] = server.describe()
                pg_target = PostgresTarget(server)
                try:
                    log("measuring postgresql")
                    pg = measure(pg_target, items, plan)
                    count = pg_target.count()
                    if count != len(items) + WARMUP:
                        raise RuntimeError(f"postgresql holds {count} documents")
                finally:
                    pg_target.close()
            figures.append(pg)
            for n in [] if missing else plan.nodes:
                with shardex_cluster(base, n) as cdir:
                    try:
                        sx_target = ShardexTarget(cdir, n)
                    except ShardexError as e:
                        # Not usable yet (e.g. the node lacks the data service): say so
                        # and what failed; never a made-up figure.
                        missing = f"{n}-node cluster: create_keyspace failed: {e}"
                        log(f"shardex side NOT measured: {missing}")
                        break
                    try:
                        log(f"measuring {sx_target.system}")
                        fig = measure(sx_target, items, plan)
                        count = sx_target.count()
                        if count != len(items) + WARMUP:
                            raise RuntimeError(f"{sx_target.system} holds {count} documents")
                        figures.append(fig)
                    finally:
                        sx_target.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    rows = [r for f in figures for r in f.rows]
    ratio_rows = [r for f in figures[1:] for r in ratios(f, figures[0], plan.batch)]
    extra.update(
        {
            "shardex": {
                "durability": "persist (default: WAL synced before the ack)",
                "num_partitions": NUM_PARTITIONS,
                "fair_comparison": "1 node vs one PostgreSQL server; 3 nodes share the same "
                "2 cores and disk here, so they show overhead, not scale-out",
                "not_measured": missing,
            },
            "load_avg_start": load_start,
            "load_avg_end": load_average(),
            "ratios": ratio_rows,
        }
    )
    report(
        "data_service",
        rows,
        elapsed=time.perf_counter() - t_start,
        extra=extra,
        title=f"data service vs PostgreSQL, {len(items)} docs (load at start {load_start})",
    )
    if ratio_rows:
        title = "ratios shardex / PostgreSQL (throughput > 1, latency < 1: shardex better)"
        print_table(title, ratio_rows)
        print(
            "1 node is the fair comparison to one PostgreSQL server; 3 nodes share the same "
            f"{os.cpu_count()} CPUs and disk. Load average start {load_start}, end "
            f"{extra['load_avg_end']}: shared machine, figures are noisy."
        )
    else:
        print(f"no ratios: shardex not measured ({missing or 'no --nodes'})")
    return rows, missing


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 2 when the shardex side was asked for but could not be measured."""
    plan = parse_args(argv)
    try:
        _, missing = run(plan)
    except KeyboardInterrupt as e:
        print(f"interrupted ({e or 'SIGINT'}); servers stopped, temp dirs removed", file=sys.stderr)
        return 130
    return 2 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
