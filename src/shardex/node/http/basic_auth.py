"""HTTP basic auth against the cluster's users: the same user records (Argon2id-derived keys,
``meta/users.py``) and the same directory as the RPC login (``node/users.py``).

The RPC login proves the password without sending it; basic auth sends it, so the node
derives the key itself (``password_matches``: one Argon2id, ~25 ms of CPU, in a worker
thread). A header that matched is remembered with its user record (keyed by a keyed BLAKE2b
of the whole ``Authorization`` value under a key of this process, never the password): curl-
style clients log in on every request, and a remembered header is taken only while the
directory still holds that very record, which it replaces when the password, roles or user
change and drops with the user: the next request after any of them is checked afresh. An
unknown user costs the same derivation as a wrong password.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import hashlib
import secrets
from collections.abc import Callable
from typing import Final

from shardex.net.credentials import (
    USER,
    Argon2Params,
    Principal,
    UserCredential,
    UserDirectory,
    password_matches,
)
from shardex.node.http.n1ql_errors import E_AUTH, N1qlError

__all__ = ["BasicAuth"]

REMEMBERED: Final = 1024  # Authorization headers that matched, most recent kept
REALM: Final = 'Basic realm="shardex"'
LoginObserver = Callable[[str, str, Principal | None], None]


class BasicAuth:
    def __init__(self, users: UserDirectory | None, on_login: LoginObserver | None = None) -> None:
        self._users = users
        self._on_login = on_login
        self._key = secrets.token_bytes(32)  # this process's: what is remembered stays here
        # the header's tag -> the user's name, its record then and the principal of it
        self._matched: collections.OrderedDict[bytes, tuple[str, UserCredential, Principal]] = (
            collections.OrderedDict()
        )
        # An unknown user's derivation: a fixed fake record, so its cost is a real one's.
        self._decoy = UserCredential(
            "", (), secrets.token_bytes(16), Argon2Params(), b"\0" * 32, b""
        )

    async def principal(self, authorization: str | None, peer: str) -> Principal:
        """The user the ``Authorization`` header names, with its roles now; 10000 with HTTP
        401 (and a ``WWW-Authenticate`` challenge) when it is missing or does not match."""
        tag = self._tag(authorization)
        known = self._remembered(tag)
        if known is not None:
            return known
        name, password = _credentials(authorization)
        cred, principal = await self.check(name, password, peer)
        self._matched[tag] = (name, cred, principal)
        if len(self._matched) > REMEMBERED:
            self._matched.popitem(last=False)
        return principal

    def remembered(self, authorization: str) -> Principal | None:
        """The principal of a header that matched before and still does (its user's record
        unchanged), without waiting; None when it has to be checked (``principal``)."""
        return self._remembered(self._tag(authorization))

    def _tag(self, authorization: str | None) -> bytes:
        raw = (authorization or "").encode("utf-8", "surrogatepass")
        return hashlib.blake2b(raw, key=self._key).digest()

    def _remembered(self, tag: bytes) -> Principal | None:
        hit = self._matched.get(tag)
        if hit is None:
            return None
        # the record the login was checked against, still the user's: same password
        if self._users is not None and self._users.lookup_user(hit[0]) is hit[1]:
            self._matched.move_to_end(tag)
            return hit[2]
        del self._matched[tag]
        return None

    async def check(self, name: str, password: str, peer: str) -> tuple[UserCredential, Principal]:
        """The user's record and principal when ``password`` is its password (audited
        either way); 10000 with HTTP 401 otherwise. The console's login (``sessions.py``)
        checks its form's fields here too."""
        cred = None
        if self._users is not None and name:
            cred = self._users.lookup_user(name) or await self._users.lookup_missing(name)
        loop = asyncio.get_running_loop()
        check = cred if cred is not None else self._decoy
        ok = await loop.run_in_executor(None, password_matches, check, password)
        if cred is None or not ok:
            self._observe(peer, name, None)
            raise _refused("unknown user or wrong password")
        principal = Principal(USER, name, cred.roles)
        self._observe(peer, name, principal)
        return cred, principal

    def _observe(self, peer: str, name: str, principal: Principal | None) -> None:
        if self._on_login is not None:
            self._on_login(peer, name, principal)


def _credentials(authorization: str | None) -> tuple[str, str]:
    if not authorization:
        raise _refused("no credentials: log in with HTTP basic auth (curl -u USER:PASSWORD)")
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        raise _refused(f"unsupported authorization scheme {scheme[:20]!r}: use Basic")
    try:
        text = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise _refused("malformed basic credentials") from None
    name, sep, password = text.partition(":")
    if not sep or not name or not password:
        raise _refused("basic credentials need a user name and a password")
    return name, password


def _refused(why: str) -> N1qlError:
    return N1qlError(
        E_AUTH,
        f"Authentication failed: {why}",
        401,
        reason={"shardex_code": "AUTH_FAILED", "hint": "curl -u USER:PASSWORD ..."},
    )
