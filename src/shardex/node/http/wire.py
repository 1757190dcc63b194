"""HTTP/1.1 on asyncio streams: one request read under size caps and deadlines, one response
written whole or in chunks (``Transfer-Encoding: chunked``) with backpressure.

Only what the node's HTTP services need: requests with a ``Content-Length`` body (a chunked
request body is refused with 411), persistent connections, responses of a known length or
chunked. Every limit answers with its own status before the connection is closed: 413 for a
body over ``Limits.body``, 431 for headers over ``Limits.header``, 408 for a client too slow
to send its request. A write waits for the socket's buffer to drain below the transport's
high-water mark for at most ``Limits.write`` seconds (a slow or dead client never holds a
statement's rows or the event loop: the request fails and its statement is stopped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import urllib.parse
from collections.abc import Callable
from typing import Final

__all__ = [
    "HttpError",
    "Limits",
    "Request",
    "Response",
    "read_request",
    "response_head",
    "whole_request",
]

REASONS: Final = {
    200: "OK",
    201: "Created",
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


@dataclasses.dataclass(frozen=True)
class Limits:
    header: int = 16 * 1024  # request line and headers together, bytes
    body: int = 4 * 1024 * 1024  # a statement is at most 1 MiB; its arguments get the rest
    read: float = 30.0  # seconds to receive a whole request once its first byte arrived
    idle: float = 60.0  # seconds a persistent connection may wait for its next request
    write: float = 30.0  # seconds one write may wait for the client to read


# A target without a query, an escape or a fragment: its path as it is.
_PLAIN_PATH: Final = re.compile(r"[^?%#]*")


class HttpError(Exception):
    """A request that cannot be served: answered with ``status`` and ``message``, then the
    connection is closed when ``close`` (what is left of the request was not read)."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close


@dataclasses.dataclass
class Request:
    method: str
    path: str
    query: list[tuple[str, str]]  # the target's query string, in order, duplicates kept
    headers: dict[str, str]  # lower-case names; a repeated header's values joined by ", "
    body: bytes
    keep_alive: bool

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def read_request(
    reader: asyncio.StreamReader,
    limits: Limits,
    writer: asyncio.StreamWriter | None = None,
    answered: Callable[[], float] | None = None,
) -> Request | None:
    """The next request on the connection; None when the client closed it (or stayed idle
    past ``limits.idle``) between requests. ``writer``: where "100 Continue" goes to a client
    that waits for it before its body (curl does, for a body over 1 KiB, for a second).
    ``answered``: the loop time of the last request answered without this reader (in the
    connection's receive callback): the idle wait counts from it."""
    # asyncio.timeout, not wait_for, here and below: 3.11's wait_for can lose a cancel that
    # arrives as the read completes, and the node's stop cancels these reads. One deadline,
    # moved from the idle wait to the request's once its first line is in (arming a
    # deadline costs about as much as reading a small request's head).
    loop = asyncio.get_running_loop()
    idle = limits.idle
    while True:
        reading = False
        try:
            async with asyncio.timeout(idle) as deadline:
                try:
                    first = await reader.readuntil(b"\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return None
                except asyncio.LimitOverrunError:
                    raise HttpError(431, "request line too long", close=True) from None
                reading = True
                deadline.reschedule(loop.time() + limits.read)
                return await _rest(reader, first, limits, writer)
        except TimeoutError:
            if reading:
                raise HttpError(
                    408, f"request not received within {limits.read:g} s", close=True
                ) from None
            # requests answered meanwhile in the receive callback kept the connection busy
            idle = limits.idle - (loop.time() - answered()) if answered is not None else 0.0
            if idle <= 0:
                return None
        except asyncio.IncompleteReadError:
            raise HttpError(400, "connection closed mid-request", close=True) from None


async def _rest(
    reader: asyncio.StreamReader,
    first: bytes,
    limits: Limits,
    writer: asyncio.StreamWriter | None,
) -> Request:
    parts = first.decode("latin-1").strip().split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        if len(parts) == 3 and parts[2].startswith("HTTP/"):
            raise HttpError(505, f"{parts[2]} is not served: use HTTP/1.1", close=True)
        raise HttpError(400, "malformed request line", close=True)
    method, target, version = parts
    if first.endswith(b"\r\n"):
        lines = await _head_whole(reader, len(first), limits)
    else:
        lines = await _head_by_line(reader, len(first), limits)
    headers = _headers(lines)
    length = _body_length(headers, limits)
    if length and writer is not None and headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = await reader.readexactly(length) if length else b""
    return _request(method, target, version, headers, body)


def whole_request(data: bytes, limits: Limits) -> Request | None:
    """``data`` as a request when it is exactly one whole, well-formed request with CRLF
    line ends, a ``Content-Length`` body (or none) and no ``Expect``; None for anything else
    (a part of one, more than one, a malformed one: ``read_request`` then reads it and
    answers its errors). For a connection's receive callback: no reader, no await."""
    end = data.find(b"\r\n\r\n")
    if end < 0 or len(data) - end - 4 > limits.body or end + 4 > limits.header:
        return None
    head = data[:end].decode("latin-1")
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    # a bare LF anywhere: each LF of the head is a CRLF's
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or head.count("\n") >= len(lines):
        return None
    try:
        headers = _headers(lines[1:])
        length = _body_length(headers, limits)
    except HttpError:
        return None
    if end + 4 + length != len(data) or "expect" in headers:
        return None
    return _request(parts[0], parts[1], parts[2], headers, data[end + 4 :])


def _headers(lines: list[str]) -> dict[str, str]:
    """The header lines as a dict (lower-case names, a repeated header's values joined)."""
    headers: dict[str, str] = {}
    for text in lines:
        name, sep, value = text.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, f"malformed header line {text[:80]!r}", close=True)
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers


def _body_length(headers: dict[str, str], limits: Limits) -> int:
    """The body's length the headers give, checked against ``limits.body``."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HttpError(411, "send the body with a Content-Length", close=True)
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit():
        raise HttpError(400, f"bad Content-Length {length_text[:40]!r}", close=True)
    length = int(length_text)
    if length > limits.body:
        raise HttpError(
            413, f"request body of {length} bytes is over the limit of {limits.body}", close=True
        )
    return length


def _request(
    method: str, target: str, version: str, headers: dict[str, str], body: bytes
) -> Request:
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    if target[:1] == "/" and target[:2] != "//" and _PLAIN_PATH.fullmatch(target):
        path, query = target, []  # a plain path (/query/service): nothing to split or decode
    else:
        url = urllib.parse.urlsplit(target)
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qsl(url.query, keep_blank_values=True)
    return Request(
        method=method.upper(),
        path=path,
        query=query,
        headers=headers,
        body=body,
        keep_alive=keep,
    )


async def _head_whole(reader: asyncio.StreamReader, size: int, limits: Limits) -> list[str]:
    """The header lines of a client that ended its request line with CRLF, in two reads
    (one line at a time costs a read per header, the most of a small request's parsing):
    its first byte, which starts the head's end when there are no headers, then up to the
    head's end, a CRLF after a line's LF. A header line ended by a bare LF is taken; a head
    ended by a bare LF after a CRLF request line is 400 (its end cannot be told from the
    body's bytes), or 408 when no CRLF follows."""
    lead = await reader.readexactly(1)
    if lead == b"\n":
        return []
    if lead == b"\r":  # "\r\n" ends the head; anything else is a malformed header line
        return await _head_by_line(reader, size, limits, lead)
    try:
        rest = await reader.readuntil(b"\n\r\n")
    except asyncio.LimitOverrunError:
        raise HttpError(431, f"request headers over {limits.header} bytes", close=True) from None
    if size + 1 + len(rest) > limits.header:
        raise HttpError(431, f"request headers over {limits.header} bytes", close=True)
    lines = [line.rstrip("\r") for line in (lead + rest).decode("latin-1").split("\n")]
    # the last two: the empty line that ends the head and what follows its LF (nothing)
    out = lines[:-2]
    if not all(out):
        raise HttpError(400, "a head ended by a bare LF after a CRLF request line", close=True)
    return out


async def _head_by_line(
    reader: asyncio.StreamReader, size: int, limits: Limits, lead: bytes = b""
) -> list[str]:
    """The header lines of a client that ends its lines with a bare LF, one read each;
    ``lead``: the first line's bytes already read."""
    out = []
    while True:
        try:
            line = lead + await reader.readuntil(b"\n")
            lead = b""
        except asyncio.LimitOverrunError:
            raise HttpError(431, "header line too long", close=True) from None
        size += len(line)
        if size > limits.header:
            raise HttpError(431, f"request headers over {limits.header} bytes", close=True)
        text = line.decode("latin-1").rstrip("\r\n")
        if not text:
            return out
        out.append(text)


class Response:
    """One response on ``writer``: ``send`` a whole body, or ``start`` then ``chunk`` ... and
    ``end`` a chunked one. Each write waits for the client within ``limits.write``."""

    def __init__(self, writer: asyncio.StreamWriter, limits: Limits, keep_alive: bool) -> None:
        self._writer = writer
        # None for a writer without one (a test's): every drain then waits under the timeout
        self._transport: asyncio.WriteTransport | None = getattr(writer, "transport", None)
        self._limits = limits
        self.keep_alive = keep_alive
        self.started = False  # the head is out: the status can no longer change
        self.status = 0

    def _head(
        self, status: int, content_type: str, extra: dict[str, str], length: int | None
    ) -> bytes:
        self.started, self.status = True, status
        return response_head(status, content_type, extra, length, self.keep_alive)

    async def send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self._writer.write(self._head(status, content_type, headers or {}, len(body)) + body)
        await self._drain()

    async def start(
        self,
        status: int,
        first: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        """The head of a chunked response and its first chunk, in one write."""
        head = self._head(status, content_type, headers or {}, None)
        self._writer.write(head + _chunk(first))
        await self._drain()

    async def chunk(self, data: bytes) -> None:
        if data:
            self._writer.write(_chunk(data))
            await self._drain()

    async def end(self, data: bytes = b"") -> None:
        self._writer.write(_chunk(data) + b"0\r\n\r\n")
        await self._drain()

    async def _drain(self) -> None:
        t = self._transport
        if t is not None and not t.get_write_buffer_size():
            # all of it went to the socket: the drain cannot wait (it only reports a lost
            # connection, whose transport is closing), so no deadline is armed for it
            if t.is_closing():
                await self._writer.drain()
            return
        # asyncio.timeout (see read_request): a DELETE of the request cancels this wait.
        try:
            async with asyncio.timeout(self._limits.write):
                await self._writer.drain()
        except TimeoutError:
            raise ConnectionError(f"the client read nothing for {self._limits.write:g} s") from None


def response_head(
    status: int, content_type: str, extra: dict[str, str], length: int | None, keep_alive: bool
) -> bytes:
    """A response's head: ``length`` None for a chunked body."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
    lines.append(f"Content-Type: {content_type}")
    if length is None:
        lines.append("Transfer-Encoding: chunked")
    else:
        lines.append(f"Content-Length: {length}")
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    lines.extend(f"{k}: {v}" for k, v in extra.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _chunk(data: bytes) -> bytes:
    """``data`` framed as one chunk; nothing for no data (an empty chunk ends the body)."""
    return b"%x\r\n%b\r\n" % (len(data), data) if data else b""
