"""The routing hint of a statement's reply over HTTP, as response headers: where the same
statement text would run with fewer hops (``shardex.client.routes``, the Python client's
rule, read from the same ``SqlStarted.details``).

- ``X-Shardex-Route-Keyspace`` and ``X-Shardex-Route-Param``: a key lookup whose one key is
  that parameter (``USE KEYS $1``, ``WHERE META().id = $1``): sent to the HTTP port of the
  key's owner, its document is read in-process there. A client finds the owner as a
  Couchbase SDK finds a key's node in its cluster map: partition ``crc32(key as UTF-8) %
  num_partitions``, the partition's active node in ``GET /api/keyspaces/NAME``, that node's
  ``http_address`` in ``GET /api/nodes``.
- ``X-Shardex-Route-Node``: the RPC address (``address`` in ``GET /api/nodes``) of the node
  where the statement runs in-process beside its one index leaf.

Only hints, per statement text: any node still answers any statement.
"""

from __future__ import annotations

from typing import Any, Final

from shardex.client.routes import Route, route_of

__all__ = ["ROUTE_KEYSPACE", "ROUTE_NODE", "ROUTE_PARAM", "headers_of", "route_headers"]

ROUTE_KEYSPACE: Final = "X-Shardex-Route-Keyspace"
ROUTE_PARAM: Final = "X-Shardex-Route-Param"
ROUTE_NODE: Final = "X-Shardex-Route-Node"


def route_headers(details: dict[str, Any], here: str) -> dict[str, str]:
    """The headers of a statement whose start reply said ``details``; ``here``: this node's
    RPC address (a statement that ran in-process here is best sent here again)."""
    return headers_of(route_of(details, here))


def headers_of(route: Route | None) -> dict[str, str]:
    """The headers of a statement's hint (``route_of``'s)."""
    if route is None:
        return {}
    if route.address is not None:
        return {ROUTE_NODE: route.address}
    assert route.keyspace is not None and route.param is not None
    return {ROUTE_KEYSPACE: route.keyspace, ROUTE_PARAM: route.param}
