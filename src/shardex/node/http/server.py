"""The node's HTTP listener (``http_port``): HTTP/1.1 on the node's event loop, HTTPS with
the node's certificate when the node runs TLS, basic auth on every request, and the routes
of its services (the N1QL query service, ``query_service.py``; the metrics; the
operators' cluster REST, ``cluster_rest.py``; the web console's files under ``/ui``,
``static.py``, the one route served without a login).

It binds the node's own host only (the RPC listener's), serves at most ``max_connections``
connections at once (one more is answered 503 and closed) and stops every request in flight
when the node stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable
from typing import Final

from shardex.api.privileges import Privilege, holds
from shardex.errors import ConfigError
from shardex.net.credentials import Principal, UserDirectory
from shardex.net.tls import TlsConfig
from shardex.node.http.basic_auth import REALM, BasicAuth, LoginObserver
from shardex.node.http.cluster_charts import ClusterCharts
from shardex.node.http.cluster_rest import API_PREFIX, ClusterRest
from shardex.node.http.n1ql_errors import E_AUTH, E_PRIVILEGE, N1qlError, of_http_status
from shardex.node.http.query_service import Authorizer, QueryHttpService, Received
from shardex.node.http.quick import IDLE, QuickProtocol
from shardex.node.http.session_login import (
    CONSOLE_REQUEST,
    SESSION_METHODS,
    SESSION_PATH,
    SessionLogin,
    console_only,
)
from shardex.node.http.sessions import Sessions
from shardex.node.http.static import UI_PREFIX, StaticFiles
from shardex.node.http.wire import (
    HttpError,
    Limits,
    Request,
    Response,
    read_request,
    whole_request,
)
from shardex.sql.exec.service import SqlService

__all__ = ["HttpServer"]

log = logging.getLogger(__name__)

QUERY_PATH: Final = "/query/service"
METRICS_PATH: Final = "/metrics"
CHARTS_PATH: Final = "/api/charts"  # the console's charts of every node
METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text
ACTIVE_PATH: Final = "/admin/active_requests"
# The socket's send buffer above which a write waits for the client (backpressure): a
# block of rows is written, then the next read only once the client took most of it.
HIGH_WATER: Final = 256 * 1024
LINGER: Final = 2.0  # seconds a closing connection waits for the client


class HttpServer:
    def __init__(
        self,
        *,
        sql: SqlService,
        users: UserDirectory | None,
        authorize: Authorizer,
        node_name: str,
        tls: TlsConfig | None = None,
        on_login: LoginObserver | None = None,
        max_connections: int = 1000,
        limits: Limits | None = None,
        metrics: Callable[[], bytes] | None = None,
        rest: ClusterRest | None = None,
        charts: ClusterCharts | None = None,
        address: Callable[[], str] = lambda: "",
    ) -> None:
        self.limits = limits or Limits()
        # address: the node's RPC address, named by the routing hints (``route_headers.py``)
        self.query = QueryHttpService(sql, authorize, node_name, address)
        self._auth = BasicAuth(users, on_login)
        self._tls = tls
        self._scheme = "https" if tls is not None else "http"
        # The console's login sessions (cookie), on this node only.
        self.login = SessionLogin(self._auth, Sessions(users, secure=tls is not None), self._scheme)
        # The node's Prometheus exposition (``node/metrics.py``); None: /metrics is 404.
        self._metrics = metrics
        # The operators' cluster REST under /api/ (``cluster_rest.py``); None: 404.
        self._rest = rest
        # The cluster's samples for the console's charts (``cluster_charts.py``); None: 404.
        self._charts = charts
        self._ui = StaticFiles()
        self._max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port: int | None = None
        # requests by where they were read: whole in the receive callback, or by the reader
        self.read = {"receive": 0, "reader": 0}

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self, host: str, port: int) -> None:
        ssl = self._tls.server_context() if self._tls is not None else None
        loop = asyncio.get_running_loop()

        def connection() -> QuickProtocol[Received]:
            reader = asyncio.StreamReader(limit=self.limits.header, loop=loop)
            return QuickProtocol(reader, self._serve, self._received)

        try:
            self._server = await loop.create_server(
                connection, host, port, ssl=ssl, reuse_address=True
            )
        except OSError as e:
            raise ConfigError(
                f"cannot listen for HTTP on {host}:{port}: {e.strerror or e}",
                details={
                    "key": "http_port",
                    "value": port,
                    "hint": "free the port or set another http_port (0 picks a free one)",
                },
            ) from None
        sock = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])
        log.info("HTTP%s query service on %s:%d", "S" if ssl else "", host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = list(self._connections)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            transport = writer.transport
            transport.set_write_buffer_limits(high=HIGH_WATER)
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = writer.get_extra_info("peername")
            peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
            if len(self._connections) > self._max_connections:
                resp = Response(writer, self.limits, keep_alive=False)
                await _error(resp, 503, "too many HTTP connections to this node; retry later")
                return
            await self._requests(reader, writer, peer_text)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass  # the node stops
        except Exception:
            log.exception("HTTP connection failed")
        finally:
            self._connections.discard(task)
            await _close(writer)

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        quick = writer.transport.get_protocol()
        assert isinstance(quick, QuickProtocol), quick
        while True:
            taken = await quick.next_request(self.limits.idle)
            if taken is IDLE:
                return
            if isinstance(taken, Received):
                req = taken.req
            else:
                try:
                    req = await read_request(reader, self.limits, writer, quick.last_answered)
                except HttpError as e:
                    resp = Response(writer, self.limits, keep_alive=False)
                    await _error(resp, e.status, e.message)
                    await _linger(reader, writer, self.limits)
                    return
                if req is None:
                    return
                self.read["reader"] += 1
                taken = None
            resp = Response(writer, self.limits, keep_alive=req.keep_alive)
            await self._route(req, resp, peer, taken)
            if not resp.keep_alive:
                with contextlib.suppress(Exception):
                    await writer.drain()
                return

    def _received(self, data: bytes) -> bytes | Received | None:
        """``data`` taken in the connection's receive callback when it is one whole request:
        the whole response of a ``POST /query/service`` of a remembered basic-auth user whose
        statement is answered in this loop turn (``QueryHttpService.answer_now``), else the
        request parsed for the connection's task (with that user and the query's
        parameters, parsed once); None: the task reads it (``read_request``)."""
        req = whole_request(data, self.limits)
        if req is None:
            return None
        t0 = time.perf_counter()
        self.read["receive"] += 1
        if req.method != "POST" or req.path != QUERY_PATH:
            return Received(req, t0)
        authorization = req.headers.get("authorization")
        principal = None if authorization is None else self._auth.remembered(authorization)
        if principal is None:  # a first login or a console session: checked in the task
            return Received(req, t0)
        q = self.query.parameters(req)
        if req.keep_alive and not isinstance(q, N1qlError):
            out = self.query.answer_now(req, q, principal, t0)
            if out is not None:
                return out
        return Received(req, t0, principal, q)

    async def _route(
        self, req: Request, resp: Response, peer: str, taken: Received | None = None
    ) -> None:
        """``taken``: the request as the receive callback parsed it (its user when
        remembered, its query's parameters)."""
        path = req.path.rstrip("/") or "/"
        if path == UI_PREFIX or path.startswith(UI_PREFIX + "/"):
            await self._static(req, resp)
            return
        if path == SESSION_PATH:
            allowed = SESSION_METHODS
        elif path == QUERY_PATH:
            allowed = ("GET", "POST")
        elif path == ACTIVE_PATH:
            allowed = ("GET",)
        elif path.startswith(ACTIVE_PATH + "/"):
            allowed = ("DELETE",)
        elif (path == METRICS_PATH and self._metrics is not None) or (
            path == CHARTS_PATH and self._charts is not None
        ):
            allowed = ("GET",)
        elif (
            self._rest is not None
            and path.startswith(API_PREFIX + "/")
            and (rest_methods := self._rest.allowed(path)) is not None
        ):
            allowed = rest_methods
        else:
            await _error(resp, 404, f"no such endpoint {path[:80]!r}")
            return
        if req.method not in allowed:
            await _error(
                resp, 405, f"{req.method} is not served on {path}", {"Allow": ", ".join(allowed)}
            )
            return
        try:
            if path == SESSION_PATH:
                await self.login.handle(req, resp, peer)
                return
            if taken is not None and taken.principal is not None:
                principal = taken.principal  # basic auth's remembered answer, as ``_principal``'s
            else:
                principal = await self._principal(req, peer)
        except N1qlError as e:
            # The console's own requests say so: no challenge, or the browser would show its
            # login dialog over the console's login page.
            console = req.headers.get("x-requested-with") == CONSOLE_REQUEST
            await resp.send(
                e.http,
                json.dumps({"errors": [e.entry()], "status": "fatal"}).encode(),
                headers={} if console or e.http != 401 else {"WWW-Authenticate": REALM},
            )
            return
        if path == QUERY_PATH:
            await self.query.query(req, resp, principal, taken)
        elif path == METRICS_PATH:
            await self._scrape(resp, principal)
        elif path == CHARTS_PATH:
            await self._cluster_charts(resp, principal)
        elif path.startswith(API_PREFIX + "/"):
            assert self._rest is not None
            await self._rest.handle(req, path, resp, principal)
        elif path == ACTIVE_PATH:
            await self.query.list_active(resp, principal)
        else:
            await self.query.cancel(path[len(ACTIVE_PATH) + 1 :], resp, principal)

    async def _principal(self, req: Request, peer: str) -> Principal:
        """The request's user: its basic credentials, else the console's session cookie
        (only on the console's own requests: ``console_only``); 401 without either."""
        authorization = req.headers.get("authorization")
        cookies = req.headers.get("cookie")
        if authorization is None and self.login.sessions.names_one(cookies):
            console_only(req, self._scheme)
            principal = self.login.sessions.principal(cookies)
            if principal is None:
                raise N1qlError(
                    E_AUTH,
                    "Authentication failed: the console session ended (expired, logged "
                    "out, or the user or its password changed)",
                    401,
                    reason={"shardex_code": "AUTH_FAILED", "hint": "log in again"},
                )
            return principal
        return await self._auth.principal(authorization, peer)

    async def _static(self, req: Request, resp: Response) -> None:
        if req.method != "GET":
            await _error(resp, 405, f"{req.method} is not served on {UI_PREFIX}", {"Allow": "GET"})
            return
        found = self._ui.get(req.path)
        if found is None:
            await _error(resp, 404, f"no such console file {req.path[:80]!r}")
            return
        body, content_type = found
        # no-cache: a browser asks again (and gets the files of the node it talks to)
        await resp.send(200, body, content_type=content_type, headers={"Cache-Control": "no-cache"})

    async def _may_read_metrics(self, resp: Response, principal: Principal) -> bool:
        """Metrics go to a user with cluster.manage: they name every keyspace and index and
        their sizes, which a user without rights on a keyspace may not read (its stats are
        data.read), and cluster.read is every user's. Answers 403 otherwise."""
        if holds(principal.roles, Privilege.CLUSTER_MANAGE, None):
            return True
        err = N1qlError(
            E_PRIVILEGE,
            f"user {principal.name!r} may not read the metrics: it needs cluster.manage",
            403,
            reason={"hint": "grant a role with it: shardex user grant NAME cluster_admin"},
        )
        await resp.send(403, json.dumps({"errors": [err.entry()], "status": "fatal"}).encode())
        return False

    async def _cluster_charts(self, resp: Response, principal: Principal) -> None:
        """Every node's chart numbers over the last minutes (``cluster_charts.py``)."""
        assert self._charts is not None
        if await self._may_read_metrics(resp, principal):
            body = await self._charts.charts()
            await resp.send(200, json.dumps(body).encode())

    async def _scrape(self, resp: Response, principal: Principal) -> None:
        """The node's metrics in Prometheus' text format, to a user with cluster.manage."""
        assert self._metrics is not None
        if not await self._may_read_metrics(resp, principal):
            return
        try:
            body = self._metrics()
        except Exception:  # a service changed under the scrape: the next one reads again
            log.exception("metrics scrape failed")
            await _error(resp, 500, "the metrics could not be read; scrape again")
            return
        await resp.send(200, body, content_type=METRICS_CONTENT_TYPE)


async def _error(
    resp: Response, status: int, message: str, headers: dict[str, str] | None = None
) -> None:
    body = {"errors": [{"code": of_http_status(status), "msg": message}], "status": "fatal"}
    await resp.send(status, json.dumps(body).encode(), headers=headers)


async def _linger(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: Limits
) -> None:
    """After refusing a request whose body was not read (413, 431, ...): stop sending, then
    read and drop what the client still sends for a moment, so closing does not reset the
    connection before the client has read the refusal."""
    with contextlib.suppress(Exception):
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER):
            left = 2 * limits.body
            while left > 0 and (data := await reader.read(64 * 1024)):
                left -= len(data)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close after what was written is sent; abort a client that does not take it."""
    try:
        writer.close()
        async with asyncio.timeout(LINGER):
            await writer.wait_closed()
    except BaseException:
        writer.transport.abort()
