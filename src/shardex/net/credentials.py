"""Who connects, and what each side keeps to prove it.

Two kinds of peers authenticate to a node (docs/decisions/0090-node-and-user-identity.md):

- a node (or an internal tool) proves it knows the cluster's node secret (``NodeSecret``);
- a user proves it knows its password (``UserLogin``) by a SCRAM exchange (RFC 5802) whose
  Hi() function is Argon2id: the server keeps only ``UserCredential`` (salt, Argon2
  parameters, StoredKey = H(ClientKey), ServerKey) and the password never crosses the wire.

The server side of a handshake yields a ``Principal``; every ``Connection`` an ``RpcServer``
accepts carries it (``conn.principal``) and the server's ``Authorizer`` checks each message a
user sends against it before any handler runs. Where users are kept, and what their roles
allow, are above this package: the node injects a ``UserDirectory`` and an ``Authorizer``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol

from argon2.low_level import Type, hash_secret_raw

from shardex.errors import ConfigError

if TYPE_CHECKING:
    from shardex.net.messages import Message

NODE: Literal["node"] = "node"
USER: Literal["user"] = "user"
SALT_BYTES = 16
KEY_BYTES = 32


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSecret:
    """A node's (or an internal tool's) credential: the cluster's node secret."""

    secret: str = dataclasses.field(repr=False)  # never in a log or a traceback

    def key(self) -> bytes:
        """The HMAC key; an empty secret is a configuration mistake, not a key."""
        if not isinstance(self.secret, str) or not self.secret:
            raise ConfigError(
                "cluster secret must be a non-empty string",
                details={"hint": "set the same cluster secret on every node and internal tool"},
            )
        return self.secret.encode()


@dataclasses.dataclass(frozen=True, slots=True)
class UserLogin:
    """A user's credential: name and password (the password stays on this side)."""

    username: str
    password: str = dataclasses.field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.username, str) or not self.username:
            raise ConfigError(
                f"user name must be a non-empty string, got {self.username!r}",
                details={"value": self.username, "hint": "connect(..., username='alice')"},
            )
        if not isinstance(self.password, str) or not self.password:
            raise ConfigError(
                f"user {self.username!r}: the password must be a non-empty string",
                details={"user": self.username, "hint": "pass password='...'"},
            )


Credentials = NodeSecret | UserLogin


def as_credentials(value: str | Credentials) -> Credentials:
    """A plain string is the node secret (what every node and internal tool passes)."""
    if isinstance(value, NodeSecret | UserLogin):
        return value
    return NodeSecret(value)


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    """Who is on the other end of an accepted connection. ``roles`` are the user's role
    strings (``"data_reader(orders)"``), read by the authorizer; nodes have none."""

    kind: Literal["node", "user"]
    name: str
    roles: tuple[str, ...] = ()

    @property
    def is_node(self) -> bool:
        return self.kind == NODE

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class Argon2Params:
    """Argon2id cost parameters (memory in KiB). The default is OWASP's recommendation
    (19 MiB, 2 passes, 1 lane): a login costs the client ~25 ms, a guess as much."""

    time_cost: int = 2
    memory_cost: int = 19456
    parallelism: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class UserCredential:
    """What the server keeps of a user: enough to check a proof, not to make one."""

    name: str
    roles: tuple[str, ...]
    salt: bytes
    params: Argon2Params
    stored_key: bytes  # H(ClientKey)
    server_key: bytes  # HMAC(SaltedPassword, "Server Key")


class UserDirectory(Protocol):
    """The server's lookup of users (the node reads its committed cluster state)."""

    def lookup_user(self, name: str) -> UserCredential | None: ...

    async def lookup_missing(self, name: str) -> UserCredential | None:
        """A name ``lookup_user`` does not know, looked up once more where the users are
        kept (a node's copy may lag behind a user made a moment ago, or be empty while it
        starts); None where there is nothing further to ask."""
        ...


# (principal, message) -> None, or raises the refusal (``AuthFailed``) to answer with.
Authorizer = Callable[[Principal, "Message"], None]


def salted_password(password: str, salt: bytes, params: Argon2Params) -> bytes:
    """SCRAM's SaltedPassword with Argon2id as Hi()."""
    return hash_secret_raw(
        password.encode(),
        salt,
        time_cost=params.time_cost,
        memory_cost=params.memory_cost,
        parallelism=params.parallelism,
        hash_len=KEY_BYTES,
        type=Type.ID,
    )


def client_key(salted: bytes) -> bytes:
    return _hmac(salted, b"Client Key")


def stored_key(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def server_key(salted: bytes) -> bytes:
    return _hmac(salted, b"Server Key")


def make_credential(
    name: str,
    password: str,
    roles: tuple[str, ...],
    *,
    salt: bytes,
    params: Argon2Params | None = None,
) -> UserCredential:
    """The record a server keeps for ``name`` with ``password`` (``salt``: fresh random
    bytes, ``SALT_BYTES`` long)."""
    UserLogin(name, password)  # the same checks as a login's
    p = params or Argon2Params()
    salted = salted_password(password, salt, p)
    return UserCredential(
        name=name,
        roles=roles,
        salt=salt,
        params=p,
        stored_key=stored_key(client_key(salted)),
        server_key=server_key(salted),
    )


def password_matches(cred: UserCredential, password: str) -> bool:
    """Whether ``password`` is ``cred``'s: the server's check of a password it is given in
    full (HTTP basic auth) instead of a proof of it. One Argon2id derivation (~25 ms of
    CPU): callers run it off the event loop."""
    key = stored_key(client_key(salted_password(password, cred.salt, cred.params)))
    return hmac.compare_digest(key, cred.stored_key)


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))
