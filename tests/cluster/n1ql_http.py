"""Plain HTTP against a node's N1QL query service, as Couchbase's documentation drives it
with curl: ``curl -u USER:PW http://node:port/query/service -d 'statement=...'`` (a form
body) or ``-H 'Content-Type: application/json' -d '{"statement": ..., "args": [...]}'``."""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def codes(self) -> list[int]:
        return [e["code"] for e in self.body.get("errors", [])]


def http_port(cluster_dir: Path, node: int = 1) -> int:
    spec = json.loads((cluster_dir / "cluster.json").read_text())
    return int(spec["nodes"][node - 1]["http_port"])


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def call(
    url: str,
    *,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
    context: ssl.SSLContext | None = None,
) -> Answer:
    """One request with urllib (what ``curl`` sends); an error status is an answer too."""
    req = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60, context=context) as resp:
            return Answer(resp.status, dict(resp.headers), json.loads(resp.read()))
    except urllib.error.HTTPError as e:
        return Answer(e.code, dict(e.headers), json.loads(e.read()))


def form(url: str, auth: dict[str, str], **fields: str) -> Answer:
    """``curl -u ... URL --data-urlencode name=value ...``"""
    body = urllib.parse.urlencode(fields).encode()
    return call(url, data=body, headers=auth)


def post_json(url: str, auth: dict[str, str], params: dict[str, Any]) -> Answer:
    """``curl -u ... URL -H 'Content-Type: application/json' -d '{...}'``"""
    headers = {**auth, "Content-Type": "application/json"}
    return call(url, data=json.dumps(params).encode(), headers=headers)


def open_stream(
    port: int, auth: dict[str, str], params: dict[str, Any]
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A JSON request whose response is read as the test chooses (``read1``: what arrived)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps(params)
    conn.request(
        "POST", "/query/service", body=body, headers={**auth, "Content-Type": "application/json"}
    )
    return conn, conn.getresponse()


def post_bytes(
    port: int, auth: dict[str, str], params: dict[str, Any], close: bool = False
) -> bytes:
    """A whole JSON request as a tuned client writes it: one buffer, ``Content-Length``."""
    body = json.dumps(params).encode()
    head = (
        f"POST /query/service HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: {auth['Authorization']}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n"
    )
    return head.encode() + body


class KeepAlive:
    """One persistent connection to a node's HTTP port, written whole requests as raw bytes
    and read ``Content-Length`` responses: (head lines, body)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""

    def close(self) -> None:
        self._sock.close()

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def response(self) -> tuple[list[str], bytes]:
        while b"\r\n\r\n" not in self._buf:
            self._more()
        head, self._buf = self._buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        (length,) = [int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length")]
        while len(self._buf) < length:
            self._more()
        body, self._buf = self._buf[:length], self._buf[length:]
        return lines, body

    def post(self, auth: dict[str, str], params: dict[str, Any]) -> tuple[list[str], bytes]:
        self.send(post_bytes(self.port, auth, params))
        return self.response()

    def _more(self) -> None:
        data = self._sock.recv(65536)
        if not data:
            raise ConnectionError("the node closed the connection")
        self._buf += data
