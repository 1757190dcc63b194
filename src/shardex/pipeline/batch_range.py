"""Where a micro-batch's range (start, end] comes from, and Spark's offset and commit logs
off the batch's critical path.

Spark writes, per micro-batch, the offset log entry (``offsets/<B>``: the batch's end) on its
stream thread before the batch runs (``walCommit``) and the commit log entry after it
(``commitOffsets``): ~68 ms of a ~330 ms cycle at 5,000 mutations/s here. With asynchronous
progress tracking (``ASYNC_PROGRESS_OPTIONS``, Spark's ``AsyncProgressTrackingMicroBatch
Execution``) both are written on a thread of their own, and only every ``interval_ms``.

Two things change for the maintenance job, both handled here:

* ``offsets/<B>`` may not be on disk while batch B runs (or ever, with an interval): the
  range is read from the running query's execution context instead (``ExecutionRanges``:
  the start and end offsets Spark planned the batch with, the same JSON it logs).
* Spark refuses the option for ``foreachBatch`` sinks (it allows it only for sinks it knows
  to be at-least-once, because after a crash it may re-plan batch ids with other ranges and a
  ``foreachBatch`` that dedups by batch id would then drop or double data). The maintenance
  job never uses the batch id for that: slices drop key versions at or below their applied
  TS and a batch catches up (applied, start] for an index behind its start. So the check is
  overridden (Spark's own ``_asyncProgressTrackingOverrideSinkSupportCheck``); the argument
  is in ``docs/decisions/0065-async-progress-tracking-rejected.md``.

Not used by default (``MaintenanceJob.async_progress_ms = None``): in Spark 4.3 a query with
async progress over a Python data source cannot be stopped cleanly. Its cleanup commits the
sources after stopping them; the Python source runner's socket is closed by then, and the
``ClosedChannelException`` skips the query manager's ``notifyQueryTermination``, so the
query stays registered as active and no query of the same name or checkpoint starts again
in the session (reproduced with a five-line Python source, with stop() and with a failing
batch). The supervisor restarts failed queries in the same session, so this would stall the
pipeline after the first failure.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["ExecutionRanges", "async_progress_options", "logged_range", "read_offset"]


def async_progress_options(interval_ms: int) -> dict[str, str]:
    """The ``writeStream`` options that move the offset and commit logs off the stream
    thread, written at most every ``interval_ms`` (0: after every batch, still
    asynchronously)."""
    if interval_ms < 0:
        raise ValueError(f"async progress interval must be >= 0 ms, got {interval_ms}")
    return {
        "asyncProgressTrackingEnabled": "true",
        "asyncProgressTrackingCheckpointIntervalMs": str(int(interval_ms)),
        # Spark checks the sink against a list of at-least-once sinks; ours is idempotent by
        # seqno, not by batch id (module doc).
        "_asyncProgressTrackingOverrideSinkSupportCheck": "true",
    }


def read_offset(checkpoint: Path, batch_id: int) -> Timestamp | None:
    """The end offset of ``batch_id`` from Spark's offset log (``offsets/<id>``: a version
    line, a metadata line, then one line per source: ours is the TS in JSON form)."""
    path = checkpoint / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 3:
        raise ShardexError(
            f"Spark offset log entry {path} has {len(lines)} line(s), expected 3",
            code=ErrorCode.INTERNAL,
            details={"path": str(path)},
        )
    return Timestamp.from_json(json.loads(lines[2]))


def logged_range(checkpoint: Path, batch_id: int) -> tuple[Timestamp | None, Timestamp]:
    """From Spark's offset log, written before the batch ran (synchronous progress):
    ``offsets/<B>`` is the end, ``offsets/<B-1>`` the start (None for batch 0)."""
    end = read_offset(checkpoint, batch_id)
    if end is None:
        raise ShardexError(
            f"no offset log entry for batch {batch_id} under {checkpoint}",
            code=ErrorCode.INTERNAL,
            details={"checkpoint": str(checkpoint), "batch_id": batch_id},
        )
    return read_offset(checkpoint, batch_id - 1) if batch_id > 0 else None, end


class ExecutionRanges:
    """A running query's current batch range, read from its JVM execution context
    (``StreamExecution.getLatestExecutionContext``: the batch id, start and end offsets of
    the batch being run; Spark sets it before planning and keeps it until the next batch).

    ``attach`` is called with the query ``start()`` returned; a batch that runs before that
    (the query thread starts at once) waits for it in ``range``."""

    def __init__(self, attach_timeout: float = 60.0) -> None:
        self.attach_timeout = attach_timeout
        self._attached = threading.Event()
        self._execution: Any = None

    def attach(self, query: StreamingQuery) -> None:
        self._execution = query._jsq.streamingQuery()  # StreamingQueryWrapper -> execution
        self._attached.set()

    def detach(self) -> None:
        self._attached.clear()
        self._execution = None

    def range(self, batch_id: int) -> tuple[Timestamp | None, Timestamp]:
        """(start, end) of ``batch_id``, the batch running now; start is None when Spark
        plans the batch from the source's initial offset (the checkpoint's first batch)."""
        start, end = self.raw_range(batch_id)
        return (None if start is None else _ts(start)), _ts(end)

    def raw_range(self, batch_id: int) -> tuple[str | None, str]:
        """``range`` as the offsets' JSON text, as Spark logs them (any source)."""
        if not self._attached.wait(self.attach_timeout):
            raise ShardexError(
                f"batch {batch_id} ran but no query was attached within "
                f"{self.attach_timeout:.0f} s",
                code=ErrorCode.INTERNAL,
                details={"batch_id": batch_id},
            )
        ctx = self._execution.getLatestExecutionContext()
        running = int(ctx.batchId())
        if running != batch_id:
            # Spark sets the context before it plans a batch and calls foreachBatch from the
            # same stream thread: any other id means this is not the batch we think it is.
            raise ShardexError(
                f"Spark's execution context is at batch {running}, not {batch_id}",
                code=ErrorCode.INTERNAL,
                details={"batch_id": batch_id, "context_batch_id": running},
            )
        end = _only_offset(ctx.endOffsets(), batch_id, "end")
        if end is None:
            raise ShardexError(
                f"batch {batch_id} has no end offset in Spark's execution context",
                code=ErrorCode.INTERNAL,
                details={"batch_id": batch_id},
            )
        return _only_offset(ctx.startOffsets(), batch_id, "start"), end


def _only_offset(progress: Any, batch_id: int, which: str) -> str | None:
    """The one source's offset JSON in a ``StreamProgress`` (a map source -> offset)."""
    offsets = progress.baseMap()
    n = int(offsets.size())
    if n == 0:
        return None
    if n != 1:
        raise ShardexError(
            f"batch {batch_id} has {n} {which} offsets; the maintenance query reads one source",
            code=ErrorCode.INTERNAL,
            details={"batch_id": batch_id},
        )
    return str(offsets.values().head().json())


def _ts(offset_json: str) -> Timestamp:
    return Timestamp.from_json(json.loads(offset_json))
