"""Exception classes the data engine raises.

Each is a ``ShardexError`` with one of the codes of ``shardex.errors``; the subclasses only
let local callers ``except`` precisely. Over the wire only the code travels, so remote callers
test ``err.code`` (and ``details``), never the class.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shardex.errors import ErrorCode, ShardexError


class BadRequest(ShardexError):
    default_code = ErrorCode.BAD_REQUEST


class DocNotFound(ShardexError):
    default_code = ErrorCode.DOC_NOT_FOUND


class DocExists(ShardexError):
    default_code = ErrorCode.DOC_EXISTS


class DocTooLarge(ShardexError):
    default_code = ErrorCode.DOC_TOO_LARGE


class CasMismatch(ShardexError):
    default_code = ErrorCode.CAS_MISMATCH


class KeyspaceNotFound(ShardexError):
    default_code = ErrorCode.KEYSPACE_NOT_FOUND


class KeyspaceExists(ShardexError):
    default_code = ErrorCode.KEYSPACE_EXISTS


class NotMyPartition(ShardexError):
    """This node does not serve the partition (now). ``details["retryable"]`` is true when the
    partition is frozen for a hand-over: the caller backs off, refreshes its topology and
    retries (the answer becomes either "served here again" or "moved")."""

    default_code = ErrorCode.NOT_MY_PARTITION


class RollbackRequired(ShardexError):
    """The consumer's (uuid, seqno) is not in the partition's history.
    ``details["rollback_seqno"]`` is where to restart from (0 = from scratch)."""

    default_code = ErrorCode.ROLLBACK


def not_my_partition(keyspace: str, partition: int, state: str, **extra: Any) -> NotMyPartition:
    retryable = state == "frozen"
    why = {
        "frozen": "is frozen for a hand-over; retry shortly",
        "released": "was handed over to another node",
        "pending": "is being copied here and does not serve yet",
        "absent": "is not owned by this node",
    }.get(state, f"is {state}")
    return NotMyPartition(
        f"partition {partition} of keyspace {keyspace!r} {why}",
        details={
            "keyspace": keyspace,
            "partition": partition,
            "state": state,
            "retryable": retryable,
            **extra,
        },
    )


class WireError(msgspec.Struct, array_like=True, frozen=True):
    """A ``ShardexError`` as data (``ShardexError.from_wire`` rebuilds it)."""

    code: str
    message: str
    details: dict[str, Any] = {}
