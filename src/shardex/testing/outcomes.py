"""What a failed document call means for a linearizability history (``history.py``).

A fault test records each call as ``ok`` / ``fail`` / ``info``; the error a call ends with
decides between the last two. ``fail`` is a promise that the call changed nothing, so only
refusals the data service gives before it writes anything qualify; everything else (a
timeout, a lost connection, DURABILITY_AMBIGUOUS, an error we do not know) is ``info``: it may
have taken effect, now or later.
"""

from __future__ import annotations

from typing import Any

from shardex.errors import ErrorCode, ShardexError
from shardex.testing.history import CAS_MISMATCH, Status

# Refusals before anything is written: a stale topology, a failed-over node, too few copies
# reachable for a durable write.
REFUSALS = frozenset(
    {
        ErrorCode.NOT_MY_PARTITION,
        ErrorCode.NODE_FAILED_OVER,
        ErrorCode.DURABILITY_IMPOSSIBLE,
    }
)
# NODE_UNAVAILABLE is a refusal only with these reasons (a node without its serving lease);
# without a reason it may come from a connection that died after the request went out.
REFUSAL_REASONS = frozenset({"no_lease"})
# A conditional write whose condition did not hold: Replace with a stale CAS token or on a
# missing document, Insert on an existing one. Nothing was written.
MISMATCHES = frozenset({ErrorCode.CAS_MISMATCH, ErrorCode.DOC_NOT_FOUND, ErrorCode.DOC_EXISTS})


def write_outcome(exc: ShardexError, *, conditional: bool = False) -> tuple[Status, Any]:
    """(status, result) for a write that raised ``exc``. ``conditional``: a replace with a
    CAS token or an insert, recorded as ``cas``: a mismatch is then ``fail`` with
    ``CAS_MISMATCH`` (the value was not the expected one), which the checker uses."""
    if conditional and exc.code in MISMATCHES:
        return "fail", CAS_MISMATCH
    if is_refusal(exc):
        return "fail", exc.code.value
    return "info", exc.code.value


def is_refusal(exc: ShardexError) -> bool:
    """Whether ``exc`` says the call was refused before anything was written."""
    if exc.code in REFUSALS:
        return True
    return exc.code is ErrorCode.NODE_UNAVAILABLE and exc.details.get("reason") in REFUSAL_REASONS
