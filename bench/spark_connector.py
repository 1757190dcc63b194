"""The Spark connector's full read against Spark's JDBC read of PostgreSQL:
``python -m bench.spark_connector [--quick] [--docs N] [--rounds R] [--partitions P]
[--jdbc-partitions J]``.

The same documents (the demo's users, ``bench.common.dataset``; 1,000,000 by default, 50,000
with ``--quick``) in a 3-node shardex cluster (keyspace ``KEYSPACE`` of ``--partitions``, no
replica: one copy, as PostgreSQL keeps) and in a private PostgreSQL server (``docs (id text
PRIMARY KEY, body jsonb)``, loaded with COPY, VACUUM ANALYZE), both running while one
SparkSession (``local[2]``, the project's settings, PostgreSQL's JDBC driver from Debian's
``libpostgresql-jdbc-java`` on ``spark.jars``) reads them, the systems alternating round by
round (a warm-up round each first, shown but not summarised):

- ``shardex (inferred schema)``: ``spark.read.format("shardex")`` with the schema inferred
  from a sample, as a user's first read does (the sampling is inside the timed read); one
  Spark partition per data partition;
- ``shardex (given schema)``: the same with that schema passed to ``.schema(...)``;
- ``postgresql (JDBC)``: ``spark.read.jdbc`` of ``SELECT id, body::text AS body FROM docs``
  split by ``predicates`` into ``--jdbc-partitions`` contiguous ranges of the primary key
  (``id_predicates``; the text key has no numeric column for ``partitionColumn``), fetched
  ``fetchsize`` rows at a time, each body parsed with ``from_json`` into the same fields.

The measured query is the same on all three and reads every field of every row, so Spark can
prune no column: ``count(*)`` and ``sum(length(to_json(struct(<fields>))))`` over the
documents' fields (the inferred schema's, without ``_id`` and ``_deleted``). Each read must
count every document; the sum, a checksum of the values, is shown per read and equal sums say
the two systems returned the same values. Per read: the median and best seconds over the
rounds, documents/s and MB/s (of the documents' JSON Lines bytes, the same for both systems)
at the median, the ratio of its documents/s to PostgreSQL's, and the median 1-minute load
average of its rounds. PostgreSQL's plan of each partition's query (through the primary key's
index: an index scan at a few thousand documents, a bitmap heap scan at 1M) is in the JSON.
Results in ``bench/results/spark_connector.json`` (``spark_connector-quick.json`` with
``--quick``) unless ``--json``.

Wall time on 2 cores under load: ``--quick`` about 2 minutes; 1M documents 7-9 minutes
(COPY and VACUUM ~1 min, ``shardex load`` ~30 s, 12 reads of 16-60 s). Shared machine: noisy
figures.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.dataset import KEYSPACE, SEED, write_docs
from bench.common.harness import (
    bench_dir,
    bench_main,
    loaded_cluster,
    parse_plan_args,
    run_summary,
    spark_session,
)
from bench.common.phases import pg_load_docs
from bench.common.postgres import PostgresServer
from bench.common.runner import Row, load1, log

NAME = "spark_connector"
JDBC_JAR = Path("/usr/share/java/postgresql.jar")
JDBC_PACKAGE = "libpostgresql-jdbc-java"
SHARDEX_INFERRED = "shardex (inferred schema)"
SHARDEX_GIVEN = "shardex (given schema)"
POSTGRES = "postgresql (JDBC)"
READS = (SHARDEX_INFERRED, SHARDEX_GIVEN, POSTGRES)
PG_QUERY = "(SELECT id, body::text AS body FROM docs) AS d"


@dataclass
class Plan:
    docs: int = 1_000_000
    seconds: float = 0.0  # unused: a read runs to its end (the harness's common option)
    rounds: int = 3  # measured rounds per read, after one warm-up round each
    partitions: int = 64
    jdbc_partitions: int = 4
    fetch_size: int = 10_000
    load_files: int = 3


QUICK = {"docs": 50_000, "seconds": 0.0}


def jdbc_jar(path: Path = JDBC_JAR) -> Path:
    """PostgreSQL's JDBC driver, or a ``RuntimeError`` naming the package that has it."""
    if not path.is_file():
        raise RuntimeError(
            f"PostgreSQL's JDBC driver {path} not found: run scripts/bootstrap.sh, or "
            f"apt-get install -y {JDBC_PACKAGE}"
        )
    return path


def id_predicates(n_docs: int, parts: int) -> list[str]:
    """``parts`` WHERE clauses splitting ``docs`` by contiguous ranges of its primary key,
    each once: the ids are the demo's ``user-%07d``, so bounds at every ``n_docs / parts``-th
    id split them evenly (the first and last ranges are open, so any id is in one)."""
    if parts < 1:
        raise ValueError(f"--jdbc-partitions {parts}: at least 1")
    bounds = [f"'user-{k * n_docs // parts:07d}'" for k in range(1, parts)]
    if not bounds:
        return ["TRUE"]
    preds = [f"id < {bounds[0]}"]
    preds += [f"id >= {lo} AND id < {hi}" for lo, hi in itertools.pairwise(bounds)]
    return [*preds, f"id >= {bounds[-1]}"]


def round_order(round_no: int, reads: Sequence[str] = READS) -> list[str]:
    """The reads of round ``round_no`` (0 is the warm-up): reversed every other round, so no
    read always runs right after the same other one."""
    return list(reads) if round_no % 2 == 0 else list(reversed(reads))


def _read_rank(read: str) -> int:
    return READS.index(read) if read in READS else len(READS)


def summarise(rounds: Sequence[Row], n_docs: int, json_bytes: int) -> list[Row]:
    """One row per read over its measured rounds (round > 0): median and best seconds,
    documents/s and MB/s at the median, the ratio of its documents/s to PostgreSQL's; in
    ``READS``' order."""
    by: dict[str, list[Row]] = {}
    for r in rounds:
        if r["round"] > 0:
            by.setdefault(r["read"], []).append(r)
    out: list[Row] = []
    for read, rs in sorted(by.items(), key=lambda kv: _read_rank(kv[0])):
        median = statistics.median(r["seconds"] for r in rs)
        loads = [r["load1"] for r in rs if r["load1"] is not None]
        out.append({
            "read": read,
            "rounds": len(rs),
            "median_s": round(median, 2),
            "best_s": round(min(r["seconds"] for r in rs), 2),
            "docs_per_s": round(n_docs / median),
            "json_MB_per_s": round(json_bytes / median / 1e6, 1),
            "checksum": rs[0]["checksum"],
            "load1": statistics.median(loads) if loads else None,
        })  # fmt: skip
    pg = next((r["docs_per_s"] for r in out if r["read"] == POSTGRES), None)
    for r in out:
        r["vs_postgresql"] = round(r["docs_per_s"] / pg, 2) if pg else None
    return out


def fields_of(schema: Any) -> list[str]:
    """The documents' fields of a connector schema: all but ``_id`` and ``_deleted``."""
    from shardex.spark.schema import DELETED, ID

    return [f.name for f in schema.fields if f.name not in (ID, DELETED)]


def materialise(df: Any, fields: Sequence[str]) -> tuple[int, int]:
    """``count(*)`` and the summed length of every row's ``fields`` as JSON: every value of
    every row is read and converted, none pruned."""
    from pyspark.sql import functions as F

    row = (
        df.select(F.length(F.to_json(F.struct(*[F.col(f"`{f}`") for f in fields]))).alias("n"))
        .agg(F.count(F.lit(1)).alias("rows"), F.sum("n").alias("chars"))
        .collect()[0]
    )
    return int(row["rows"]), int(row["chars"] or 0)


def readers(spark: Any, cdir: Path, server: PostgresServer, plan: Plan) -> dict[str, Any]:
    """Each read as a function returning a fresh DataFrame, and the fields they select."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    def shardex(schema: Any = None) -> Any:
        r = spark.read.format("shardex").option("cluster", str(cdir)).option("keyspace", KEYSPACE)
        return (r.schema(schema) if schema is not None else r).load()

    schema = shardex().schema
    fields = fields_of(schema)
    body = StructType([f for f in schema.fields if f.name in fields])
    props = {
        "user": server.db_user,
        "driver": "org.postgresql.Driver",
        "fetchsize": str(plan.fetch_size),
    }
    url = f"jdbc:postgresql://127.0.0.1:{server.port}/{server.dbname}"
    preds = id_predicates(plan.docs, plan.jdbc_partitions)

    def postgres() -> Any:
        df = spark.read.jdbc(url, PG_QUERY, predicates=preds, properties=props)
        return df.select(F.from_json("body", body).alias("d")).select("d.*")

    return {
        "fields": fields,
        "schema": schema.simpleString(),
        "predicates": preds,
        SHARDEX_INFERRED: shardex,
        SHARDEX_GIVEN: lambda: shardex(schema),
        POSTGRES: postgres,
    }


def pg_plans(server: PostgresServer, preds: Sequence[str]) -> list[str]:
    """PostgreSQL's plan of each JDBC partition's query (as Spark words it), one line each:
    whether a range is read by the primary key or by scanning the whole table."""
    with server.connect() as conn:
        return [
            " / ".join(
                str(r[0]).strip()
                for r in conn.execute(f"EXPLAIN SELECT id, body FROM {PG_QUERY} WHERE {p}")
            )
            for p in preds
        ]


def measure(
    read: str, make: Callable[[], Any], fields: Sequence[str], round_no: int, n_docs: int
) -> Row:
    """One timed read (the DataFrame's planning included); its row count must be ``n_docs``."""
    t = time.perf_counter()
    rows, chars = materialise(make(), fields)
    seconds = time.perf_counter() - t
    if rows != n_docs:
        raise RuntimeError(f"{read} read {rows} documents, expected {n_docs}")
    log(f"round {round_no} {read}: {seconds:.1f} s ({n_docs / seconds:,.0f} docs/s)")
    return {
        "round": round_no,
        "read": read,
        "seconds": round(seconds, 2),
        "docs_per_s": round(n_docs / seconds),
        "checksum": chars,
        "load1": load1(),
    }


def run(plan: Plan) -> dict[str, Any]:
    jar = jdbc_jar()
    with bench_dir(NAME, plan) as (base, extra):
        files, json_bytes = write_docs(base, plan.docs, SEED, plan.load_files)
        extra["documents"] = {"count": plan.docs, "jsonl_bytes": json_bytes}
        with PostgresServer(base_dir=base) as server:
            with server.connect() as conn:
                pg_load_docs(conn, files, (), plan.docs)
            extra["postgresql"] = server.describe()
            with loaded_cluster(base, files, plan.docs, plan.partitions) as (cdir, _, load_s):
                log(f"shardex: {plan.docs:,} documents loaded in {load_s:.1f} s")
                conf = {"spark.jars": str(jar)}
                with spark_session(base, "shardex-bench-spark-connector", conf) as spark:
                    import shardex.spark

                    shardex.spark.register(spark)
                    make = readers(spark, cdir, server, plan)
                    extra["read"] = {
                        "schema": make["schema"],
                        "shardex_spark_partitions": plan.partitions,
                        "jdbc": {
                            "query": PG_QUERY,
                            "split": "predicates: contiguous primary key ranges",
                            "predicates": make["predicates"],
                            "plans": pg_plans(server, make["predicates"]),
                            "fetchsize": plan.fetch_size,
                            "driver": str(jar.resolve()),
                        },
                    }
                    rounds = [
                        measure(read, make[read], make["fields"], k, plan.docs)
                        for k in range(plan.rounds + 1)
                        for read in round_order(k)
                    ]
    summary_rows = summarise(rounds, plan.docs, json_bytes)
    return {
        **extra,
        "tables": {
            f"full read of {plan.docs:,} documents through Spark (local[2])": summary_rows,
            "every round (0: warm-up)": rounds,
        },
    }


def summary(out: dict[str, Any], elapsed: float) -> str:
    rows = next(iter(out["tables"].values()))
    parts = [f"{r['read']} {r['docs_per_s']:,} docs/s ({r['vs_postgresql']}x)" for r in rows]
    return "; ".join(parts) + "; " + run_summary(out, elapsed)


def more_args(ap: Any) -> None:
    ap.add_argument("--rounds", dest="rounds", type=int, help="measured rounds (default 3)")
    ap.add_argument("--partitions", dest="partitions", type=int, help="data partitions (64)")
    ap.add_argument(
        "--jdbc-partitions",
        dest="jdbc_partitions",
        type=int,
        help="Spark partitions of the JDBC read (default 4)",
    )


def parse(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    return parse_plan_args(argv, NAME, __doc__ or "", Plan, QUICK, more_args)


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse(argv)
    return bench_main(NAME, plan, path, run, summary)


if __name__ == "__main__":
    raise SystemExit(main())
