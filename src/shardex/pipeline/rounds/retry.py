"""When a failed round is tried again, and after how long.

A round that failed published nothing (``machine.py``): an indexer restarted under it, a
node or the timekeeper did not answer. Those conditions heal with time (the indexer is back,
the node failed over), and the round can be delivered again as a whole (stabilise is
idempotent, re-delivered rows are dropped by seqno). Anything else (a refusal the next try
would meet again) is the batch's failure. The maintenance job retries a batch's round with
this policy (``BatchSteps.deliver_and_stabilise``); the simulator's driver retries its
rounds with it too (``tests/sim/rounds_harness.py``).
"""

from __future__ import annotations

import random

from shardex.errors import ErrorCode, ShardexError

__all__ = ["RETRYABLE", "retry_pause", "retryable"]

# Conditions a retry can outlive: an indexer restarting, a node failing over.
RETRYABLE = frozenset(
    {
        ErrorCode.STALE_DELIVERY,
        ErrorCode.NODE_UNAVAILABLE,
        ErrorCode.CONNECTION_CLOSED,
        ErrorCode.TIMEOUT,
        ErrorCode.INDEX_NOT_FOUND,
    }
)


def retryable(error: ShardexError) -> bool:
    return error.code in RETRYABLE


def retry_pause(attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (1, 2, ...): 0.1 s doubling up to
    2 s, jittered by half either way so retries of several drivers do not meet."""
    jitter = (rng or random).random()
    return min(2.0, 0.05 * 2**attempt) * (0.5 + jitter)
