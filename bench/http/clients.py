"""The wires of ``bench.http`` in one client process: the Python client (``c.query``,
``bench.sql``'s runner) and the N1QL query service (``POST /query/service``) through
``lean.py``'s keep-alive client (a raw socket per node, request bytes built once per
statement, the routing hints followed with a cluster map, as a tuned application's client
would); with ``--ab`` also through the standard library's ``http.client`` on one
connection to the worker's node, hints ignored (``HTTP_PLAIN``: the generic client). A
worker ``k`` starts on node ``k mod 3`` on every wire; the Python client and the lean HTTP
client then follow their hints, the plain one stays.

The request is Couchbase's JSON form (``statement``, positional ``args``,
``scan_consistency``, ``timeout``) with basic auth; the whole response is read and parsed,
as a client must before it has its rows.
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.http.lean import LeanClient
from bench.sql.clients import QUERY_TIMEOUT, Runner, Target, Variant
from bench.sql.queries import Query

# the measurement rows' system per wire
CLIENT, HTTP, HTTP_PLAIN = "shardex", "shardex http", "shardex http plain"
# A connection the server closed while idle is reopened and the request sent again once,
# as keep-alive pools do; anything else is the query's error.
STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass
class WireVariant(Variant):
    """A ``Variant`` over one wire: ``CLIENT`` or ``HTTP``."""

    wire: str = CLIENT

    def columns(self) -> dict[str, str]:
        return {"system": self.wire, **super().columns()}


@dataclass
class HttpTarget(Target):
    """A shardex ``Target`` (logged in as a user) with every node's HTTP address."""

    http_addresses: list[str] = field(default_factory=list)


def http_target(cluster_dir: Any) -> HttpTarget:
    """The local cluster's nodes on both wires, as its admin user."""
    from bench.common.clients import shardex_target
    from shardex.meta import cluster_dir as cdir

    rpc = shardex_target(cluster_dir, as_user=True)
    if not rpc.username:
        raise RuntimeError(f"{cluster_dir}: no admin password to log in over HTTP with")
    nodes = cdir.load(cluster_dir).nodes
    return HttpTarget(
        "shardex",
        addresses=rpc.addresses,
        username=rpc.username,
        password=rpc.password,
        http_addresses=[f"{n.address.rsplit(':', 1)[0]}:{n.http_port}" for n in nodes],
    )


def basic_auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def request_body(statement: str, params: Sequence[Any], consistency: str) -> bytes:
    """The JSON request of one statement (the server's default timeout is 60 s: the
    benchmark's is longer, like the client's)."""
    body = {
        "statement": statement,
        "args": list(params),
        "scan_consistency": consistency,
        "timeout": f"{QUERY_TIMEOUT:g}s",
    }
    return json.dumps(body).encode()


def results(status: int, payload: bytes) -> list[Any]:
    """The rows of a response, or a ``RuntimeError`` with its HTTP status and errors."""
    try:
        doc = json.loads(payload)
    except ValueError:
        raise RuntimeError(f"HTTP {status}: not JSON: {payload[:200]!r}") from None
    if status != 200 or doc.get("status") != "success":
        raise RuntimeError(f"HTTP {status}, {doc.get('status')}: {doc.get('errors')}")
    return list(doc.get("results", []))


class WireRunner(Runner):
    """``Runner`` over either wire: ``rows(q, variant)`` takes the variant's."""

    NAME = "bench-http"

    def __init__(self, target: HttpTarget, k: int = 0) -> None:
        super().__init__(target, k)
        host, port = target.http_addresses[k % len(target.http_addresses)].rsplit(":", 1)
        self.http = http.client.HTTPConnection(host, int(port), timeout=QUERY_TIMEOUT)
        auth = basic_auth(target.username, target.password)
        self.headers = {"Authorization": auth, "Content-Type": "application/json"}
        self.lean = LeanClient(target.http_addresses, k, auth, QUERY_TIMEOUT)
        self.plain_reopened = 0

    @property
    def reopened(self) -> int:
        """Idle connections the server had closed, opened again (both HTTP clients)."""
        return self.plain_reopened + self.lean.reopened

    def rows(self, q: Query, variant: Variant) -> list[Any]:
        wire = getattr(variant, "wire", CLIENT)
        if wire == HTTP:
            return self.lean.query(
                self.SX[q.case], q.params, variant.consistency, f"{QUERY_TIMEOUT:g}s"
            )
        if wire != HTTP_PLAIN:
            return super().rows(q, variant)
        body = request_body(self.SX[q.case], q.params, variant.consistency)
        try:
            return self._post(body)
        except STALE:
            self.http.close()
            self.plain_reopened += 1
            return self._post(body)

    def _post(self, body: bytes) -> list[Any]:
        self.http.request("POST", "/query/service", body=body, headers=self.headers)
        resp = self.http.getresponse()
        return results(resp.status, resp.read())

    def close(self) -> None:
        self.http.close()
        self.lean.close()
        super().close()
