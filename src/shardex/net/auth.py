"""Mutual challenge-response authentication: a node by the cluster's node secret, a user by
a SCRAM exchange over its Argon2id-derived keys.

    server -> client  Challenge(server_name, protocol_version, nonce_s)
  a node (or internal tool):
    client -> server  AuthResponse(client_name, protocol_version, nonce_c,
                                   proof_c = HMAC(secret, transcript("client")))
    server -> client  AuthOk(proof_s = HMAC(secret, transcript("server")))
  a user (RFC 5802 with Argon2id as Hi(); ``shardex.net.credentials``):
    client -> server  UserHello(username, protocol_version, nonce_c)
    server -> client  UserSalt(salt, argon2 parameters)
    client -> server  UserProof(ClientKey XOR HMAC(StoredKey, auth))
    server -> client  AuthOk(HMAC(ServerKey, auth))
  either way, on failure:  ErrorReply(AUTH_FAILED) and close

transcript(role) = "shardex-auth-v1" | role | nonce_s | nonce_c | server_name | client_name,
each part length-prefixed; a user's auth message is transcript("user") followed by the salt
and the parameters. Both nonces make every proof fresh (no replay); the role label keeps a
server's proof from ever being usable as a client's (no reflection). Neither the secret nor
a password crosses the wire, and the server keeps no password, only StoredKey and ServerKey.
All frames are envelopes of kind ONEWAY with id 0.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable

from shardex.errors import (
    AuthFailed,
    ConnectionClosed,
    ErrorCode,
    NodeUnavailable,
    ProtocolError,
    ShardexError,
)
from shardex.net.credentials import (
    NODE,
    SALT_BYTES,
    USER,
    Argon2Params,
    Credentials,
    NodeSecret,
    Principal,
    UserCredential,
    UserDirectory,
    UserLogin,
    as_credentials,
    client_key,
    salted_password,
    server_key,
    stored_key,
    xor,
)
from shardex.net.messages import (
    PROTOCOL_VERSION,
    AuthOk,
    AuthResponse,
    Challenge,
    Envelope,
    ErrorReply,
    Kind,
    Message,
    UserHello,
    UserProof,
    UserSalt,
    decode_frame,
    encode_frame,
    message_type_name,
)
from shardex.net.transport import Comm

log = logging.getLogger(__name__)

NONCE_BYTES = 32
DEFAULT_AUTH_TIMEOUT = 5.0
_LABEL = b"shardex-auth-v1"
# A server may ask a client for at most this much Argon2 work per login: a hostile server
# must not make a client spend a minute or a gigabyte on one connect.
MAX_TIME_COST = 16
MAX_MEMORY_COST = 1 << 20  # KiB: 1 GiB

NonceSource = Callable[[int], bytes]
# (peer address, user name, principal or None when the login failed): the audit trail's feed.
LoginObserver = Callable[[str, str, Principal | None], None]


def check_secret(secret: str | Credentials) -> Credentials:
    """``secret`` as credentials, checked: an empty node secret is a configuration mistake,
    not a key (raises ``ConfigError``)."""
    creds = as_credentials(secret)
    if isinstance(creds, NodeSecret):
        creds.key()
    return creds


def _transcript(role: bytes, nonce_s: bytes, nonce_c: bytes, server: str, client: str) -> bytes:
    parts = (_LABEL, role, nonce_s, nonce_c, server.encode(), client.encode())
    # Length prefixes make the encoding injective: no two part lists share a transcript.
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def _proof(key: bytes, role: bytes, ch: Challenge, resp_nonce: bytes, client: str) -> bytes:
    msg = _transcript(role, ch.nonce, resp_nonce, ch.server_name, client)
    return hmac.new(key, msg, hashlib.sha256).digest()


def _auth_message(ch: Challenge, nonce_c: bytes, username: str, salt: UserSalt) -> bytes:
    """SCRAM's AuthMessage: both nonces, both names, the salt and the parameters the
    client derived its keys with (a server cannot swap them unnoticed)."""
    params = b"".join(
        v.to_bytes(8, "big") for v in (salt.time_cost, salt.memory_cost, salt.parallelism)
    )
    tail = (salt.salt, params)
    return _transcript(b"user", ch.nonce, nonce_c, ch.server_name, username) + b"".join(
        len(p).to_bytes(4, "big") + p for p in tail
    )


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


async def _send(comm: Comm, msg: Message) -> None:
    await comm.write(encode_frame(Envelope(Kind.ONEWAY, 0, msg)))


async def _recv(comm: Comm) -> Message:
    return decode_frame(await comm.read()).body


class _ServerSide:
    """The server's steps for one handshake, once the challenge is out."""

    def __init__(
        self,
        comm: Comm,
        node_key: bytes,
        challenge: Challenge,
        users: UserDirectory | None,
        on_login: LoginObserver | None,
    ) -> None:
        self.comm = comm
        self.node_key = node_key
        self.challenge = challenge
        self.users = users
        self.on_login = on_login

    async def run(self) -> Principal:
        reply = await _recv(self.comm)
        if isinstance(reply, AuthResponse | UserHello):
            if reply.protocol_version != PROTOCOL_VERSION:
                raise AuthFailed(
                    "protocol version mismatch",
                    details={"ours": PROTOCOL_VERSION, "theirs": reply.protocol_version},
                )
            if len(reply.nonce) != NONCE_BYTES:
                raise AuthFailed("bad nonce", details={"length": len(reply.nonce)})
        if isinstance(reply, AuthResponse):
            return await self._node(reply)
        if isinstance(reply, UserHello):
            return await self._user(reply)
        raise AuthFailed("expected AuthResponse", details={"got": message_type_name(reply)})

    async def _node(self, reply: AuthResponse) -> Principal:
        ch, key = self.challenge, self.node_key
        expected = _proof(key, b"client", ch, reply.nonce, reply.client_name)
        if not hmac.compare_digest(expected, reply.proof):
            raise AuthFailed("bad proof", details={"client_name": reply.client_name})
        await _send(
            self.comm, AuthOk(proof=_proof(key, b"server", ch, reply.nonce, reply.client_name))
        )
        return Principal(NODE, reply.client_name)

    async def _user(self, hello: UserHello) -> Principal:
        name = hello.username
        cred = None
        if self.users is not None:
            cred = self.users.lookup_user(name) or await self.users.lookup_missing(name)
        salt = self._salt_of(name, cred)
        await _send(self.comm, salt)
        proof = await _recv(self.comm)
        if not isinstance(proof, UserProof):
            raise AuthFailed("expected UserProof", details={"got": message_type_name(proof)})
        auth = _auth_message(self.challenge, hello.nonce, name, salt)
        # The same work for a name that is not a user (a key of its own that no proof
        # matches): the time taken does not tell which names exist either.
        key = cred.stored_key if cred is not None else _hmac(self.node_key, salt.salt)
        signature = _hmac(key, auth)
        matches = len(proof.proof) == len(signature) and hmac.compare_digest(
            stored_key(xor(proof.proof, signature)), key
        )
        if cred is None or not matches:
            self._observe(name, None)
            reason = "unknown user" if cred is None else "bad password proof"
            raise AuthFailed(reason, details={"user": name})
        await _send(self.comm, AuthOk(proof=_hmac(cred.server_key, auth)))
        principal = Principal(USER, name, cred.roles)
        self._observe(name, principal)
        return principal

    def _salt_of(self, name: str, cred: UserCredential | None) -> UserSalt:
        if cred is not None:
            salt, p = cred.salt, cred.params
        else:
            # Not a user: a salt derived from the node secret and the name, the same on every
            # attempt, with default parameters, so the answer looks like a real user's.
            salt = _hmac(self.node_key, b"unknown-user-salt|" + name.encode())[:SALT_BYTES]
            p = Argon2Params()
        return UserSalt(
            salt=salt, time_cost=p.time_cost, memory_cost=p.memory_cost, parallelism=p.parallelism
        )

    def _observe(self, name: str, principal: Principal | None) -> None:
        if self.on_login is not None:
            try:
                self.on_login(self.comm.peer_address, name, principal)
            except Exception:
                log.exception("login observer failed")


async def server_handshake(
    comm: Comm,
    secret: str | NodeSecret,
    *,
    name: str,
    timeout: float = DEFAULT_AUTH_TIMEOUT,
    nonce_source: NonceSource = secrets.token_bytes,
    users: UserDirectory | None = None,
    on_login: LoginObserver | None = None,
) -> Principal:
    """Authenticate the client on a fresh comm; return who it is.

    A node proves the node ``secret``; a user logs in against ``users`` (without a
    directory, user logins are refused). On any failure the comm is closed and
    ``AuthFailed`` (or ``ConnectionClosed`` / ``ProtocolError``) is raised; the failure is
    logged with the peer address. Nothing the client sends other than the handshake's
    frames is read before it has authenticated. ``on_login`` hears every user login attempt.
    """
    creds = check_secret(secret)
    if not isinstance(creds, NodeSecret):
        raise TypeError("a server authenticates with the node secret")
    peer = comm.peer_address
    challenge = Challenge(
        server_name=name, protocol_version=PROTOCOL_VERSION, nonce=nonce_source(NONCE_BYTES)
    )
    side = _ServerSide(comm, creds.key(), challenge, users, on_login)
    try:
        async with asyncio.timeout(timeout):
            await _send(comm, challenge)
            return await side.run()
    except TimeoutError:
        log.warning("authentication of %s timed out after %ss; closing", peer, timeout)
        comm.abort()
        raise AuthFailed(
            "authentication timed out", details={"peer": peer, "timeout": timeout}
        ) from None
    except AuthFailed as e:
        log.warning("authentication failed for %s: %s %s", peer, e.message, e.details)
        # The reason stays in our log; the peer learns only that it failed.
        await _reject(comm, peer)
        raise
    except ProtocolError as e:
        log.warning("authentication failed for %s: %s", peer, e)
        await _reject(comm, peer)
        raise AuthFailed("authentication failed", details={"peer": peer}) from e
    except ConnectionClosed:
        log.info("peer %s disconnected during authentication", peer)
        comm.abort()
        raise


async def _reject(comm: Comm, peer: str) -> None:
    notice = ErrorReply(
        code=ErrorCode.AUTH_FAILED.value, message="authentication failed", details={}
    )
    try:
        async with asyncio.timeout(1.0):
            await comm.write(encode_frame(Envelope(Kind.ERROR, 0, notice)))
            await comm.close()
    except (TimeoutError, ShardexError, OSError):
        pass
    comm.abort()


@functools.lru_cache(maxsize=64)
def _user_keys(password: str, salt: bytes, params: Argon2Params) -> tuple[bytes, bytes]:
    """(ClientKey, ServerKey) for a password under a salt: derived once per process. A client
    opens a connection per node and per calling thread (its direct sockets); Argon2 each time
    would cost every one of them ~25 ms. The keys stay in this process, as the password does."""
    salted = salted_password(password, salt, params)
    return client_key(salted), server_key(salted)


class ClientHandshake:
    """The client's side of the handshake, its steps without the I/O: the asyncio
    ``client_handshake`` and the blocking ``shardex.net.blocking.BlockingConn`` feed it the
    server's frames and send what it returns, so both check and answer alike.

        out = hs.answer(challenge)     # the server's first frame -> our first answer
        while out is not None:         # send it; the server's next frame -> our next
            out = hs.next(reply)       # answer, or None once the server proved itself
        hs.server_name
    """

    __slots__ = (
        "_auth",
        "_challenge",
        "_creds",
        "_nonce_c",
        "_server_key",
        "_source",
        "name",
        "peer",
        "server_name",
    )

    def __init__(
        self, secret: str | Credentials, *, name: str, peer: str, nonce_source: NonceSource
    ) -> None:
        self._creds = check_secret(secret)
        self.name = name
        self.peer = peer
        self._source = nonce_source
        self._challenge: Challenge | None = None
        self._nonce_c = b""
        self._auth = b""  # a user's auth message, once the salt is known
        self._server_key = b""
        self.server_name = ""

    def answer(self, challenge: Message) -> Message:
        """The server's first frame, checked - a ``Challenge`` in our protocol version, else
        the error it carries (``ErrorReply``) or ``ProtocolError`` - and our answer: a
        node's nonce and proof, or a user's name and nonce."""
        peer = self.peer
        if isinstance(challenge, ErrorReply):
            raise ShardexError.from_wire(challenge.code, challenge.message, challenge.details)
        if not isinstance(challenge, Challenge):
            raise ProtocolError(
                f"{peer} sent {message_type_name(challenge)} instead of Challenge",
                details={"peer": peer},
            )
        if challenge.protocol_version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"{peer} speaks protocol {challenge.protocol_version}, we speak {PROTOCOL_VERSION}",
                details={"peer": peer, "theirs": challenge.protocol_version},
            )
        self._challenge = challenge
        nonce_c = self._nonce_c = self._source(NONCE_BYTES)
        creds = self._creds
        if isinstance(creds, UserLogin):
            return UserHello(
                username=creds.username, protocol_version=PROTOCOL_VERSION, nonce=nonce_c
            )
        return AuthResponse(
            client_name=self.name,
            protocol_version=PROTOCOL_VERSION,
            nonce=nonce_c,
            proof=_proof(creds.key(), b"client", challenge, nonce_c, self.name),
        )

    def next(self, frame: Message) -> Message | None:
        """The server's next frame: a user's salt (answered with the proof), else its own
        proof (``AuthOk``: None, we are done) or the error it sent."""
        peer, challenge, creds = self.peer, self._challenge, self._creds
        assert challenge is not None, "answer() first"
        if isinstance(frame, ErrorReply):
            raise ShardexError.from_wire(frame.code, frame.message, {**frame.details, "peer": peer})
        if isinstance(frame, UserSalt) and isinstance(creds, UserLogin) and not self._auth:
            return self._user_proof(creds, challenge, frame)
        if not isinstance(frame, AuthOk) or (isinstance(creds, UserLogin) and not self._auth):
            raise ProtocolError(
                f"{peer} sent {message_type_name(frame)} out of turn in the handshake",
                details={"peer": peer},
            )
        if isinstance(creds, UserLogin):
            expected = _hmac(self._server_key, self._auth)
            what = f"user {creds.username!r}'s server key"
        else:
            expected = _proof(creds.key(), b"server", challenge, self._nonce_c, self.name)
            what = "the cluster secret"
        if not hmac.compare_digest(expected, frame.proof):
            raise AuthFailed(
                f"server {peer} failed to prove it knows {what}",
                details={"peer": peer, "server_name": challenge.server_name},
            )
        self.server_name = challenge.server_name
        return None

    def _user_proof(self, creds: UserLogin, challenge: Challenge, salt: UserSalt) -> UserProof:
        if not (  # Argon2's own limits too: 8 KiB per lane, a salt of 8 bytes or more
            0 < salt.time_cost <= MAX_TIME_COST
            and 0 < salt.parallelism <= 64
            and 8 * salt.parallelism <= salt.memory_cost <= MAX_MEMORY_COST
            and 8 <= len(salt.salt) <= 64
        ):
            raise ProtocolError(
                f"{self.peer} asked for Argon2 parameters out of bounds",
                details={
                    "peer": self.peer,
                    "time_cost": salt.time_cost,
                    "memory_cost": salt.memory_cost,
                },
            )
        params = Argon2Params(salt.time_cost, salt.memory_cost, salt.parallelism)
        ck, self._server_key = _user_keys(creds.password, salt.salt, params)
        self._auth = _auth_message(challenge, self._nonce_c, creds.username, salt)
        return UserProof(proof=xor(ck, _hmac(stored_key(ck), self._auth)))

    def failed(self, exc: BaseException, timeout: float) -> BaseException:
        """What a handshake that raised ``exc`` raises instead (the caller closes the comm):
        a timeout or a hang-up is ``NodeUnavailable``, an ``AuthFailed`` is logged."""
        peer = self.peer
        if isinstance(exc, TimeoutError):
            return NodeUnavailable(
                f"handshake with {peer} timed out after {timeout}s",
                details={"address": peer, "timeout": timeout},
            )
        if isinstance(exc, ConnectionClosed):
            return NodeUnavailable(
                f"{peer} closed the connection during the handshake", details={"address": peer}
            )
        if isinstance(exc, AuthFailed):
            log.warning("authentication with %s failed: %s", peer, exc.message)
        return exc


async def client_handshake(
    comm: Comm,
    secret: str | Credentials,
    *,
    name: str,
    timeout: float = DEFAULT_AUTH_TIMEOUT,
    nonce_source: NonceSource = secrets.token_bytes,
) -> str:
    """Authenticate to the server (and it to us) on a fresh comm; return the server's name.

    ``secret`` is the node secret (a string or ``NodeSecret``) or a ``UserLogin``. Raises
    ``AuthFailed`` if either side's proof fails, ``ProtocolError`` for a peer that does not
    speak this protocol, ``NodeUnavailable`` if the handshake times out or the server hangs
    up. The comm is closed on any failure.
    """
    hs = ClientHandshake(secret, name=name, peer=comm.peer_address, nonce_source=nonce_source)
    try:
        async with asyncio.timeout(timeout):
            out: Message | None = hs.answer(await _recv(comm))
            while out is not None:
                await _send(comm, out)
                out = hs.next(await _recv(comm))
            return hs.server_name
    except (TimeoutError, ShardexError) as e:
        comm.abort()
        failure = hs.failed(e, timeout)
        if failure is e:
            raise
        raise failure from (None if isinstance(e, TimeoutError) else e)
