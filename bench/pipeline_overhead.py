"""Spark's own cost per micro-batch: ``python -m bench.pipeline_overhead [--rounds N]``.

No cluster: Spark's ``rate-micro-batch`` source (100 rows per batch, JVM only, a batch as soon
as the last ended) into a ``foreachBatch`` that does nothing, ``processingTime="0 seconds"``,
on ``build_spark_session``'s settings, so every millisecond of a batch is Spark's (and
py4j's): latestOffset, planning, the offset and commit log writes, and addBatch = the Python
callback round trip. Two comparisons:

* the driver JVM's options (``JVM_VARIANTS``): each variant is a child process with its own
  JVM (options only apply at JVM start), the variants alternating, ``--rounds`` times;
* inside each child, PySpark's ``foreachBatch`` wrapper (``pyspark``) against the maintenance
  job's ``foreach_batch_id`` (``lean``, ``shardex.pipeline.batch_callback``), alternating
  queries on the same JVM;
* ``--progress``: instead of the callbacks, the lean callback with Spark's offset and commit
  logs written on the stream thread (``sync``) against asynchronous progress tracking
  (``async-0``: on Spark's own thread after every batch; ``async-1000``: at most once a
  second; ``shardex.pipeline.batch_range``), alternating queries on the same JVM, the JVM
  of ``session.py`` only.

Per (JVM, callback): the median of each Spark ``durationMs`` phase over the measured batches
(after ``--warmup`` batches per query), batches per second, and CPU per batch of the JVM
(``/proc``) and of this Python process (the callback server's side). Session start is timed
per JVM. The machine is shared: compare within a round, and CPU per batch over wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.runner import Row, load_average, print_table

JVM_VARIANTS = {
    "C1 (session.py)": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    "C1+C2 tiered": "-XX:+UseSerialGC",
}
PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
# --progress: writer options per variant (``batch_range.async_progress_options``).
PROGRESS_VARIANTS: dict[str, int | None] = {"sync": None, "async-0": 0, "async-1000": 1000}


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (clock ticks -> seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _one_query(
    spark: Any,
    lean: bool,
    warmup: int,
    seconds: float,
    ckpt: Path,
    async_ms: int | None = None,
) -> Row:
    from shardex.pipeline.batch_callback import foreach_batch_id
    from shardex.pipeline.batch_range import async_progress_options

    jvm_pid = spark.sparkContext._gateway.proc.pid
    source = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 100)
    writer = source.load().writeStream
    if lean:
        writer = foreach_batch_id(writer, lambda batch_id: None)
    else:
        writer = writer.foreachBatch(lambda df, batch_id: None)
    if async_ms is not None:
        writer = writer.options(**async_progress_options(async_ms))
    query = writer.option("checkpointLocation", str(ckpt)).trigger(processingTime="0 seconds")
    q = query.start()
    try:
        deadline = time.monotonic() + 300
        while (q.lastProgress or {}).get("batchId", -1) < warmup:
            if time.monotonic() > deadline or q.exception() is not None:
                raise RuntimeError(f"query did not warm up: {q.exception()}")
            time.sleep(0.05)
        first = q.lastProgress["batchId"]
        j0, p0, w0 = _cpu_seconds(jvm_pid), time.process_time(), time.perf_counter()
        time.sleep(seconds)
        j1, p1, w1 = _cpu_seconds(jvm_pid), time.process_time(), time.perf_counter()
        progress = [p for p in q.recentProgress if p["batchId"] > first]
    finally:
        q.stop()
    n = max(1, len(progress))
    row: Row = {"batches": len(progress), "batches/s": round(len(progress) / (w1 - w0), 1)}
    for phase in PHASES:
        vals = [float(p["durationMs"].get(phase, 0)) for p in progress]
        row[phase] = round(statistics.median(vals), 1) if vals else float("nan")
    row["JVM CPU ms/batch"] = round((j1 - j0) * 1000 / n, 1)
    row["py CPU ms/batch"] = round((p1 - p0) * 1000 / n, 2)
    return row


def child(
    java_options: str, rounds: int, warmup: int, seconds: float, out: Path, progress: bool
) -> None:
    from shardex.pipeline.session import build_spark_session

    base = Path(tempfile.mkdtemp(prefix="shardex-bench-overhead-"))
    t = time.perf_counter()
    spark = build_spark_session(
        app_name="shardex-bench-overhead",
        conf_overrides={
            "spark.driver.extraJavaOptions": java_options,
            "spark.sql.warehouse.dir": str(base / "warehouse"),
            "spark.local.dir": str(base / "tmp"),
            "spark.sql.streaming.numRecentProgressUpdates": "10000",
        },
        register_source=False,
    )
    started = time.perf_counter() - t
    rows: list[Row] = []
    try:
        for r in range(rounds):
            if progress:
                # Reversed every other round: a later query runs on a warmer JVM.
                names = list(PROGRESS_VARIANTS)[:: 1 if r % 2 == 0 else -1]
                for name in names:
                    ckpt = base / f"ckpt-{r}-{name}"
                    ms = PROGRESS_VARIANTS[name]
                    row = _one_query(spark, True, warmup, seconds, ckpt, ms)
                    rows.append({"callback": f"lean {name}", "round": r + 1, **row})
                continue
            for lean in (False, True):
                ckpt = base / f"ckpt-{r}-{int(lean)}"
                row = _one_query(spark, lean, warmup, seconds, ckpt)
                rows.append({"callback": "lean" if lean else "pyspark", "round": r + 1, **row})
    finally:
        spark.stop()
        shutil.rmtree(base, ignore_errors=True)
    out.write_text(json.dumps({"session_seconds": round(started, 1), "rows": rows}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="JVM variant alternations")
    ap.add_argument("--queries", type=int, default=2, help="callback alternations per JVM")
    ap.add_argument("--warmup", type=int, default=100, help="batches before measuring")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per query")
    ap.add_argument("--progress", action="store_true",
                    help="sync against async offset/commit logs (lean callback)")  # fmt: skip
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args.child, args.queries, args.warmup, args.seconds, args.out, args.progress)
        return 0
    rows: list[Row] = []
    jvms = dict(list(JVM_VARIANTS.items())[:1]) if args.progress else JVM_VARIANTS
    for n in range(args.rounds):
        for name, opts in jvms.items():
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                load = load_average()
                subprocess.run(
                    [sys.executable, "-m", "bench.pipeline_overhead", f"--child={opts}",
                     "--out", f.name, "--queries", str(args.queries),
                     "--warmup", str(args.warmup), "--seconds", str(args.seconds)]
                    + (["--progress"] if args.progress else []),
                    check=True,
                )  # fmt: skip
                got = json.loads(Path(f.name).read_text())
            for row in got["rows"]:
                rows.append(
                    {"jvm": name, "jvm round": n + 1, "session s": got["session_seconds"],
                     "load": load, **row}
                )  # fmt: skip
            print(json.dumps(rows[-2:]), flush=True)
    title = f"Spark's per-batch overhead, rate source, no-op sink (load {load_average()})"
    print_table(title, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
