"""The N1QL query service over HTTP: ``POST /query/service`` (GET too: read-only), and the
requests running now, ``GET /admin/active_requests``, ``DELETE .../<requestID>`` to stop one.

A statement runs in-process through the node's own ``SqlService.open_statement`` (the RPC
path's checks, admission, privileges and statement logic; nothing is duplicated here): the
user's principal from basic auth is authorized for the statement message as an RPC user's
would be (``authorize``: the node's audit log and privilege table), then the statement's
privileges are checked by the service itself. Its rows are written as they come, a block at
a time (``envelope.py``), so a result is never held whole. The request's ``timeout`` bounds
all of it (1080); a DELETE of its request ID cancels it wherever it is (queued, planning or
streaming: closing its rows cancels the query on every node), and a client that stops
reading fails the write within ``Limits.write`` and stops the statement the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Final

from shardex.api.privileges import Privilege, holds
from shardex.api.sql_exec import SqlQuery
from shardex.client.routes import RouteHints
from shardex.errors import ShardexError
from shardex.net.credentials import Principal
from shardex.net.messages import Message
from shardex.node.http.envelope import Envelope, go_duration
from shardex.node.http.n1ql_errors import (
    E_CANCELLED,
    E_INTERNAL,
    E_READONLY,
    E_TIMEOUT,
    N1qlError,
    of_shardex,
)
from shardex.node.http.n1ql_request import QueryRequest, query_request
from shardex.node.http.route_headers import headers_of, route_headers
from shardex.node.http.wire import Request, Response, response_head
from shardex.sql.exec.service import SqlService
from shardex.sql.exec.statement_checks import MAX_TIMEOUT
from shardex.sql.exec.statements import parsed
from shardex.sql.syntax import ExplainStmt, SelectStmt
from shardex.sql.syntax.ast import SetOpStmt, WithStmt

__all__ = ["ActiveRequest", "QueryHttpService", "Received"]

log = logging.getLogger(__name__)

Authorizer = Callable[[Principal, Message], None]
# A request's end status -> the SQL service's statement outcome (``StatementStats``).
_OUTCOMES = {"success": "success", "timeout": "timeout", "stopped": "cancelled"}
JSON: Final = "application/json"


@dataclasses.dataclass(slots=True)
class Received:
    """A request parsed whole in the connection's receive callback, for its task."""

    req: Request
    t0: float  # time.perf_counter() when it was taken
    principal: Principal | None = None  # its user, when basic auth remembered its header
    query: QueryRequest | N1qlError | None = None  # a query's parameters, parsed


@dataclasses.dataclass
class ActiveRequest:
    request_id: str
    statement: str
    user: str
    client_context_id: str | None
    request_time: float  # wall clock, for operators
    started: float  # time.perf_counter()
    task: asyncio.Task[Any]
    envelope: Envelope | None = None
    cancelled: bool = False
    # running; then while the envelope's end is written: success, or the end's status
    # (timeout, stopped, fatal, errors)
    state: str = "running"

    def describe(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requestID": self.request_id,
            "requestTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.request_time)),
            "elapsedTime": go_duration(now - self.started),
            "state": "stopping" if self.cancelled and self.state == "running" else self.state,
            "statement": self.statement,
            "users": self.user,
            "resultCount": self.envelope.result_count if self.envelope else 0,
        }
        if self.client_context_id is not None:
            out["clientContextID"] = self.client_context_id
        return out


class QueryHttpService:
    def __init__(
        self,
        sql: SqlService,
        authorize: Authorizer,
        node_name: str,
        address: Callable[[], str] = lambda: "",
    ) -> None:
        self._sql = sql
        self._authorize = authorize
        self._node = node_name
        self._address = address  # this node's RPC address, for the routing hint
        self.active: dict[str, ActiveRequest] = {}
        # requests served, by where: in the receive callback (``answer_now``) or the task
        self.served = {"receive": 0, "task": 0}
        # The statement texts the task answered as key lookups by a parameter (their routing
        # hints): only those are tried in the receive callback, and only with a key this
        # node owns; any other text would be checked and planned there for nothing.
        self._key_lookups = RouteHints()

    # --- POST /query/service ------------------------------------------------------------

    def parameters(self, req: Request) -> QueryRequest | N1qlError:
        """The query request's parameters (``query_request``), or the error they are."""
        try:
            return query_request(req)
        except N1qlError as e:
            return e

    async def query(
        self, req: Request, resp: Response, principal: Principal, taken: Received | None = None
    ) -> None:
        """``taken``: the request as the receive callback parsed it (from when it was taken,
        with its parameters); else it is parsed here."""
        if taken is not None and taken.query is not None:
            t0, q = taken.t0, taken.query  # metrics: the loop's clock counts whole milliseconds
        else:
            t0, q = time.perf_counter(), self.parameters(req)
        request_id = request_uuid()
        self.served["task"] += 1
        if isinstance(q, N1qlError):
            self._sql.stats.end_as(t0, "error")  # refused, as the RPC path's bad requests
            await Envelope(resp, request_id, None).finish([q], time.perf_counter() - t0, None)
            return
        if req.method == "GET":
            q.readonly = True  # as Couchbase: a GET never writes
        task = asyncio.current_task()
        assert task is not None
        active = ActiveRequest(
            request_id, q.statement, principal.name, q.client_context_id, time.time(), t0, task
        )
        self.active[request_id] = active
        try:
            await self._run(q, active, resp, principal)
        finally:
            del self.active[request_id]

    async def _run(
        self, q: QueryRequest, active: ActiveRequest, resp: Response, principal: Principal
    ) -> None:
        env = active.envelope = Envelope(
            resp,
            active.request_id,
            q.client_context_id,
            metrics=q.metrics,
            signature=q.signature,
        )
        msg = _message(q)
        timeout = msg.timeout
        errors: list[N1qlError] = []
        t_exec: float | None = None
        try:
            async with asyncio.timeout(timeout):
                self._authorize(principal, msg)
                if q.readonly:
                    _check_readonly(q.statement)
                t_exec = time.perf_counter()
                started, chunks, slot = await self._sql.open_statement(msg, principal)
                try:
                    async with contextlib.aclosing(chunks):
                        env.statement(started.statement, started.mutation_count)
                        # the hint's headers; a key lookup's text is then tried on receive
                        route = self._key_lookups.learn(
                            q.statement, started.details, self._address()
                        )
                        env.headers = headers_of(route)
                        async for cells in chunks:
                            await env.rows(cells)
                            if active.cancelled:  # a cancel some await below swallowed
                                raise _Stopped
                finally:
                    slot.release()
        except (asyncio.CancelledError, _Stopped) as e:
            if not active.cancelled:
                raise  # the node stops, or the connection went away
            if isinstance(e, asyncio.CancelledError):
                active.task.uncancel()
            why = "Request cancelled: stopped by a DELETE of its request ID"
            errors.append(N1qlError(E_CANCELLED, why, 200, "stopped"))
        except TimeoutError:
            shown = q.timeout_text or f"{timeout:g}s"
            errors.append(N1qlError(E_TIMEOUT, f"Timeout {shown} exceeded", 504, "timeout"))
        except N1qlError as e:
            errors.append(e)
        except ShardexError as e:
            errors.append(of_shardex(e))
        except ConnectionError:
            raise  # the client is gone: nobody to answer
        except Exception as e:
            log.exception("query service request %s failed", active.request_id)
            errors.append(N1qlError(E_INTERNAL, f"internal error: {type(e).__name__}", 500))
        active.state = errors[0].status if errors else "success"
        self._sql.stats.end_as(active.started, _OUTCOMES.get(active.state, "error"))
        now = time.perf_counter()
        await env.finish(errors, now - active.started, None if t_exec is None else now - t_exec)

    def answer_now(
        self, req: Request, q: QueryRequest, principal: Principal, t0: float
    ) -> bytes | None:
        """The whole response to ``req``, a POST whose parameters are ``q`` (taken at
        ``t0``), when its statement is answered in this loop turn (``SqlService.answer_now``:
        a key lookup whose documents are all on this node), made in the connection's receive
        callback: the same checks and envelope as ``query``, without its task, deadlines and
        request bookkeeping (nothing could list or cancel the request before it ends). Tried
        only for a text ``query`` answered as a key lookup by a parameter, with a key this
        node owns. None for every other request, and for one that fails anywhere: ``query``
        serves it from the start (with ``q``) and answers its error."""
        route = self._key_lookups.get(q.statement)
        if route is None or route.keyspace is None:
            return None
        keys = route.key(q.params)  # USE KEYS $1 may name a list of them
        keys = [keys] if isinstance(keys, str) else keys
        if not (isinstance(keys, list) and keys and all(isinstance(k, str) for k in keys)):
            return None
        if not self._sql.documents.owns_now(route.keyspace, keys):
            return None
        try:
            msg = _message(q)
            self._authorize(principal, msg)
            if q.readonly:
                _check_readonly(q.statement)
        except (N1qlError, ShardexError):
            return None
        t_exec = time.perf_counter()
        started = self._sql.answer_now(msg, principal)
        if started is None:
            return None
        env = Envelope(
            None, request_uuid(), q.client_context_id, metrics=q.metrics, signature=q.signature
        )
        env.statement(started.statement, started.mutation_count)
        env.headers = route_headers(started.details, self._address())
        env.hold(started.rows)
        self._sql.stats.end_as(t0, "success")
        self.served["receive"] += 1
        now = time.perf_counter()
        http, body, extra = env.whole([], now - t0, now - t_exec)
        return response_head(http, JSON, extra, len(body), req.keep_alive) + body

    # --- /admin/active_requests -----------------------------------------------------------

    def _visible(self, principal: Principal) -> list[ActiveRequest]:
        """A user sees its own requests; one with cluster.manage sees everyone's."""
        if holds(principal.roles, Privilege.CLUSTER_MANAGE, None):
            return list(self.active.values())
        return [a for a in self.active.values() if a.user == principal.name]

    async def list_active(self, resp: Response, principal: Principal) -> None:
        now = time.perf_counter()
        body = [a.describe(now) for a in self._visible(principal)]
        await resp.send(200, json.dumps(body, ensure_ascii=False).encode())

    async def cancel(self, request_id: str, resp: Response, principal: Principal) -> None:
        found = next((a for a in self._visible(principal) if a.request_id == request_id), None)
        if found is None:
            err = N1qlError(
                E_CANCELLED,
                f"no running request {request_id[:80]!r} of yours on this node",
                404,
                reason={"hint": "GET /admin/active_requests lists them"},
            )
            await resp.send(404, json.dumps({"errors": [err.entry()]}).encode())
            return
        if not found.cancelled:
            found.cancelled = True
            found.task.cancel()
        await resp.send(200, json.dumps({"requestID": request_id, "state": "stopping"}).encode())


def request_uuid() -> str:
    """A request ID: a random (version 4) UUID's text, as ``str(uuid.uuid4())`` writes it,
    without building a ``UUID`` object."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # the RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _message(q: QueryRequest) -> SqlQuery:
    """The SQL service's message for a request (its timeout capped as the service's)."""
    return SqlQuery(
        stream_id=0,
        statement=q.statement,
        params=q.params,
        consistency=q.consistency,
        at=q.scan_vector,
        timeout=min(q.timeout or MAX_TIMEOUT, MAX_TIMEOUT),
    )


class _Stopped(Exception):
    """The request was cancelled (``ActiveRequest.cancelled``)."""


def _check_readonly(statement: str) -> None:
    """1000 for a statement that writes in a read-only request."""
    stmt = parsed(statement)
    if not isinstance(stmt, SelectStmt | SetOpStmt | WithStmt | ExplainStmt):
        raise N1qlError(
            E_READONLY,
            "The server or request is read-only and cannot accept this write statement.",
            400,
        )
