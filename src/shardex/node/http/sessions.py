"""The console's login sessions: a random token in an ``HttpOnly``, ``SameSite=Strict``
cookie (``Secure`` under TLS), kept in this node's memory, bound to the user's record.

A session holds the user's name and the key material of the record it logged in with (salt
and StoredKey): each request reads the user's record again, so a dropped user or a changed
password ends every session of it at its next request, and a grant or revoke applies at
once (the roles are the record's now). A session ends after ``idle`` seconds unused or
``lifetime`` seconds after its login, whichever comes first, and at logout. Only a digest of
each token is kept (a memory dump holds no usable cookie); at most ``MAX_SESSIONS`` live,
the least recently used dropped first.

Cross-site requests: ``SameSite=Strict`` keeps the browser from sending the cookie with
another site's requests, and the server takes the cookie only on requests that carry the
console's ``X-Requested-With`` header (``server.py``), which no other origin can add to a
request without a CORS preflight this node never grants; a request whose ``Origin`` is not
the node's own is refused as well.
"""

from __future__ import annotations

import collections
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from shardex.net.credentials import USER, Principal, UserCredential, UserDirectory

__all__ = ["COOKIE", "Sessions"]

COOKIE: Final = "shardex_session"
IDLE: Final = 30 * 60.0  # seconds a session lives unused
LIFETIME: Final = 12 * 3600.0  # seconds a session lives at most after its login
MAX_SESSIONS: Final = 10_000


@dataclass(slots=True)
class _Session:
    name: str
    key: tuple[bytes, bytes]  # the record's (salt, StoredKey) at login: its password
    used: float  # monotonic seconds of the last request
    ends: float  # monotonic seconds at which it ends whatever its use


class Sessions:
    def __init__(
        self,
        users: UserDirectory | None,
        *,
        secure: bool,
        idle: float = IDLE,
        lifetime: float = LIFETIME,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._users = users
        self._secure = secure
        self.idle = idle
        self.lifetime = lifetime
        self._clock = clock
        self._live: collections.OrderedDict[bytes, _Session] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._live)

    def open(self, cred: UserCredential) -> str:
        """A new session of the user ``cred`` is the record of; its ``Set-Cookie`` value."""
        token = secrets.token_urlsafe(32)
        now = self._clock()
        self._live[_digest(token)] = _Session(
            cred.name, (cred.salt, cred.stored_key), now, now + self.lifetime
        )
        while len(self._live) > MAX_SESSIONS:
            self._live.popitem(last=False)
        return self._cookie(token, round(self.lifetime))

    @staticmethod
    def names_one(cookies: str | None) -> bool:
        """The ``Cookie`` header carries this service's cookie (ended or not)."""
        return _token(cookies) is not None

    def principal(self, cookies: str | None) -> Principal | None:
        """The user of the session the ``Cookie`` header names, with its roles now; None
        when it names none, or one that ended (expired, logged out, the user dropped or
        its password changed: then it is forgotten too)."""
        token = _token(cookies)
        if token is None:
            return None
        tag = _digest(token)
        s = self._live.get(tag)
        if s is None:
            return None
        now = self._clock()
        cred = self._users.lookup_user(s.name) if self._users is not None else None
        if (
            now >= s.ends
            or now - s.used >= self.idle
            or cred is None
            or (cred.salt, cred.stored_key) != s.key
        ):
            del self._live[tag]
            return None
        s.used = now
        self._live.move_to_end(tag)
        return Principal(USER, s.name, cred.roles)

    def close(self, cookies: str | None) -> str:
        """Ends the session the ``Cookie`` header names (if any); the ``Set-Cookie`` value
        that makes the browser drop its cookie."""
        token = _token(cookies)
        if token is not None:
            self._live.pop(_digest(token), None)
        return self._cookie("", 0)

    def _cookie(self, token: str, max_age: int) -> str:
        secure = "; Secure" if self._secure else ""
        return f"{COOKIE}={token}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}"


def _token(cookies: str | None) -> str | None:
    """This service's token in a ``Cookie`` header ("a=1; b=2"; repeated headers joined
    by ", "), None without one."""
    if not cookies:
        return None
    for part in cookies.replace(",", ";").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name == COOKIE and value:
            return value
    return None


def _digest(token: str) -> bytes:
    return hashlib.blake2b(token.encode(), digest_size=32).digest()
