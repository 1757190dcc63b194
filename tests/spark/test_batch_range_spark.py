"""``ExecutionRanges`` and asynchronous progress tracking on Spark's own ``rate-micro-batch``
source (no cluster; ``shardex.pipeline.batch_range``).

* Without async progress the range read from the query's execution context is the one in
  Spark's offset log (``offsets/<B>`` the end, ``offsets/<B-1>`` the start), batch by batch:
  the context is a faithful replacement for the log.
* Spark accepts ``foreachBatch`` with the options of ``async_progress_options``; the ranges
  are contiguous, every offset log entry it wrote names the range the batch ran with, and
  after a restart (also after a stop while the logs lagged) the first batch starts at the
  end of a batch the function already saw: never beyond, so nothing is skipped.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from shardex.pipeline.batch_callback import foreach_batch_id
from shardex.pipeline.batch_range import ExecutionRanges, async_progress_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Range = tuple[int, str | None, str]  # batch id, start JSON, end JSON


def _run(
    spark: SparkSession, checkpoint: Path, batches: int, options: dict[str, str]
) -> list[Range]:
    """Run a rate query until the function saw ``batches`` more batches; their ranges."""
    ranges = ExecutionRanges(attach_timeout=120)
    seen: list[Range] = []
    df = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
    writer = foreach_batch_id(
        df.writeStream.queryName(f"batch-range-{checkpoint.name}"),
        lambda b: seen.append((b, *ranges.raw_range(b))),
    )
    query = (
        writer.options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds")
        .start()
    )
    ranges.attach(query)
    try:
        deadline = time.monotonic() + 180
        while len(seen) < batches:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"only {len(seen)} batches"
            time.sleep(0.05)
    finally:
        query.stop()
    return list(seen)


def _logged(checkpoint: Path, log: str) -> dict[int, str]:
    """Batch id -> the log entry's last line (an offset entry's: the source's offset)."""
    out: dict[int, str] = {}
    for f in (checkpoint / log).iterdir():
        if f.name.isdigit():
            out[int(f.name)] = f.read_text().splitlines()[-1]
    return out


def _offset(text: str | None) -> int:
    return -1 if text is None else int(json.loads(text)["offset"])


def test_the_context_range_is_the_offset_log_range(spark: SparkSession, tmp_path: Path) -> None:
    checkpoint = tmp_path / "sync"
    seen = _run(spark, checkpoint, 6, {})
    logged = _logged(checkpoint, "offsets")
    assert [b for b, _, _ in seen] == list(range(len(seen)))
    for b, start, end in seen:
        assert end == logged[b]
        assert start == (logged[b - 1] if b > 0 else None)


def test_async_progress_is_accepted_and_restarts_never_skip(
    spark: SparkSession, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "async"
    runs = [
        _run(spark, checkpoint, 8, async_progress_options(0)),
        _run(spark, checkpoint, 8, async_progress_options(1000)),
        _run(spark, checkpoint, 4, async_progress_options(0)),
    ]
    ends: set[int] = {-1}  # -1: the source's initial offset
    for run in runs:
        # A restart starts at the end of a batch already seen (at most re-running some).
        assert _offset(run[0][1]) in ends, (run[0], sorted(ends))
        for (b0, _, e0), (b1, s1, _) in itertools.pairwise(run):
            assert b1 == b0 + 1 and s1 == e0  # contiguous within a run
        ends |= {_offset(e) for _, _, e in run}
    # Every offset log entry Spark wrote names the end a batch of that id ran with (the last
    # run's; a restart may re-plan an unlogged id with another range, never a logged one).
    by_id = {b: e for run in runs for b, _, e in run}
    logged = _logged(checkpoint, "offsets")
    assert logged and all(by_id[b] == e for b, e in logged.items() if b in by_id)
    # Commits only for logged batches.
    assert set(_logged(checkpoint, "commits")) <= set(logged)
