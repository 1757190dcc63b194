"""The console's login over HTTP: ``/api/session`` (POST logs in and sets the cookie, GET
says who is logged in, DELETE logs out) and the check a request authenticated by the
cookie passes (``console_only``): the console's ``X-Requested-With`` and, when the browser
names one, the node's own ``Origin``. The sessions themselves: ``sessions.py``."""

from __future__ import annotations

import json
from typing import Any, Final

from shardex.net.credentials import Principal
from shardex.node.http.basic_auth import BasicAuth
from shardex.node.http.n1ql_errors import E_BAD_VALUE, E_HTTP_REQUEST, N1qlError
from shardex.node.http.sessions import Sessions
from shardex.node.http.wire import Request, Response

__all__ = ["CONSOLE_REQUEST", "SESSION_PATH", "SessionLogin", "console_only"]

SESSION_PATH: Final = "/api/session"
SESSION_METHODS: Final = ("GET", "POST", "DELETE")
CONSOLE_REQUEST: Final = "shardex-console"  # the console's X-Requested-With


def console_only(req: Request, scheme: str) -> None:
    """Raises 403 unless ``req`` is the console's own: it carries ``X-Requested-With:
    shardex-console`` (another origin cannot add it without a CORS preflight, which this
    node never answers) and its ``Origin``, when present, is this node's."""
    if req.headers.get("x-requested-with") != CONSOLE_REQUEST:
        raise _forbidden(
            "a request with the console's session cookie must carry "
            f"'X-Requested-With: {CONSOLE_REQUEST}'",
            "scripts and curl log in with HTTP basic auth instead of the cookie",
        )
    origin = req.headers.get("origin")
    own = f"{scheme}://{req.headers.get('host', '')}"
    if origin is not None and origin != own:
        raise _forbidden(
            f"the request's Origin {origin[:100]!r} is not this node's ({own[:100]!r})",
            "the console's cookie works only on pages this node serves",
        )


class SessionLogin:
    def __init__(self, auth: BasicAuth, sessions: Sessions, scheme: str) -> None:
        self._auth = auth
        self.sessions = sessions
        self._scheme = scheme

    async def handle(self, req: Request, resp: Response, peer: str) -> None:
        """``/api/session`` (one of ``SESSION_METHODS``): every method is the console's own
        (``console_only``), the login included (so another site cannot log a browser in
        under a user of its choosing)."""
        console_only(req, self._scheme)
        cookies = req.headers.get("cookie")
        if req.method == "GET":
            await _reply(resp, self.sessions.principal(cookies))
        elif req.method == "DELETE":
            await _reply(resp, None, self.sessions.close(cookies))
        else:
            name, password = _login_fields(req.body)
            cred, principal = await self._auth.check(name, password, peer)
            self.sessions.close(cookies)  # a new login replaces the tab's old session
            await _reply(resp, principal, self.sessions.open(cred))


async def _reply(resp: Response, principal: Principal | None, cookie: str | None = None) -> None:
    body: dict[str, Any] = {"user": None}
    if principal is not None:
        body = {"user": principal.name, "roles": list(principal.roles)}
    # no-store: a shared cache never keeps whose session this is
    headers = {"Cache-Control": "no-store"}
    if cookie is not None:
        headers["Set-Cookie"] = cookie
    await resp.send(200, json.dumps(body).encode(), headers=headers)


def _login_fields(body: bytes) -> tuple[str, str]:
    """``{"user": ..., "password": ...}`` of a login; 400 naming what is wrong."""
    try:
        fields = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(f"the login body is not JSON: {e}") from None
    if not isinstance(fields, dict):
        raise _bad(f"the login body must be a JSON object, got {type(fields).__name__}")
    unknown = sorted(set(fields) - {"user", "password"})
    if unknown:
        raise _bad(f"unknown login field {unknown[0][:40]!r}")
    name, password = fields.get("user"), fields.get("password")
    for key, value in (("user", name), ("password", password)):
        if not isinstance(value, str) or not value:
            raise _bad(f"the login's {key!r} must be a non-empty string, got {value!r:.40}")
    assert isinstance(name, str) and isinstance(password, str)
    return name, password


def _bad(msg: str) -> N1qlError:
    return N1qlError(
        E_BAD_VALUE, msg, 400, reason={"hint": '{"user": "NAME", "password": "PASSWORD"}'}
    )


def _forbidden(msg: str, hint: str) -> N1qlError:
    return N1qlError(E_HTTP_REQUEST, msg, 403, reason={"hint": hint})
