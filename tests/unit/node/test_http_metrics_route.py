"""``GET /metrics`` on the node's HTTP listener, in process: the exposition to a user with
cluster.manage, 403 to others, 401 without credentials, 405 for another method, 500 when
the exposition fails (the next scrape reads again), 404 where the node serves none."""

from __future__ import annotations

import asyncio
import base64
import http.client
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from shardex.net.credentials import Argon2Params, UserCredential, make_credential
from shardex.node.http.server import HttpServer

CHEAP = Argon2Params(time_cost=1, memory_cost=8, parallelism=1)


class Users:
    def __init__(self, *creds: UserCredential) -> None:
        self.creds = {c.name: c for c in creds}

    def lookup_user(self, name: str) -> UserCredential | None:
        return self.creds.get(name)

    async def lookup_missing(self, name: str) -> UserCredential | None:
        return None


def _auth(user: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:pw".encode()).decode()}


async def _server(metrics: Callable[[], bytes] | None) -> HttpServer:
    users = Users(
        *(
            make_credential(n, "pw", roles, salt=b"s" * 16, params=CHEAP)
            for n, roles in (("ops", ("cluster_admin",)), ("reader", ("data_reader(*)",)))
        )
    )
    server = HttpServer(
        sql=None,  # type: ignore[arg-type]  # no statement runs here
        users=users,  # type: ignore[arg-type]
        authorize=lambda p, m: None,
        node_name="n1",
        metrics=metrics,
    )
    await server.start("127.0.0.1", 0)
    return server


@pytest.fixture
async def served() -> AsyncIterator[tuple[HttpServer, list[Any]]]:
    calls: list[Any] = []

    def metrics() -> bytes:
        if calls and calls[-1] == "fail":
            calls.append("failed")
            raise RuntimeError("changed under the scrape")
        calls.append("read")
        return b"# HELP x y\n# TYPE x gauge\nx 1.0\n"

    server = await _server(metrics)
    yield server, calls
    await server.stop()


def _get(port: int, headers: dict[str, str], method: str = "GET") -> list[tuple[int, str, bytes]]:
    """One request on its own connection: [(status, content type, body)]."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, "/metrics", headers=headers)
        r = conn.getresponse()
        return [(r.status, r.headers["Content-Type"], r.read())]
    finally:
        conn.close()


async def test_metrics_to_a_user_with_cluster_manage(served: tuple[HttpServer, list[Any]]) -> None:
    server, calls = served
    assert server.port is not None
    [(status, ctype, body)] = await asyncio.to_thread(_get, server.port, _auth("ops"))
    assert (status, body) == (200, b"# HELP x y\n# TYPE x gauge\nx 1.0\n")
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    [(status, _, body)] = await asyncio.to_thread(_get, server.port, _auth("reader"))
    assert status == 403 and b"cluster.manage" in body
    [(status, _, _)] = await asyncio.to_thread(_get, server.port, {})
    assert status == 401
    [(status, _, _)] = await asyncio.to_thread(_get, server.port, _auth("ops"), "POST")
    assert status == 405
    assert calls == ["read"]  # only the allowed scrape read the metrics


async def test_a_failed_exposition_is_a_500(served: tuple[HttpServer, list[Any]]) -> None:
    server, calls = served
    assert server.port is not None
    calls.append("fail")
    [(status, _, body)] = await asyncio.to_thread(_get, server.port, _auth("ops"))
    assert status == 500 and b"scrape again" in body
    [(status, _, _)] = await asyncio.to_thread(_get, server.port, _auth("ops"))
    assert status == 200 and calls == ["fail", "failed", "read"]


async def test_no_metrics_no_endpoint() -> None:
    server = await _server(None)
    try:
        assert server.port is not None
        [(status, _, _)] = await asyncio.to_thread(_get, server.port, _auth("ops"))
        assert status == 404
    finally:
        await server.stop()
