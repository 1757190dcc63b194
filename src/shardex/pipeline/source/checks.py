"""What every change-range reader of the source shares: the chunk it yields, which errors a
reader resumes from, and the ROLLBACK errors its exactness checks raise.

Two readers use them: one change stream per partition (``read._stream_range``) and
one ``ReadRanges`` per owner node (``ranges.read_small_ranges``). Both must deliver
exactly (start, end] of each range on the branch the end was observed on, so the errors a
consumer sees (and ``parse_rollback`` finds) are the same whichever read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardex.api.records import Change
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.source.types import PartitionRange, rollback_error

RESUMABLE = (
    ErrorCode.NOT_MY_PARTITION,
    ErrorCode.CONNECTION_CLOSED,
    ErrorCode.NODE_UNAVAILABLE,
    ErrorCode.TIMEOUT,
)


@dataclass(slots=True)
class Chunk:
    partition: int
    uuid: int
    changes: list[Change]


def branch_changed(keyspace: str, r: PartitionRange, found: int) -> ShardexError:
    return rollback_error(
        keyspace,
        r.partition,
        r.start_seqno,
        f"partition {r.partition} of {keyspace!r} moved to branch {found} after the batch "
        f"was planned on {r.end_uuid}; the batch's end offset is not in its history",
        planned_uuid=r.end_uuid,
        current_uuid=found,
    )


def tagged_rollback(keyspace: str, r: PartitionRange, exc: ShardexError) -> ShardexError:
    """A data node's ROLLBACK refusal, tagged so it survives Spark's text-only errors."""
    rb = int(exc.details.get("rollback_seqno", 0))
    extra = {k: v for k, v in exc.details.items() if k not in ("keyspace", "partition")}
    extra.pop("rollback_seqno", None)
    return rollback_error(
        keyspace,
        r.partition,
        rb,
        f"partition {r.partition} of {keyspace!r} cannot stream from seqno {r.start_seqno} "
        f"on uuid {r.start_uuid}: roll back to {rb}",
        **extra,
    )


def history_ends_below(keyspace: str, r: PartitionRange, pos: int) -> ShardexError:
    """The owner's history ends below what the offsets promise: acknowledged writes are
    gone (e.g. a failover to a copy that lacked them). The consumer must roll back."""
    return rollback_error(
        keyspace,
        r.partition,
        pos,
        f"partition {r.partition} of {keyspace!r} ends at seqno {pos}, below the planned "
        f"end {r.end_seqno}",
        planned_end=r.end_seqno,
    )
