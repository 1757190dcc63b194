"""The N1QL response envelope, written as the statement's rows come:

    {"requestID": ..., "clientContextID": ..., "signature": ..., "results": [ row, ... ],
     "errors": [...], "status": ..., "metrics": {...}}

One block of rows is held back: a result of one block (every point query) is answered with
a ``Content-Length`` in one write, and the HTTP head goes out with the first block only once
a second one comes. Until then an error still gets its own HTTP status; afterwards it ends
the envelope (``errors``, ``status``) of a 200 response. Each block of rows is one chunk of
the response, JSON-encoded from the statement's msgpack cells, and is written before the
next is read: at most two blocks are held.
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec

from shardex.core.values import MISSING
from shardex.node.http.n1ql_errors import N1qlError
from shardex.node.http.wire import Response
from shardex.sql.exec.rows import decode_row

__all__ = ["Envelope", "go_duration"]

SELECT_SIGNATURE: Final = {"*": "*"}


def _enc_hook(obj: Any) -> Any:
    if obj is MISSING:  # never a JSON value; only inside a composite could it slip through
        return None
    # msgspec's protocol for a type the hook does not handle: the encoder turns it into an
    # EncodeError naming the type (rows hold only JSON values and MISSING: a guard, not a path)
    raise NotImplementedError(f"cannot write {type(obj).__name__} as JSON")


_json = msgspec.json.Encoder(enc_hook=_enc_hook)


def go_duration(seconds: float) -> str:
    """A duration as Couchbase writes it (Go's ``time.Duration`` text): "1.5s", "12.3ms"."""
    if seconds >= 1.0:
        return f"{seconds:.6g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.6g}ms"
    return f"{seconds * 1e6:.6g}µs"


class Envelope:
    def __init__(
        self,
        resp: Response | None,
        request_id: str,
        client_context_id: str | None,
        *,
        metrics: bool = True,
        signature: bool = True,
    ) -> None:
        self._resp = resp
        self.request_id = request_id
        self._ctx = client_context_id
        self._metrics = metrics
        self._signature = signature
        self.result_count = 0
        self.result_size = 0
        self.mutation_count: int | None = None  # set for DML
        self._sig: dict[str, str] | None = None
        self._opened = False  # the results array is open on the wire
        self._held: bytes | None = None  # the first block, until a second one comes
        self.headers: dict[str, str] = {}  # extra response headers (the routing hint)

    def _wire(self) -> Response:
        """The response written to; None for an answer made whole (``whole``)."""
        assert self._resp is not None, "an envelope without a response is only made whole"
        return self._resp

    def statement(self, kind: str, mutation_count: int) -> None:
        """What the statement turned out to be, from its start reply."""
        if kind in ("select", "explain"):
            self._sig = SELECT_SIGNATURE
        else:
            self.mutation_count = mutation_count

    def _prefix(self) -> bytes:
        sig = self._signature and self._sig is not None
        if self._ctx is None:  # the request ID is a UUID's text: nothing in it to escape
            text = f'{{"requestID": "{self.request_id}"'
            return (
                text + (', "signature": {"*": "*"}' if sig else "") + ',\n"results": ['
            ).encode()
        head: dict[str, Any] = {"requestID": self.request_id, "clientContextID": self._ctx}
        if sig:
            head["signature"] = self._sig
        text = json.dumps(head, ensure_ascii=False)
        return (text[:-1] + ',\n"results": [').encode()

    def _encoded(self, cells: list[bytes]) -> bytes:
        """One block of rows as the results array's JSON text, counted."""
        parts = [_json.encode(decode_row(c)) for c in cells]
        self.result_count += len(parts)
        self.result_size += sum(map(len, parts))
        return b",\n".join(parts)

    def hold(self, cells: list[bytes]) -> None:
        """The first block of rows (held for the answer); nothing for no rows."""
        assert not self._opened and self._held is None
        if cells:
            self._held = self._encoded(cells)

    async def rows(self, cells: list[bytes]) -> None:
        """One block of rows, written before the next block is read."""
        if not cells:
            return
        if not self._opened and self._held is None:
            self.hold(cells)
            return
        body = self._encoded(cells)
        if self._opened:
            await self._wire().chunk(b",\n" + body)
        else:
            self._opened = True
            first, self._held = self._held, None
            await self._wire().start(
                200, self._prefix() + b"\n" + first + b",\n" + body, headers=self.headers
            )

    async def finish(
        self, errors: list[N1qlError], elapsed: float, execution: float | None
    ) -> None:
        """The envelope's end: its errors, status and metrics; the whole answer (with the
        HTTP status of the first error) when no row went out."""
        if self._opened:
            rest = self._end(errors, elapsed, execution)
            await self._wire().end(("\n],\n" + rest + "\n").encode())
            return
        http, body, extra = self.whole(errors, elapsed, execution)
        await self._wire().send(http, body, headers=extra)

    def whole(
        self, errors: list[N1qlError], elapsed: float, execution: float | None
    ) -> tuple[int, bytes, dict[str, str]]:
        """The answer when no row went out yet: HTTP status (the first error's), body and
        extra headers."""
        rows = b"" if self._held is None else b"\n" + self._held
        rest = self._end(errors, elapsed, execution)
        body = self._prefix() + rows + b"\n],\n" + rest.encode() + b"\n"
        http = errors[0].http if errors else 200
        extra = {"WWW-Authenticate": 'Basic realm="shardex"'} if http == 401 else self.headers
        return http, body, extra

    def _end(self, errors: list[N1qlError], elapsed: float, execution: float | None) -> str:
        """The envelope's end after its results: errors, status and metrics."""
        if errors:
            status = errors[0].status
            if status == "fatal" and (self._opened or self._held is not None):
                status = "errors"  # the statement failed after some rows
            rest = self._tail(errors, status, elapsed, execution)
        else:  # the text json.dumps writes, without its cost on every point query
            rest = '"status": "success"'
            if self._metrics:
                ran = go_duration(execution if execution is not None else elapsed)
                rest += (
                    f', "metrics": {{"elapsedTime": "{go_duration(elapsed)}", '
                    f'"executionTime": "{ran}", "resultCount": {self.result_count}, '
                    f'"resultSize": {self.result_size}'
                )
                if self.mutation_count is not None:
                    rest += f', "mutationCount": {self.mutation_count}'
                rest += "}"
            rest += "}"
        return rest

    def _tail(
        self, errors: list[N1qlError], status: str, elapsed: float, execution: float | None
    ) -> str:
        """The envelope's end after its results, without the opening brace."""
        tail: dict[str, Any] = {"errors": [e.entry() for e in errors], "status": status}
        if self._metrics:
            m: dict[str, Any] = {"elapsedTime": go_duration(elapsed)}
            m["executionTime"] = go_duration(execution if execution is not None else elapsed)
            m["resultCount"] = self.result_count
            m["resultSize"] = self.result_size
            if self.mutation_count is not None:
                m["mutationCount"] = self.mutation_count
            m["errorCount"] = len(errors)
            tail["metrics"] = m
        return json.dumps(tail, ensure_ascii=False)[1:]
