"""HTTP/1.1 framing of the node's HTTP services: a request read under its caps (431, 413,
411, 408, 505), responses whole or chunked, a write that a client never takes failing
within the write timeout instead of waiting, and the N1QL envelope around the rows."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from shardex.node.http.envelope import Envelope, go_duration
from shardex.node.http.n1ql_errors import N1qlError
from shardex.node.http.query_service import request_uuid
from shardex.node.http.wire import HttpError, Limits, Response, read_request, whole_request
from shardex.sql.exec.rows import encode_row


def reader_of(data: bytes, eof: bool = True, limit: int = 16 * 1024) -> asyncio.StreamReader:
    r = asyncio.StreamReader(limit=limit)
    r.feed_data(data)
    if eof:
        r.feed_eof()
    return r


class FakeWriter:
    """What ``Response`` writes to; ``stuck``: a client that reads nothing."""

    def __init__(self, stuck: bool = False) -> None:
        self.data = bytearray()
        self.stuck = stuck

    def write(self, b: bytes) -> None:
        self.data += b

    async def drain(self) -> None:
        if self.stuck:
            await asyncio.Event().wait()


async def refused(data: bytes, limits: Limits | None = None, eof: bool = True) -> HttpError:
    with pytest.raises(HttpError) as e:
        await read_request(reader_of(data, eof), limits or Limits())
    return e.value


async def test_a_request_with_its_body_and_query() -> None:
    raw = (
        b"POST /query/service?statement=SELECT%201&x=&x=2 HTTP/1.1\r\n"
        b"Host: n\r\nContent-Type: application/json; charset=utf-8\r\n"
        b"Content-Length: 4\r\nX-A: 1\r\nx-a: 2\r\n\r\nbody"
        b"GET /admin/active_requests HTTP/1.1\r\nConnection: close\r\n\r\n"
    )
    r = reader_of(raw)
    first = await read_request(r, Limits())
    assert first is not None and (first.method, first.path) == ("POST", "/query/service")
    assert first.query == [("statement", "SELECT 1"), ("x", ""), ("x", "2")]
    assert first.body == b"body" and first.keep_alive and first.content_type == "application/json"
    assert first.headers["x-a"] == "1, 2"
    second = await read_request(r, Limits())
    assert second is not None and second.method == "GET" and not second.keep_alive
    assert second.path == "/admin/active_requests" and second.query == []
    assert await read_request(r, Limits()) is None  # the client closed between requests


async def test_targets_as_urlsplit_reads_them() -> None:
    for target, path, query in [
        ("/a/b", "/a/b", []),
        ("/a%20b?x=%31#f", "/a b", [("x", "1")]),
        ("//host/p", "/p", []),
        ("http://host/p?q", "/p", [("q", "")]),
    ]:
        req = await read_request(reader_of(f"GET {target} HTTP/1.1\r\n\r\n".encode()), Limits())
        assert req is not None and (req.path, req.query) == (path, query), target


async def test_http_1_0_keeps_alive_only_when_asked() -> None:
    one = await read_request(reader_of(b"GET / HTTP/1.0\r\n\r\n"), Limits())
    assert one is not None and not one.keep_alive
    two = await read_request(
        reader_of(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"), Limits()
    )
    assert two is not None and two.keep_alive


async def test_each_cap_has_its_status() -> None:
    big_body = b"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n"
    e = await refused(big_body, Limits(body=100), eof=False)
    assert (e.status, e.close) == (413, True) and "101" in e.message and "100" in e.message
    tall = b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 300 + b"\r\n" * 2
    assert (await refused(tall, Limits(header=200))).status == 431
    many = b"GET / HTTP/1.1\r\n" + b"X: 1\r\n" * 50 + b"\r\n"
    assert (await refused(many, Limits(header=200))).status == 431
    chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert (await refused(chunked)).status == 411
    assert (await refused(b"GET / HTTP/2.0\r\n\r\n")).status == 505
    assert (await refused(b"hello\r\n\r\n")).status == 400
    assert (await refused(b"GET / HTTP/1.1\r\nbad header\r\n\r\n")).status == 400
    assert (await refused(b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n")).status == 400
    cut = b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"
    assert (await refused(cut)).status == 400


async def test_line_ends_bare_lf_and_crlf() -> None:
    """The head in few reads keeps every line end the line-at-a-time reading took."""
    cases = {
        b"GET /a HTTP/1.1\r\n\r\n": {},
        b"GET /a HTTP/1.1\n\n": {},
        b"GET /a HTTP/1.1\nX: 1\nY: 2\n\n": {"x": "1", "y": "2"},
        b"GET /a HTTP/1.1\r\nX: 1\nY: 2\r\n\r\n": {"x": "1", "y": "2"},
        b"GET /a HTTP/1.1\r\nX: 1\n\r\n": {"x": "1"},
    }
    for raw, headers in cases.items():
        r = reader_of(raw + b"GET /b HTTP/1.1\r\n\r\n")
        req = await read_request(r, Limits())
        assert req is not None and (req.path, req.headers) == ("/a", headers), raw
        after = await read_request(r, Limits())  # nothing of the next request was taken
        assert after is not None and after.path == "/b", raw
    assert (await refused(b"GET / HTTP/1.1\r\n\rX: 1\r\n\r\n")).status == 400
    mixed = b"GET / HTTP/1.1\r\nX: 1\n\nbody\r\n\r\n"
    assert (await refused(mixed)).status == 400  # its end cannot be told from the body


async def test_a_line_past_the_stream_limit_is_431() -> None:
    with pytest.raises(HttpError) as e:
        await read_request(reader_of(b"GET /" + b"a" * 400 + b" HTTP/1.1\r\n", limit=64), Limits())
    assert e.value.status == 431


async def test_a_client_too_slow_to_send_its_request_gets_408() -> None:
    # idle between requests: the connection just ends; once a request began: 408
    assert await read_request(reader_of(b"", eof=False), Limits(idle=0.05)) is None
    e = await refused(b"GET / HTTP/1.1\r\nX: 1\r\n", Limits(read=0.05, idle=60), False)
    assert (e.status, e.close) == (408, True)
    e = await refused(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", Limits(read=0.05), False)
    assert (e.status, e.close) == (408, True)


async def test_the_idle_wait_counts_from_the_last_request_answered_on_receive() -> None:
    # Requests answered in the receive callback keep the connection busy: the reader's idle
    # wait goes on while they come, and ends once none came for the idle time.
    loop = asyncio.get_running_loop()
    r = reader_of(b"", eof=False)
    loop.call_later(0.3, r.feed_data, b"GET /metrics HTTP/1.1\r\n\r\n")
    req = await read_request(r, Limits(idle=0.05), answered=loop.time)
    assert req is not None and req.path == "/metrics"
    long_ago = await read_request(
        reader_of(b"", eof=False), Limits(idle=0.05), answered=lambda: loop.time() - 1
    )
    assert long_ago is None


def test_a_whole_request_is_read_only_when_it_is_exactly_one_plain_request() -> None:
    head = b"POST /query/service HTTP/1.1\r\nHost: n\r\nContent-Length: 4\r\n"
    one = head + b"\r\nbody"
    req = whole_request(one, Limits())
    assert req is not None and (req.method, req.path, req.body, req.keep_alive) == (
        "POST",
        "/query/service",
        b"body",
        True,
    )
    assert req.headers == {"host": "n", "content-length": "4"}
    for other in (
        one[:-1],  # a part of one
        one + one,  # two
        one + b"G",  # the next one's first byte
        head + b"Expect: 100-continue\r\n\r\nbody",
        head + b"Transfer-Encoding: chunked\r\n\r\nbody",
        head + b" bad: header\r\n\r\nbody",
        head.replace(b"\r\nHost", b"\nHost") + b"\r\nbody",  # a bare LF
        b"POST /query/service HTTP/2\r\nContent-Length: 4\r\n\r\nbody",
    ):
        assert whole_request(other, Limits()) is None, other
    assert whole_request(one, Limits(body=3)) is None  # over the body cap: read_request's 413


async def test_whole_and_chunked_responses() -> None:
    w: Any = FakeWriter()
    await Response(w, Limits(), keep_alive=True).send(404, b"{}", headers={"Allow": "GET"})
    head, body = bytes(w.data).split(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 404 Not Found" and body == b"{}"
    assert b"Content-Length: 2" in head and b"Connection: keep-alive" in head
    assert b"Allow: GET" in head
    w = FakeWriter()
    resp = Response(w, Limits(), keep_alive=False)
    await resp.start(200, b"head")
    assert resp.started and resp.status == 200
    await resp.chunk(b"hello")
    await resp.chunk(b"")  # nothing: no empty chunk, which would end the body
    await resp.end(b"!" * 17)
    _, body = bytes(w.data).split(b"\r\n\r\n", 1)
    assert body == b"4\r\nhead\r\n5\r\nhello\r\n11\r\n" + b"!" * 17 + b"\r\n0\r\n\r\n"
    assert b"Transfer-Encoding: chunked" in w.data and b"Connection: close" in w.data


async def test_a_client_that_reads_nothing_fails_the_write_in_time() -> None:
    w: Any = FakeWriter(stuck=True)
    resp = Response(w, Limits(write=0.05), keep_alive=True)
    with pytest.raises(ConnectionError, match="read nothing"):
        await resp.start(200, b"rows")


def test_go_durations() -> None:
    assert go_duration(1.5) == "1.5s"
    assert go_duration(0.0123) == "12.3ms"
    assert go_duration(0.0000421) == "42.1µs"


async def test_the_envelope_holds_one_block_back() -> None:
    w: Any = FakeWriter()
    env = Envelope(Response(w, Limits(), keep_alive=True), "rid", "ctx")
    env.statement("select", 0)
    await env.rows([encode_row({"a": 1}), encode_row({"a": 2})])
    assert not w.data  # one block: the whole answer goes out at the end, with its length
    await env.finish([], 0.002, 0.001)
    head, body = bytes(w.data).split(b"\r\n\r\n", 1)
    assert b"Content-Length: %d" % len(body) in head
    doc = json.loads(body)
    assert doc["results"] == [{"a": 1}, {"a": 2}] and doc["clientContextID"] == "ctx"
    assert doc["metrics"]["resultCount"] == 2 and doc["metrics"]["resultSize"] == 14
    w = FakeWriter()
    env = Envelope(Response(w, Limits(), keep_alive=True), "rid", None)
    env.statement("update", 3)
    for i in range(3):
        await env.rows([encode_row(i)])
        assert bool(w.data) is (i > 0)  # the head went out with the second block
    await env.finish([N1qlError(1080, "Timeout 1s exceeded", 504, "timeout")], 1.0, None)
    raw = bytes(w.data)
    assert raw.startswith(b"HTTP/1.1 200 OK") and b"Transfer-Encoding: chunked" in raw
    doc = json.loads(_unchunk(raw.split(b"\r\n\r\n", 1)[1]))
    assert doc["results"] == [0, 1, 2] and doc["status"] == "timeout"
    assert doc["metrics"]["mutationCount"] == 3 and "signature" not in doc


def _unchunk(body: bytes) -> bytes:
    out = b""
    while True:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return out
        out, body = out + rest[:n], rest[n + 2 :]


async def test_a_client_that_expects_100_continue_is_told_to_send_its_body() -> None:
    w: Any = FakeWriter()
    raw = b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok"
    req = await read_request(reader_of(raw), Limits(), w)
    assert req is not None and req.body == b"ok"
    assert bytes(w.data) == b"HTTP/1.1 100 Continue\r\n\r\n"
    w = FakeWriter()
    with pytest.raises(HttpError):  # over the cap: refused, never invited
        await read_request(reader_of(raw, eof=False), Limits(body=1), w)
    assert not w.data


async def test_the_envelope_text_of_a_success_is_json_dumps_text() -> None:
    """A success's envelope is written by hand; its text stays what json.dumps writes."""
    for ctx, metrics, kind in [
        (None, True, "select"),
        ("c", True, "update"),
        (None, False, "select"),
    ]:
        w: Any = FakeWriter()
        env = Envelope(Response(w, Limits(), keep_alive=True), "rid", ctx, metrics=metrics)
        env.statement(kind, 2)
        await env.rows([encode_row({"a": 1})])
        await env.finish([], 0.002, 0.001)
        body = bytes(w.data).split(b"\r\n\r\n", 1)[1].decode()
        head: dict[str, Any] = {"requestID": "rid"}
        if ctx is not None:
            head["clientContextID"] = ctx
        if kind == "select":
            head["signature"] = {"*": "*"}
        tail: dict[str, Any] = {"status": "success"}
        if metrics:
            m: dict[str, Any] = {"elapsedTime": "2ms", "executionTime": "1ms"}
            m |= {"resultCount": 1, "resultSize": 7}
            if kind == "update":
                m["mutationCount"] = 2
            tail["metrics"] = m
        want = json.dumps(head)[:-1] + ',\n"results": [\n{"a":1}\n],\n' + json.dumps(tail)[1:]
        assert body == want + "\n"


def test_request_ids_are_random_uuids_as_uuid4_writes_them() -> None:
    ids = {request_uuid() for _ in range(1000)}
    assert len(ids) == 1000
    for text in ids:
        u = uuid.UUID(text)
        assert (str(u), u.version, u.variant) == (text, 4, uuid.RFC_4122)
