"""Where a micro-batch's range (start, end] comes from: Spark's offset log.

Spark writes, per micro-batch, the offset log entry (``offsets/<B>``: the batch's end) on its
stream thread before the batch runs (``walCommit``), so ``foreachBatch`` reads the batch's
range from it: ``offsets/<B>`` is the end, ``offsets/<B-1>`` the start. Writing the logs
asynchronously instead (Spark's asynchronous progress tracking) was measured and not taken:
in Spark 4.3 a query with async progress over a Python data source cannot be stopped
cleanly, so the supervisor could never restart it
(``docs/decisions/0065-async-progress-tracking-rejected.md``).
"""

from __future__ import annotations

import json
from pathlib import Path

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError

__all__ = ["logged_range", "read_offset"]


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
    """From Spark's offset log, written before the batch ran: ``offsets/<B>`` is the end,
    ``offsets/<B-1>`` the start (None for batch 0)."""
    end = read_offset(checkpoint, batch_id)
    if end is None:
        raise ShardexError(
            f"no offset log entry for batch {batch_id} under {checkpoint}",
            code=ErrorCode.INTERNAL,
            details={"checkpoint": str(checkpoint), "batch_id": batch_id},
        )
    return read_offset(checkpoint, batch_id - 1) if batch_id > 0 else None, end
