"""The skeleton the end-to-end benchmarks share (``bench.scan``, ``bench.sql``,
``bench.pipeline``): a temp dir PostgreSQL can reach, removed at the end also on Ctrl-C and
SIGTERM; a 3-node cluster loaded with the documents; a Spark session (and pipeline driver)
stopped at the end; the command line of a "--quick/--docs/--seconds/--json" benchmark; and
``main``: run, print the tables and a summary line, write the JSON."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common.dataset import KEYSPACE
from bench.common.driver import BatchLog, InProcessDriver
from bench.common.local_cluster import shardex_cluster
from bench.common.postgres import signals_raise
from bench.common.runner import RESULTS_DIR, fs_type, load_average, machine_info, print_table

DRIVER_POLL = 0.3  # the supervisor's poll (s); the e2e tests use the same
# The slowest load taken for progress rather than a hang (documents/s, over 3 loaders on a
# shared 2-core machine), and the least time any load gets.
MIN_LOAD_RATE = 1000.0
MIN_LOAD_SECONDS = 600.0


def load_timeout(n_docs: int) -> float:
    """Seconds a load of ``n_docs`` may take before it counts as stuck: 1M documents, 1000 s."""
    return max(MIN_LOAD_SECONDS, n_docs / MIN_LOAD_RATE)


@contextlib.contextmanager
def bench_dir(
    name: str, plan: Any, cleanup: Callable[[], None] | None = None
) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A fresh temp dir and the run's ``extra`` (plan, load average, disk), signals raising
    ``KeyboardInterrupt`` inside; at the end ``cleanup`` then the dir's removal, and on a
    normal exit ``extra["load_avg_end"]``."""
    extra: dict[str, Any] = {"plan": asdict(plan), "load_avg_start": load_average()}
    base = Path(tempfile.mkdtemp(prefix=f"shardex-bench-{name}-"))
    base.chmod(0o711)  # the postgres OS user must reach its dir inside
    extra["disk"] = {"dir": str(base), "fs_type": fs_type(base)}
    try:
        with signals_raise():
            yield base, extra
    finally:
        if cleanup is not None:
            cleanup()
        shutil.rmtree(base, ignore_errors=True)
    extra["load_avg_end"] = load_average()


def load_keyspace(
    client: Any,
    cluster_dir: Path,
    base: Path,
    keyspace: str,
    files: Sequence[Path],
    n_docs: int,
    partitions: int,
    replicas: int = 0,
) -> float:
    """``keyspace`` of ``partitions`` created and loaded from ``files`` (``shardex load``,
    progress lines, checked to hold ``n_docs``); the load's seconds."""
    from bench.common.dataset import shardex_load
    from shardex.errors import ShardexError

    client.create_keyspace(keyspace, num_partitions=partitions, num_replicas=replicas)

    def progress() -> str:
        try:
            held = client.keyspace_stats(keyspace).total_docs
        except ShardexError as e:  # a busy node: the next line will say
            return f"documents unknown ({e.code})"
        return f"{held:,} of {n_docs:,} {keyspace} documents"

    load_s = shardex_load(
        cluster_dir, files, base, timeout=load_timeout(n_docs), progress=progress,
        keyspace=keyspace,
    )  # fmt: skip
    total = client.keyspace_stats(keyspace).total_docs
    if total != n_docs:
        raise RuntimeError(f"shardex holds {total} {keyspace} documents, expected {n_docs}")
    return load_s


@contextlib.contextmanager
def loaded_cluster(
    base: Path, files: Sequence[Path], n_docs: int, partitions: int, replicas: int = 0
) -> Iterator[tuple[Path, Any, float]]:
    """A 3-node cluster with ``KEYSPACE`` of ``partitions`` loaded from ``files`` (checked
    to hold ``n_docs``): its dir, a client, and the load's seconds. ``replicas``: 0 by
    default, one copy of each document as PostgreSQL keeps (and as these benchmarks always
    measured); ``bench.replication`` measures what replicas cost."""
    from shardex.client import connect_local

    with shardex_cluster(base, 3) as cdir, connect_local(cdir) as client:
        load_s = load_keyspace(client, cdir, base, KEYSPACE, files, n_docs, partitions, replicas)
        yield cdir, client, load_s


@contextlib.contextmanager
def spark_session(
    base: Path, app_name: str, conf: Mapping[str, Any] | None = None
) -> Iterator[Any]:
    """A SparkSession with its warehouse and scratch dirs under ``base`` and ``conf`` (say,
    ``spark.jars``) over the project's settings; stopped at the end."""
    from shardex.pipeline.session import build_spark_session

    spark = build_spark_session(
        app_name=app_name,
        conf_overrides={
            "spark.sql.warehouse.dir": str(base / "spark-warehouse"),
            "spark.local.dir": str(base / "spark-tmp"),
            **(conf or {}),
        },
    )
    try:
        yield spark
    finally:
        spark.stop()


@contextlib.contextmanager
def spark_driver(base: Path, cluster_dir: Path, app_name: str) -> Iterator[InProcessDriver]:
    """A pipeline driver in this process on its own SparkSession; both stopped at the end."""
    with spark_session(base, app_name) as spark:
        driver = None
        try:
            driver = InProcessDriver(
                spark, cluster_dir, base / "checkpoints", BatchLog(), DRIVER_POLL
            )
            yield driver
        finally:
            if driver is not None:
                driver.stop()


def parse_plan_args(
    argv: Sequence[str] | None,
    name: str,
    doc: str,
    plan_type: Any,
    quick: dict[str, Any],
    more: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[Any, Path]:
    """``--quick``, ``--docs``, ``--seconds`` and ``--json`` into a ``plan_type`` (fields
    ``docs``, ``seconds``) and the JSON path (``bench/results/NAME[-quick].json``).
    ``more`` adds a benchmark's own options, each named as a plan field (``dest``): a value
    given (not None) replaces the plan's."""
    default_plan = plan_type()
    ap = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc.split("\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"{quick['docs'] // 1000}k docs, {quick['seconds']:g} s per measurement",
    )
    ap.add_argument("--docs", type=int, help=f"documents (default {default_plan.docs:,})")
    ap.add_argument(
        "--seconds",
        type=float,
        help=f"seconds per measurement (default {default_plan.seconds:g})",
    )
    ap.add_argument("--json", type=Path, help="where to write the JSON")
    common = {a.dest for a in ap._actions}
    if more is not None:
        more(ap)
    args = ap.parse_args(argv)
    plan = plan_type(**quick) if args.quick else default_plan
    if args.docs is not None:
        plan.docs = args.docs
    if args.seconds is not None:
        plan.seconds = args.seconds
    for dest, value in vars(args).items():
        if dest not in common and value is not None:
            setattr(plan, dest, value)
    default = f"{name}-quick.json" if args.quick else f"{name}.json"
    return plan, args.json or RESULTS_DIR / default


def run_summary(out: dict[str, Any], elapsed: float) -> str:
    """The end of a benchmark's summary line: the load it ran under and its wall time."""
    return (
        f"load average start {out['load_avg_start']}, end {out['load_avg_end']}; "
        f"{elapsed:.0f} s. Shared machine: noisy figures."
    )


def bench_main(
    name: str,
    plan: Any,
    path: Path,
    run: Callable[[Any], dict[str, Any]],
    summary: Callable[[dict[str, Any], float], str],
    load_label: str = "load at end",
) -> int:
    """``run(plan)``; its tables (titled with the end load average), ``summary(out,
    elapsed)``, and ``{"name", "machine", "elapsed", **out}`` as JSON at ``path``. 130 on
    Ctrl-C/SIGTERM (everything already stopped by then)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    t = time.perf_counter()
    try:
        out = run(plan)
    except KeyboardInterrupt as e:
        print(
            f"interrupted ({e or 'SIGINT'}); cluster, Spark and PostgreSQL stopped", file=sys.stderr
        )
        return 130
    elapsed = time.perf_counter() - t
    load = out["load_avg_end"]
    for title, rows in out["tables"].items():
        if rows:
            print_table(f"{title} ({load_label} {load[0]:.1f})" if load else title, rows)
    print(summary(out, elapsed))
    doc = {"name": name, "machine": machine_info(), "elapsed": elapsed, **out}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0
