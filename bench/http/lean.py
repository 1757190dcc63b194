"""A lean keep-alive HTTP/1.1 client of the N1QL query service, the way an application's
tuned client holds it: a raw socket per node (TCP_NODELAY), the request's bytes built once
per statement text (head and JSON prefix; only the arguments are encoded per query),
``Content-Length`` framing (chunked responses decoded too), the answer parsed with
msgspec's JSON decoder and checked (status ``success``) before its rows are taken.

It follows the query service's routing hints (``X-Shardex-Route-*``) with a cluster map,
as a Couchbase SDK routes key operations with its: a key lookup goes to the HTTP port of
the key's owner (``crc32(key) % num_partitions``, the partition's active node from ``GET
/api/keyspaces/NAME``, its HTTP address from ``GET /api/nodes``), a statement that runs
beside its one index leaf to that node. The hints are kept per statement text in the Python
client's own ``RouteHints``. Nothing here is the server's: it speaks plain HTTP to the real
nodes, which answer every statement wherever it arrives.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from shardex.client.routes import RouteHints
from shardex.meta.partitioning import partition_of

__all__ = ["LeanClient", "LeanConnection"]

ROUTE_KEYSPACE: Final = b"x-shardex-route-keyspace"
ROUTE_PARAM: Final = b"x-shardex-route-param"
ROUTE_NODE: Final = b"x-shardex-route-node"
_decode = msgspec.json.Decoder().decode


class LeanConnection:
    """One persistent connection to one node's HTTP port."""

    def __init__(self, address: str, timeout: float) -> None:
        host, port = address.rsplit(":", 1)
        self.address = address
        self._where = (host, int(port))
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._buf = bytearray()
        self.reopened = 0

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf.clear()

    def exchange(self, request: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        """Sends ``request`` (a whole HTTP request) and reads its response: status, the
        headers (lower-case names) and the body. A connection the server closed while idle
        is opened again and the request sent once more, as keep-alive pools do."""
        fresh = self._sock is None
        if fresh:
            self._open()
        try:
            return self._exchange(request)
        except (ConnectionError, EOFError):
            if fresh:
                raise
            self.close()
            self.reopened += 1
            self._open()
            return self._exchange(request)

    def _open(self) -> None:
        sock = socket.create_connection(self._where, timeout=self._timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock

    def _exchange(self, request: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        assert self._sock is not None
        self._sock.sendall(request)
        head = self._until(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"content-length" in headers:
            body = self._exactly(int(headers[b"content-length"]))
        elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = self._chunked()
        else:
            raise ConnectionError(f"HTTP {status} without a length: {head[:200]!r}")
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return status, headers, body

    def _fill(self) -> None:
        assert self._sock is not None
        data = self._sock.recv(256 * 1024)
        if not data:
            raise EOFError("the node closed the connection")
        self._buf += data

    def _until(self, mark: bytes) -> bytes:
        while (i := self._buf.find(mark)) < 0:
            self._fill()
        out = bytes(self._buf[:i])
        del self._buf[: i + len(mark)]
        return out

    def _exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._fill()
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _chunked(self) -> bytes:
        parts = []
        while True:
            size = int(self._until(b"\r\n").split(b";", 1)[0], 16)
            if size == 0:
                self._until(b"\r\n")  # no trailers are sent: the last chunk's line end
                return b"".join(parts)
            parts.append(self._exactly(size))
            self._exactly(2)


class _Statement:
    """A statement's request bytes, made once: the JSON up to its arguments."""

    __slots__ = ("prefix",)

    def __init__(self, statement: str, consistency: str, timeout: str) -> None:
        fixed = {"statement": statement, "scan_consistency": consistency, "timeout": timeout}
        self.prefix = json.dumps(fixed)[:-1].encode() + b', "args": '


class LeanClient:
    """Statements over the lean connections, first to ``home`` (this worker's node), then
    where their routing hints say; ``route=False``: always to ``home``."""

    def __init__(
        self, addresses: Sequence[str], home: int, auth: str, timeout: float, route: bool = True
    ) -> None:
        self._addresses = list(addresses)
        self._home = self._addresses[home % len(self._addresses)]
        self._timeout = timeout
        self._route = route
        self._auth = auth.encode()
        self._conns: dict[str, LeanConnection] = {}
        self._heads: dict[str, bytes] = {}  # HTTP address -> request head up to its length
        self._statements: dict[tuple[str, str], _Statement] = {}
        self._hints = RouteHints()
        self._http_of: dict[str, str] | None = None  # RPC address -> HTTP address
        self._rpc_of_node: dict[str, str] = {}  # node name -> RPC address
        self._maps: dict[str, tuple[int, dict[int, str]]] = {}  # keyspace -> partitions
        self.sent_home = self.sent_routed = 0

    @property
    def reopened(self) -> int:
        return sum(c.reopened for c in self._conns.values())

    def close(self) -> None:
        for c in self._conns.values():
            c.close()

    def query(
        self, statement: str, args: Sequence[Any], consistency: str, timeout: str
    ) -> list[Any]:
        key = (statement, consistency)
        st = self._statements.get(key)
        if st is None:
            st = self._statements[key] = _Statement(statement, consistency, timeout)
        body = st.prefix + json.dumps(list(args)).encode() + b"}"
        where = self._target(statement, args)
        status, headers, payload = self._send(where, b"POST /query/service", body)
        if self._route:
            self._learn(statement, headers, where)
        try:
            doc = _decode(payload)
        except msgspec.DecodeError:
            raise RuntimeError(f"HTTP {status}: not JSON: {payload[:200]!r}") from None
        if status != 200 or doc.get("status") != "success":
            raise RuntimeError(f"HTTP {status}, {doc.get('status')}: {doc.get('errors')}")
        return list(doc.get("results", ()))

    def get(self, path: str) -> Any:
        """A GET of the cluster REST on this worker's node, JSON decoded."""
        status, _, payload = self._send(self._home, b"GET " + path.encode(), b"")
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}: {payload[:200]!r}")
        return _decode(payload)

    def _send(self, where: str, line: bytes, body: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        conn = self._conns.get(where)
        if conn is None:
            conn = self._conns[where] = LeanConnection(where, self._timeout)
        head = self._heads.get(where)
        if head is None:
            head = self._heads[where] = (
                b" HTTP/1.1\r\nHost: " + where.encode() + b"\r\nAuthorization: " + self._auth
                + b"\r\nContent-Type: application/json\r\nContent-Length: "
            )  # fmt: skip
        return conn.exchange(line + head + str(len(body)).encode() + b"\r\n\r\n" + body)

    # --- routing ------------------------------------------------------------------------

    def _target(self, statement: str, args: Sequence[Any]) -> str:
        route = self._hints.get(statement) if self._route else None
        if route is None:
            self.sent_home += 1
            return self._home
        rpc = route.target(list(args), self._owner)
        http = self._http_of.get(rpc) if rpc is not None and self._http_of else None
        if http is None:
            self.sent_home += 1
            return self._home
        self.sent_routed += 1
        return http

    def _learn(self, statement: str, headers: dict[bytes, bytes], sent_to: str) -> None:
        details: dict[str, Any] = {}
        if ROUTE_KEYSPACE in headers and ROUTE_PARAM in headers:
            details["route_key"] = {
                "keyspace": headers[ROUTE_KEYSPACE].decode(),
                "param": headers[ROUTE_PARAM].decode(),
            }
        elif ROUTE_NODE in headers:
            details["route"] = headers[ROUTE_NODE].decode()
        if details and self._http_of is None:
            self._load_nodes()
        self._hints.learn(statement, details, sent_to)

    def _load_nodes(self) -> None:
        nodes = self.get("/api/nodes")["nodes"]
        self._http_of = {n["address"]: n["http_address"] for n in nodes if n["http_address"]}
        self._rpc_of_node = {n["name"]: n["address"] for n in nodes}

    def _owner(self, keyspace: str, key: str) -> str | None:
        """The RPC address of the node holding ``key``'s partition active."""
        m = self._maps.get(keyspace)
        if m is None:
            d = self.get(f"/api/keyspaces/{keyspace}")
            m = self._maps[keyspace] = (
                int(d["num_partitions"]),
                {int(p): v["active"] for p, v in d["partitions"].items()},
            )
        node = m[1].get(partition_of(key, m[0]))
        return self._rpc_of_node.get(node) if node is not None else None
