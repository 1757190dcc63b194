"""Where a client sends a SQL statement it sent before.

A node answering a SELECT says in its reply (``SqlStarted.details``) where the statement
would run with fewer hops:

* ``route``: the address of the node holding the one index leaf of its plan; sent there,
  the statement runs in-process beside its slices (``sql.exec.local_leaf``);
* ``route_key``: a key lookup whose one key is a parameter (``WHERE META().id = $1``):
  the keyspace and the parameter's name; sent to the owner of the key, the document is
  read in-process (the client finds the owner in its cached topology, as its
  single-document requests do).

A key lookup's ``route_key`` also follows from the text alone (``sql.exec.analyze.key_route``,
the nodes' own rule): ``client.query`` uses it for a statement it has no hint for yet.

Hints are per statement text (parameters change the rows, not where the slices are) and
only hints: a node that is gone or no longer holds the slices still plans and answers the
statement, and its reply replaces or drops the hint.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["Route", "RouteHints"]

MAX_HINTS: Final = 1024  # statements remembered; the least recently used goes first

# (keyspace, docid) -> the owner's address from the client's cached topology, or None
OwnerOf = Callable[[str, str], "str | None"]


@dataclass(frozen=True)
class Route:
    address: str | None = None  # a node to send the statement to
    keyspace: str | None = None  # or: the owner of the key named by ``param``
    param: str | None = None

    def target(self, params: Any, owner_of: OwnerOf) -> str | None:
        """The address to send the statement with ``params`` to (None: no better one)."""
        if self.address is not None:
            return self.address
        assert self.keyspace is not None
        key = self.key(params)
        return owner_of(self.keyspace, key) if isinstance(key, str) else None

    def key(self, params: Any) -> Any:
        """The value of the key parameter in ``params`` (None: not given, or no key route)."""
        return None if self.param is None else _param(params, self.param)


def _param(params: Any, name: str) -> Any:
    if isinstance(params, list):
        i = int(name) - 1 if name.isdigit() else -1
        return params[i] if 0 <= i < len(params) else None
    if isinstance(params, dict):
        return params.get(name)
    return None


def route_of(details: dict[str, Any], sent_to: str) -> Route | None:
    """The hint of a statement's reply (``sent_to`` when it ran in-process there)."""
    by_key = details.get("route_key")
    if isinstance(by_key, dict):
        keyspace, param = by_key.get("keyspace"), by_key.get("param")
        if isinstance(keyspace, str) and isinstance(param, str):
            return Route(keyspace=keyspace, param=param)
    if details.get("local"):
        return Route(address=sent_to)
    address = details.get("route")
    return Route(address=address) if isinstance(address, str) else None


class RouteHints:
    def __init__(self, limit: int = MAX_HINTS) -> None:
        self._hints: OrderedDict[str, Route] = OrderedDict()
        self._limit = limit

    def get(self, statement: str) -> Route | None:
        route = self._hints.get(statement)
        if route is not None:
            self._hints.move_to_end(statement)
        return route

    def learn(self, statement: str, details: dict[str, Any], sent_to: str) -> Route | None:
        """Keep the hint of a statement's reply, or drop the old one if it has none."""
        route = route_of(details, sent_to)
        if route is None:
            self._hints.pop(statement, None)
            return None
        self._hints[statement] = route
        self._hints.move_to_end(statement)
        if len(self._hints) > self._limit:
            self._hints.popitem(last=False)
        return route

    def drop(self, statement: str) -> None:
        self._hints.pop(statement, None)
