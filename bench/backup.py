"""Backup and restore against pg_dump / pg_restore: ``python -m bench.backup [--quick]
[--docs N] [--partitions P]``.

The same documents (the demo's users, ``bench.common.dataset``; 1,000,000 by default) in a
3-node shardex cluster (keyspace ``KEYSPACE``, ``--partitions``, no replica: one copy, as
PostgreSQL keeps) and in a private PostgreSQL server (``docs (id text PRIMARY KEY, body
jsonb)``, loaded with COPY), in the same run on the same machine:

- ``shardex backup create`` (a full backup: Parquet per partition + manifest) against
  ``pg_dump -Fc`` of the database;
- ``shardex backup restore --to-keyspace`` into a new keyspace of the same cluster against
  ``pg_restore`` into a new database (which also rebuilds the primary key's index; shardex
  keeps documents by docid without a separate index to build);
- an incremental ``backup create`` after 1% of the documents were updated (PostgreSQL has
  no incremental logical dump; the row is shardex's alone).

Each step runs as its command-line tool in a subprocess, start-up included. Per step:
seconds, documents/s, MB/s of the documents' JSON (the input files' bytes, the same for
both systems) and the bytes the backup or dump occupies. Shared machine: noisy figures.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.dataset import KEYSPACE, SEED, copy_files, updates, write_docs
from bench.common.harness import bench_dir, bench_main, loaded_cluster, parse_plan_args
from bench.common.local_cluster import shardex_cli
from bench.common.postgres import PostgresServer
from bench.common.runner import Row, load1, log

NAME = "backup"
RESTORED = f"{KEYSPACE}_restored"


@dataclass
class Plan:
    docs: int = 1_000_000
    seconds: float = 0.0  # unused: every step runs once (the harness's common option)
    partitions: int = 64
    load_files: int = 3
    update_fraction: float = 0.01


QUICK = {"docs": 50_000, "seconds": 0.0}


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(cmd: Sequence[str]) -> float:
    log(f"running: {' '.join(cmd)}")
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds


def row(system: str, step: str, seconds: float, docs: int, json_bytes: int, out: int) -> Row:
    return {
        "system": system,
        "step": step,
        "seconds": round(seconds, 2),
        "docs_per_s": round(docs / seconds),
        "json_MB_per_s": round(json_bytes / seconds / 1e6, 1),
        "output_MB": round(out / 1e6, 1),
        "load1": load1(),
    }


def shardex_steps(base: Path, plan: Plan, files: list[Path], json_bytes: int) -> list[Row]:
    repo = base / "repo"
    rows: list[Row] = []
    with loaded_cluster(base, files, plan.docs, plan.partitions) as (cdir, client, load_s):
        log(f"shardex: {plan.docs:,} documents loaded in {load_s:.1f} s")
        cli = [*shardex_cli(), "backup"]
        where = ["--dir", str(cdir), "--repo", str(repo), "--keyspace", KEYSPACE]
        s = timed([*cli, "create", *where])
        rows.append(row("shardex", "backup (full)", s, plan.docs, json_bytes, du(repo)))
        s = timed([*cli, "restore", *where, "--to-keyspace", RESTORED])
        restored = client.keyspace_stats(RESTORED).total_docs
        if restored != plan.docs:
            raise RuntimeError(f"restored {restored} documents, expected {plan.docs}")
        rows.append(row("shardex", "restore", s, plan.docs, json_bytes, 0))
        n = int(plan.docs * plan.update_fraction)
        changed = list(updates(n, plan.docs, SEED))
        client.keyspace(KEYSPACE).upsert_many(changed)
        before = du(repo)
        s = timed([*cli, "create", *where])
        size = sum(len(b) for _, b in changed)
        rows.append(row("shardex", f"backup (incremental, {n:,})", s, n, size, du(repo) - before))
    return rows


def postgres_steps(
    base: Path, plan: Plan, files: list[Path], json_bytes: int, extra: dict[str, Any]
) -> list[Row]:
    dump = base / "pg.dump"
    rows: list[Row] = []
    with PostgresServer(base_dir=base) as server:
        with server.connect() as conn:
            conn.execute(
                "CREATE TABLE docs (id text GENERATED ALWAYS AS (body->>'id') STORED "
                "PRIMARY KEY, body jsonb NOT NULL)"
            )
            copy_files(conn, files)
            conn.execute("VACUUM (ANALYZE) docs")
            conn.execute("CREATE DATABASE restored")
        assert server.bindir is not None and server.port is not None
        conn_args = ["-h", "127.0.0.1", "-p", str(server.port), "-U", server.db_user]
        s = timed(
            [str(server.bindir / "pg_dump"), "-Fc", *conn_args, "-f", str(dump), server.dbname]
        )
        rows.append(row("postgresql", "pg_dump -Fc", s, plan.docs, json_bytes, dump.stat().st_size))
        s = timed([str(server.bindir / "pg_restore"), *conn_args, "-d", "restored", str(dump)])
        rows.append(row("postgresql", "pg_restore", s, plan.docs, json_bytes, 0))
        with server.connect(dbname="restored") as conn:
            count = conn.execute("SELECT count(*) FROM docs").fetchone()[0]
        if count != plan.docs:
            raise RuntimeError(f"pg_restore left {count} rows, expected {plan.docs}")
        extra["postgresql"] = server.describe()
    return rows


def run(plan: Plan) -> dict[str, Any]:
    with bench_dir(NAME, plan) as (base, extra):
        files, json_bytes = write_docs(base, plan.docs, SEED, plan.load_files)
        extra["json_bytes"] = json_bytes
        rows = shardex_steps(base, plan, files, json_bytes)
        rows += postgres_steps(base, plan, files, json_bytes, extra)
    return {**extra, "tables": {f"backup and restore, {plan.docs:,} documents": rows}}


def summary(out: dict[str, Any], elapsed: float) -> str:
    rows = next(iter(out["tables"].values()))
    by = {(r["system"], r["step"]): r for r in rows}
    parts = []
    for ours, theirs in (("backup (full)", "pg_dump -Fc"), ("restore", "pg_restore")):
        a, b = by.get(("shardex", ours)), by.get(("postgresql", theirs))
        if a and b:
            parts.append(f"{ours} {a['docs_per_s']:,} docs/s vs {theirs} {b['docs_per_s']:,}")
    return "; ".join(parts) + f" ({elapsed:.0f} s in all)"


def parse(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    return parse_plan_args(
        argv,
        NAME,
        __doc__ or "",
        Plan,
        QUICK,
        lambda ap: ap.add_argument("--partitions", dest="partitions", type=int),
    )


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse(argv)
    return bench_main(NAME, plan, path, run, summary)


if __name__ == "__main__":
    raise SystemExit(main())
