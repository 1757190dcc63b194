"""Part 1 of ``bench.pipeline``: the initial build of two indexes vs PostgreSQL CREATE INDEX.

* Documents: ``shardex.demo.datagen`` users, written once as JSON Lines (a few part files).
* PostgreSQL (``bench/common/postgres.py``, the Debian package's server, its default
  settings): table
  ``docs(id text generated from body->>'id' primary key, body jsonb)`` loaded with COPY,
  VACUUM ANALYZE and CHECKPOINT, then the twin expression indexes (``INDEXES[*]["pg"]``)
  built one after the other, dropped, and built again concurrently (two connections, as
  BUILD INDEX builds both in one pass). Loading is not timed into the figure.
* shardex: the same files loaded with ``shardex load`` (one process per file), the two
  indexes created with ``defer_build``; the Spark floor jobs (below) run; then BUILD INDEX
  both at once, timed until both are ACTIVE (``client.wait_for_index``), and the driver's
  own job time (``BuildResult.seconds``: T0, Spark job with LoadChunk, LoadFinish, publish,
  MarkIndexActive).
* Spark's floor: the build's Spark job (snapshot read at the current TS, one task per data
  partition) with a sink that only counts: (a) read only, (b) read + the build's projection
  of both indexes, no LoadChunk. And the same snapshot read without Spark (``read_ranges``
  in this process), to split the read's cost between the data nodes and Spark.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.common.dataset import INDEX_NAMES, INDEXES, KEYSPACE, copy_files
from bench.common.postgres import PostgresServer
from bench.common.runner import Row, load1, log

COUNT_SCHEMA = "docs long, rows long"


# --- documents ---------------------------------------------------------------------------


# --- PostgreSQL --------------------------------------------------------------------------


def _create_indexes(server: PostgresServer, concurrent: bool) -> dict[str, float]:
    """Run the twin CREATE INDEX statements; seconds each and the wall time of both."""
    times: dict[str, float] = {}
    errors: list[BaseException] = []

    def one(sql: str, name: str) -> None:
        try:
            with server.connect() as conn:
                t = time.perf_counter()
                conn.execute(sql)
                times[name] = time.perf_counter() - t
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    t0 = time.perf_counter()
    if concurrent:
        threads = [threading.Thread(target=one, args=(i["pg"], i["name"])) for i in INDEXES]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    else:
        for i in INDEXES:
            one(i["pg"], i["name"])
    times["both"] = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return times


def postgres_build(base: Path, files: Sequence[Path], n: int) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    with PostgresServer(base_dir=base) as server:
        info: dict[str, Any] = {"server": server.describe()}
        with server.connect() as conn:
            conn.execute(
                "CREATE TABLE docs (id text GENERATED ALWAYS AS (body->>'id') STORED "
                "PRIMARY KEY, body jsonb NOT NULL)"
            )
            t = time.perf_counter()
            copy_files(conn, files)
            info["copy_seconds"] = round(time.perf_counter() - t, 2)
            conn.execute("VACUUM (ANALYZE) docs")
            conn.execute("CHECKPOINT")
            count = conn.execute("SELECT count(*) FROM docs").fetchone()[0]  # also warms
            if count != n:
                raise RuntimeError(f"postgresql holds {count} documents, expected {n}")
            info["table_bytes"] = conn.execute("SELECT pg_table_size('docs')").fetchone()[0]
            for key in ("maintenance_work_mem", "max_parallel_maintenance_workers", "work_mem"):
                info[key] = conn.execute(f"SHOW {key}").fetchone()[0]
            log(f"postgresql: {count} documents copied in {info['copy_seconds']} s")
            for concurrent in (False, True):
                load = load1()
                times = _create_indexes(server, concurrent)
                sizes = {
                    name: conn.execute(
                        "SELECT pg_relation_size(%s)", (f"pg_{name.removeprefix('by_')}",)
                    ).fetchone()[0]
                    for name in INDEX_NAMES
                }
                if not concurrent:
                    info["entries"] = {
                        "by_city_age": count,
                        "by_email": conn.execute(
                            "SELECT count(*) FROM docs WHERE body->>'status' = 'active'"
                        ).fetchone()[0],
                    }
                    info["index_bytes"] = sizes
                case = (
                    "CREATE INDEX x2, concurrent" if concurrent else "CREATE INDEX x2, one by one"
                )
                rows.append(
                    {
                        "system": "postgresql",
                        "case": case,
                        "docs": n,
                        "seconds": round(times["both"], 2),
                        "docs/s": round(n / times["both"]),
                        "detail": ", ".join(
                            f"{k} {v:.2f} s" for k, v in times.items() if k != "both"
                        ),
                        "load_1m": load,
                    }
                )
                for name in ("pg_city_age", "pg_email"):
                    conn.execute(f"DROP INDEX {name}")
                conn.execute("CHECKPOINT")
    return rows, info


# --- shardex: loading ----------------------------------------------------------------------


# --- shardex: Spark's floor ----------------------------------------------------------------


def count_fn() -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    schema = pa.schema([("docs", pa.int64()), ("rows", pa.int64())])

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            yield pa.RecordBatch.from_pydict({"docs": [b.num_rows], "rows": [0]}, schema=schema)

    return fn


def project_count_fn(
    definitions: Sequence[Any],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The build's mapInArrow function (``build.load_fn``) up to, not including, the
    LoadChunk sends: project every index, keep the Upserts, count them."""
    from shardex.index.keyversion import UPSERT
    from shardex.pipeline.project.projector import _columns_of, _projector_for

    defs = tuple(definitions)
    schema = pa.schema([("docs", pa.int64()), ("rows", pa.int64())])

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        projector = _projector_for(defs)
        for b in batches:
            res = projector.project_columns(*_columns_of(b), sample_limit=0)
            n = sum(1 for row in res.rows if row[2] == UPSERT)
            yield pa.RecordBatch.from_pydict({"docs": [b.num_rows], "rows": [n]}, schema=schema)

    return fn


def spark_floor(
    spark: Any, client: Any, cluster_dir: Path, definitions: Sequence[Any]
) -> list[Row]:
    """The build's Spark job with counting sinks (the read exactly as ``InitialBuild.run``)."""
    from shardex.core.timestamp import Timestamp
    from shardex.pipeline.build import ts0_json

    ts = client.high_seqnos(KEYSPACE)
    opts = {
        "cluster_dir": str(cluster_dir),
        "keyspace": KEYSPACE,
        "mode": "snapshot",
        "snapshot_ts": ts0_json(ts),
        "tasks": "owner",  # as InitialBuild.run: one read task per data node
    }
    # Warm up on two partitions: the data source's planning workers and the Python worker
    # pool start here (the build finds them warm too: the floor jobs ran first).
    two = Timestamp({p: e for p, e in sorted(ts.items())[:2]})
    warm = dict(opts, snapshot_ts=ts0_json(two))
    spark.read.format("shardex").options(**warm).load().mapInArrow(count_fn(), COUNT_SCHEMA).count()
    rows: list[Row] = [source_read(client, ts)]
    for case, fn in (
        ("Spark floor: snapshot read, count", count_fn()),
        ("Spark floor: read + project x2, count", project_count_fn(definitions)),
    ):
        load = load1()
        t = time.perf_counter()
        df = spark.read.format("shardex").options(**opts).load()
        counts = df.mapInArrow(fn, COUNT_SCHEMA).toArrow()
        seconds = time.perf_counter() - t
        docs = sum(counts["docs"].to_pylist())
        rows.append(
            {
                "system": "shardex",
                "case": case,
                "docs": docs,
                "seconds": round(seconds, 2),
                "docs/s": round(docs / seconds),
                "detail": f"{sum(counts['rows'].to_pylist())} upserts projected",
                "load_1m": load,
            }
        )
        log(f"{case}: {docs} docs in {seconds:.1f} s")
    rows.append(projected_floor(spark, opts, definitions, docs=rows[1]["docs"]))
    return rows


PROJECTED_FLOOR = "Spark floor: projected read x2 in the read task, count"


def projected_floor(spark: Any, opts: dict[str, str], definitions: Sequence[Any], docs: int) -> Row:
    """The build's job as it runs now (the source's projected mode: read and project in the
    read task) without the LoadChunk sends: Spark counts the key versions."""
    from shardex.index.keyversion import UPSERT
    from shardex.pipeline.source.projected import ProjectSpec

    load = load1()
    t = time.perf_counter()
    df = (
        spark.read.format("shardex")
        .options(**opts, project=ProjectSpec.definitions_option(definitions))
        .load()
    )
    upserts = df.where(df.kind == UPSERT).count()
    seconds = time.perf_counter() - t
    log(f"{PROJECTED_FLOOR}: {docs} docs in {seconds:.1f} s")
    return {
        "system": "shardex",
        "case": PROJECTED_FLOOR,
        "docs": docs,
        "seconds": round(seconds, 2),
        "docs/s": round(docs / seconds),
        "detail": f"{upserts} upserts projected",
        "load_1m": load,
    }


def source_read(client: Any, ts: Any) -> Row:
    """The same snapshot read without Spark: ``read_ranges`` in this process, every data
    partition (what the data nodes and the source's reader deliver on their own)."""
    from shardex.core.timestamp import Timestamp
    from shardex.pipeline.source.plan import plan_ranges
    from shardex.pipeline.source.read import read_ranges

    load = load1()
    t = time.perf_counter()
    docs = 0
    for batch in read_ranges(
        client, KEYSPACE, plan_ranges(KEYSPACE, Timestamp({}), ts), snapshot=True
    ):
        docs += batch.num_rows
    seconds = time.perf_counter() - t
    log(f"snapshot read without Spark: {docs} docs in {seconds:.1f} s")
    return {
        "system": "shardex",
        "case": "snapshot read, no Spark (read_ranges)",
        "docs": docs,
        "seconds": round(seconds, 2),
        "docs/s": round(docs / seconds),
        "detail": "in the driver process, one thread",
        "load_1m": load,
    }


# --- shardex: the build ----------------------------------------------------------------------
