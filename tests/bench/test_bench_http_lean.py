"""``bench.http``'s lean HTTP client against two local stand-in nodes: it sends the same
bytes a query service expects, reads Content-Length and chunked answers, and follows the
routing hints with a cluster map (a key lookup to its key's owner, a statement to the node
a hint names), sending to its first node where there is no hint."""

from __future__ import annotations

import http.server
import json
import threading
import zlib
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from bench.http.lean import LeanClient

PARTS = 8


class Node(http.server.BaseHTTPRequestHandler):
    """A stand-in node: the cluster map on GET, statements answered with the node's name,
    a key-lookup hint for ``USE KEYS $1``, a node hint naming node 2 for ``by_index``, and
    chunked answers for ``chunked``."""

    protocol_version = "HTTP/1.1"
    names: ClassVar[dict[int, str]] = {}  # port -> node name
    http: ClassVar[dict[str, str]] = {}  # node name -> HTTP address
    bodies: ClassVar[list[dict[str, Any]]] = []

    def _send(self, doc: Any, headers: dict[str, str], chunked: bool = False) -> None:
        out = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        for k, v in headers.items():
            self.send_header(k, v)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (out[:5], out[5:]):
                self.wfile.write(b"%x\r\n%b\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    def do_GET(self) -> None:
        assert int(self.headers["Content-Length"]) == 0
        if self.path == "/api/nodes":
            nodes = [
                {"name": n, "address": f"rpc-{n}:9000", "http_address": a}
                for n, a in sorted(self.http.items())
            ]
            self._send({"nodes": nodes}, {})
        else:
            assert self.path == "/api/keyspaces/ks"
            parts = {str(p): {"active": "n1" if p % 2 else "n2"} for p in range(PARTS)}
            self._send({"num_partitions": PARTS, "partitions": parts}, {})

    def do_POST(self) -> None:
        assert self.headers["Authorization"] == "Basic dTpw"
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Node.bodies.append(body)
        me = self.names[self.server.server_address[1]]  # type: ignore[index]
        headers = {}
        if "USE KEYS $1" in body["statement"]:
            headers = {"X-Shardex-Route-Keyspace": "ks", "X-Shardex-Route-Param": "1"}
        elif "by_index" in body["statement"]:
            headers = {"X-Shardex-Route-Node": "rpc-n2:9000"}
        doc = {"requestID": "r", "results": [{"node": me}], "status": "success"}
        self._send(doc, headers, chunked="chunked" in body["statement"])

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def nodes() -> Iterator[list[str]]:
    servers = []
    for name in ("n1", "n2"):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Node)
        port = server.server_address[1]
        Node.names[port] = name
        Node.http[name] = f"127.0.0.1:{port}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield [Node.http["n1"], Node.http["n2"]]
    for s in servers:
        s.shutdown()
        s.server_close()


def _owner(key: str) -> str:
    return "n1" if zlib.crc32(key.encode()) % PARTS % 2 else "n2"


def test_key_lookups_go_to_their_owner(nodes: list[str]) -> None:
    client = LeanClient(nodes, 0, "Basic dTpw", 30)
    st = "SELECT * FROM ks USE KEYS $1"
    keys = [f"k{i}" for i in range(20)]
    assert {_owner(k) for k in keys} == {"n1", "n2"}
    first = client.query(st, [keys[0]], "not_bounded", "5s")
    assert first == [{"node": "n1"}]  # no hint yet: its first node
    assert Node.bodies[-1] == {
        "statement": st,
        "scan_consistency": "not_bounded",
        "timeout": "5s",
        "args": [keys[0]],
    }
    got = [client.query(st, [k], "not_bounded", "5s")[0]["node"] for k in keys]
    assert got == [_owner(k) for k in keys]
    assert (client.sent_home, client.sent_routed) == (1, len(keys))
    client.close()


def test_node_hints_chunked_answers_and_no_routing(nodes: list[str]) -> None:
    client = LeanClient(nodes, 0, "Basic dTpw", 30)
    st = "SELECT x FROM ks USE INDEX (by_index) WHERE x = $1 /* chunked */"
    assert [client.query(st, [i], "request_plus", "5s") for i in range(3)] == [
        [{"node": "n1"}],
        [{"node": "n2"}],
        [{"node": "n2"}],
    ]
    plain = LeanClient(nodes, 0, "Basic dTpw", 30, route=False)
    assert plain.query("SELECT * FROM ks USE KEYS $1", ["k1"], "request_plus", "5s") == [
        {"node": "n1"}
    ]
    assert {
        plain.query("SELECT * FROM ks USE KEYS $1", [f"k{i}"], "request_plus", "5s")[0]["node"]
        for i in range(10)
    } == {"n1"}
    client.close()
    plain.close()
