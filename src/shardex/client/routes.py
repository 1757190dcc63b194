"""Where a client sends a SQL statement it sent before: the node its plan reads.

A node that initiates a SELECT whose plan has one index leaf on another node says so in
its reply (``SqlStarted.details["route"]``: that node's address). Sent there, the same
statement runs in-process on the node holding its slices (``sql.exec.local_leaf``): no
leaf fragment, no exchange, one hop fewer. The hint is per statement text (parameters
change the rows, not where the slices are) and only a hint: a node that is gone or no
longer holds the slices still plans and answers the statement, and its reply replaces or
drops the hint.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final

__all__ = ["RouteHints"]

MAX_HINTS: Final = 1024  # statements remembered; the least recently used goes first


class RouteHints:
    def __init__(self, limit: int = MAX_HINTS) -> None:
        self._hints: OrderedDict[str, str] = OrderedDict()
        self._limit = limit

    def get(self, statement: str) -> str | None:
        address = self._hints.get(statement)
        if address is not None:
            self._hints.move_to_end(statement)
        return address

    def learn(self, statement: str, details: dict[str, Any], sent_to: str) -> None:
        """Keep the hint of a statement's reply (``sent_to`` when it ran in-process there),
        or drop the old one if it has none."""
        address = sent_to if details.get("local") else details.get("route")
        if not isinstance(address, str):
            self._hints.pop(statement, None)
            return
        self._hints[statement] = address
        self._hints.move_to_end(statement)
        if len(self._hints) > self._limit:
            self._hints.popitem(last=False)

    def drop(self, statement: str) -> None:
        self._hints.pop(statement, None)

    def __len__(self) -> int:
        return len(self._hints)
