"""How this node's statements ended, and how long they took: read by the node's metrics
endpoint (``shardex.node.metrics``).

A statement this node initiated is observed once, when it ends: answered within its
arrival's loop turn (a key lookup, ``_select_now``), refused before admission (bad request,
overloaded queue), or its rows' last block sent (or its stream failed, or was cancelled).
Its latency counts from its arrival for the first two and from its admission for the last
(the admission queue's wait is the ``AdmissionGate``'s own gauge). The HTTP query service
observes its requests here too, from their arrival to the envelope's end.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from shardex.errors import ErrorCode, ShardexError
from shardex.runtime.latency import Latencies

__all__ = ["OUTCOMES", "StatementStats", "outcome_of"]

OUTCOMES: Final = ("success", "error", "timeout", "cancelled", "rejected")
_TIMEOUTS: Final = frozenset({ErrorCode.TIMEOUT, ErrorCode.SCAN_TIMEOUT})


def outcome_of(error: BaseException | None) -> str:
    """``success`` for None; ``cancelled`` (the client or a DELETE stopped it), ``timeout``,
    ``rejected`` (the admission queue was full), else ``error``."""
    if error is None:
        return "success"
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, ShardexError):
        if error.code in _TIMEOUTS:
            return "timeout"
        if error.code == ErrorCode.QUERY_CANCELLED:
            return "cancelled"
        if error.code == ErrorCode.QUERY_OVERLOADED:
            return "rejected"
    return "error"


class StatementStats:
    """outcome -> latency of the statements this node initiated (module docstring)."""

    __slots__ = ("latencies",)

    def __init__(self) -> None:
        self.latencies: Latencies[str] = Latencies()

    def end(self, t0: float, error: BaseException | None = None) -> None:
        """A statement that began at ``t0`` (``perf_counter``) ended with ``error``."""
        self.latencies.observe(outcome_of(error), time.perf_counter() - t0)

    def end_as(self, t0: float, outcome: str) -> None:
        """As ``end``, with the outcome already known (one of ``OUTCOMES``)."""
        self.latencies.observe(outcome, time.perf_counter() - t0)
