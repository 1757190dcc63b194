"""The console's session cookie on the node's HTTP listener, in process: the login sets an
HttpOnly, SameSite=Strict cookie (Secure under TLS) that stands for the user on the
console's own requests only; logout, expiry, a changed password or a dropped user end it; a
grant or revoke applies at once; requests without the console's header or from another
origin are refused; a bad login body is a 400 naming what is wrong."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shardex.net.credentials import Argon2Params, UserCredential, make_credential
from shardex.node.http.server import HttpServer
from shardex.node.http.sessions import COOKIE, Sessions

CHEAP = Argon2Params(time_cost=1, memory_cost=8, parallelism=1)
CONSOLE = {"X-Requested-With": "shardex-console"}


def _cred(name: str, password: str, *roles: str, salt: bytes = b"s" * 16) -> UserCredential:
    return make_credential(name, password, roles, salt=salt, params=CHEAP)


class Users:
    def __init__(self, *creds: UserCredential) -> None:
        self.creds = {c.name: c for c in creds}

    def lookup_user(self, name: str) -> UserCredential | None:
        return self.creds.get(name)

    async def lookup_missing(self, name: str) -> UserCredential | None:
        return None


class Env:
    def __init__(self, server: HttpServer, users: Users, clock: list[float]) -> None:
        self.server = server
        self.users = users
        self.clock = clock
        assert server.port is not None
        self.port = server.port

    async def call(
        self, method: str, path: str, headers: dict[str, str], body: Any = None
    ) -> tuple[int, dict[str, str], Any]:
        def once() -> tuple[int, dict[str, str], Any]:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                data = (
                    None
                    if body is None
                    else (body if isinstance(body, bytes) else json.dumps(body).encode())
                )
                conn.request(method, path, body=data, headers=headers)
                r = conn.getresponse()
                raw = r.read()
                return r.status, dict(r.headers), json.loads(raw) if raw[:1] in b"{[" else raw
            finally:
                conn.close()

        return await asyncio.to_thread(once)

    async def login(self, user: str, password: str) -> str:
        status, head, body = await self.call(
            "POST", "/api/session", CONSOLE, {"user": user, "password": password}
        )
        assert status == 200 and body["user"] == user, body
        return head["Set-Cookie"].split(";", 1)[0]  # "shardex_session=TOKEN"


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    users = Users(_cred("ops", "pw", "cluster_admin"), _cred("reader", "pw", "data_reader(*)"))
    clock = [1000.0]
    server = HttpServer(
        sql=None,  # type: ignore[arg-type]  # no statement runs here
        users=users,  # type: ignore[arg-type]
        authorize=lambda p, m: None,
        node_name="n1",
        metrics=lambda: b"x 1.0\n",
    )
    server.login.sessions = Sessions(
        users, secure=False, idle=60, lifetime=600, clock=lambda: clock[0]
    )  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0)
    yield Env(server, users, clock)
    await server.stop()


async def test_login_sets_a_strict_httponly_cookie_that_stands_for_the_user(env: Env) -> None:
    status, head, body = await env.call(
        "POST", "/api/session", CONSOLE, {"user": "ops", "password": "pw"}
    )
    assert status == 200 and body == {"user": "ops", "roles": ["cluster_admin"]}
    name_value, *attrs = [a.strip() for a in head["Set-Cookie"].split(";")]
    assert name_value.startswith(f"{COOKIE}=") and len(name_value) > len(COOKIE) + 40
    assert set(attrs) == {"Path=/", "Max-Age=600", "HttpOnly", "SameSite=Strict"}  # no TLS
    cookie = {"Cookie": f"other=1; {name_value}", **CONSOLE}
    assert (await env.call("GET", "/metrics", cookie))[0] == 200
    assert (await env.call("GET", "/api/session", cookie))[2] == {
        "user": "ops",
        "roles": ["cluster_admin"],
    }
    # without a cookie the console is told nobody is logged in (no error for the page)
    assert (await env.call("GET", "/api/session", CONSOLE))[:3:2] == (200, {"user": None})
    # the cookie of another user is that user's
    reader = {"Cookie": await env.login("reader", "pw"), **CONSOLE}
    assert (await env.call("GET", "/metrics", reader))[0] == 403


async def test_the_cookie_only_on_the_consoles_own_requests(env: Env) -> None:
    cookie = {"Cookie": await env.login("ops", "pw")}
    status, head, body = await env.call("GET", "/metrics", cookie)  # no X-Requested-With
    assert status == 403 and "X-Requested-With" in body["errors"][0]["msg"]
    assert "WWW-Authenticate" not in head
    status, _, body = await env.call(
        "GET", "/metrics", {**cookie, **CONSOLE, "Origin": "http://evil.example"}
    )
    assert status == 403 and "evil.example" in body["errors"][0]["msg"]
    own = f"http://127.0.0.1:{env.port}"
    assert (await env.call("GET", "/metrics", {**cookie, **CONSOLE, "Origin": own}))[0] == 200
    # a login from another page is refused too (no logging a browser in as someone else)
    status, head, _ = await env.call("POST", "/api/session", {}, {"user": "ops", "password": "pw"})
    assert status == 403 and "Set-Cookie" not in head


async def test_logout_expiry_password_change_and_drop_end_the_session(env: Env) -> None:
    async def works(cookie: str) -> int:
        return (await env.call("GET", "/metrics", {"Cookie": cookie, **CONSOLE}))[0]

    first = await env.login("ops", "pw")
    status, head, body = await env.call("DELETE", "/api/session", {"Cookie": first, **CONSOLE})
    assert (status, body) == (200, {"user": None})
    assert "Max-Age=0" in head["Set-Cookie"]
    assert await works(first) == 401
    # idle past its idle time, then past its lifetime however used
    idle = await env.login("ops", "pw")
    env.clock[0] += 59
    assert await works(idle) == 200
    env.clock[0] += 59  # 59 s since its last use: still alive
    assert await works(idle) == 200
    env.clock[0] += 60
    assert await works(idle) == 401
    used = await env.login("ops", "pw")
    for _ in range(10):
        env.clock[0] += 59
        assert await works(used) == 200
    env.clock[0] += 59  # 649 s after the login
    assert await works(used) == 401
    # a revoke applies at once, a grant back too: the roles are the record's now
    session = await env.login("ops", "pw")
    env.users.creds["ops"] = _cred("ops", "pw", "data_reader(*)")
    assert await works(session) == 403
    env.users.creds["ops"] = _cred("ops", "pw", "cluster_admin")
    assert await works(session) == 200
    # a new password (new salt and key) ends it; so does dropping the user
    env.users.creds["ops"] = _cred("ops", "new-pw", "cluster_admin", salt=b"t" * 16)
    status, head, body = await env.call("GET", "/metrics", {"Cookie": session, **CONSOLE})
    assert status == 401 and "session ended" in body["errors"][0]["msg"]
    assert "WWW-Authenticate" not in head  # the console's request: no browser dialog
    session = await env.login("ops", "new-pw")
    del env.users.creds["ops"]
    assert await works(session) == 401
    assert len(env.server.login.sessions) == 0  # every ended session is forgotten


async def test_a_refused_or_malformed_login(env: Env) -> None:
    for fields, status, words in (
        ({"user": "ops", "password": "wrong"}, 401, "wrong password"),
        ({"user": "nobody", "password": "pw"}, 401, "wrong password"),
        ({"user": "ops"}, 400, "'password' must be a non-empty string"),
        (
            {"user": "ops", "password": "pw", "remember": True},
            400,
            "unknown login field 'remember'",
        ),
        ([1], 400, "must be a JSON object"),
        (b"{nope", 400, "not JSON"),
    ):
        got, head, body = await env.call("POST", "/api/session", CONSOLE, fields)
        assert got == status and words in body["errors"][0]["msg"], (fields, body)
        assert "Set-Cookie" not in head and "WWW-Authenticate" not in head
    assert (await env.call("PUT", "/api/session", CONSOLE))[0] == 405
    assert len(env.server.login.sessions) == 0
    # basic auth still works beside the cookie (curl, Prometheus)
    basic = {"Authorization": "Basic " + base64.b64encode(b"ops:pw").decode()}
    assert (await env.call("GET", "/metrics", basic))[0] == 200


def test_the_cookie_is_secure_under_tls() -> None:
    sessions = Sessions(Users(), secure=True)
    cookie = sessions.open(_cred("ops", "pw", "admin"))
    assert cookie.split("; ")[1:] == [
        "Path=/",
        f"Max-Age={round(sessions.lifetime)}",
        "HttpOnly",
        "SameSite=Strict",
        "Secure",
    ]
    assert sessions.close(None).endswith("Max-Age=0; HttpOnly; SameSite=Strict; Secure")
