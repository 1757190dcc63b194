"""Checks of an ``IndexScan`` before the coordinator reads anything (scan-request flow step 5): the
request's own fields (BAD_REQUEST) and whether its index can serve a scan
(INDEX_NOT_FOUND / INDEX_NOT_READY)."""

from __future__ import annotations

from typing import Any, Final

from shardex.api.scan import AT_PLUS, CONSISTENCIES, STABILITIES, IndexScan
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import ACTIVE, BUILDING, ERROR, READY, IndexRecord

__all__ = ["MAX_TIMEOUT", "check_request", "check_servable"]

MAX_TIMEOUT: Final = 600.0


def _bad(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=details)


def check_request(msg: IndexScan) -> None:
    if msg.consistency not in CONSISTENCIES:
        raise _bad(
            f"consistency must be one of {', '.join(CONSISTENCIES)}, got {msg.consistency!r}",
            value=repr(msg.consistency),
        )
    if msg.stability not in STABILITIES:
        raise _bad(
            f"stability must be one of {', '.join(STABILITIES)}, got {msg.stability!r}",
            value=repr(msg.stability),
        )
    if msg.consistency == AT_PLUS and msg.at is None:
        raise _bad("at_plus needs a timestamp (at=...)", hint="pass the writes' results")
    if msg.limit is not None and msg.limit < 0:
        raise _bad(f"limit must be >= 0, got {msg.limit}", value=msg.limit)
    if msg.offset < 0:
        raise _bad(f"offset must be >= 0, got {msg.offset}", value=msg.offset)
    if not 0 < msg.timeout <= MAX_TIMEOUT:
        raise _bad(f"timeout must be in (0, {MAX_TIMEOUT}] seconds", value=msg.timeout)


def check_servable(rec: IndexRecord | None, keyspace: str, index: str) -> IndexRecord:
    if rec is None:
        raise ShardexError(
            f"index {index!r} not found on keyspace {keyspace!r}",
            code=ErrorCode.INDEX_NOT_FOUND,
            details={"keyspace": keyspace, "index": index, "hint": "shardex index list"},
        )
    if rec.state in (READY, BUILDING, ERROR):
        why = {
            READY: "deferred: run BUILD INDEX",
            BUILDING: f"still building ({rec.progress:.0%})",
            ERROR: f"its build failed: {rec.error}",
        }[rec.state]
        raise ShardexError(
            f"index {index!r} on {keyspace!r} is {rec.state}: {why}",
            code=ErrorCode.INDEX_NOT_READY,
            details={
                "keyspace": keyspace,
                "index": index,
                "state": rec.state,
                "progress": rec.progress,
                "hint": "wait for ACTIVE (client.wait_for_index)",
            },
        )
    if rec.state != ACTIVE:  # INIT (being created) or DELETED (being dropped)
        raise ShardexError(
            f"index {index!r} on {keyspace!r} is {rec.state}",
            code=ErrorCode.INDEX_NOT_FOUND,
            details={"keyspace": keyspace, "index": index, "state": rec.state},
        )
    return rec
