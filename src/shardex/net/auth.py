"""Mutual challenge-response authentication over a shared cluster secret.

    server -> client  Challenge(server_name, protocol_version, nonce_s)
    client -> server  AuthResponse(client_name, protocol_version, nonce_c,
                                   proof_c = HMAC(secret, transcript("client")))
    server -> client  AuthOk(proof_s = HMAC(secret, transcript("server")))
                   or ErrorReply(AUTH_FAILED) and close

transcript(role) = "shardex-auth-v1" | role | nonce_s | nonce_c | server_name | client_name,
each part length-prefixed. Both nonces make every proof fresh (no replay); the role label
keeps a server's proof from ever being usable as a client's (no reflection). The secret never
crosses the wire. All frames are envelopes of kind ONEWAY with id 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable

from shardex.errors import (
    AuthFailed,
    ConfigError,
    ConnectionClosed,
    ErrorCode,
    NodeUnavailable,
    ProtocolError,
    ShardexError,
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
    decode_frame,
    encode_frame,
    message_type_name,
)
from shardex.net.transport import Comm

log = logging.getLogger(__name__)

NONCE_BYTES = 32
DEFAULT_AUTH_TIMEOUT = 5.0
_LABEL = b"shardex-auth-v1"

NonceSource = Callable[[int], bytes]


def check_secret(secret: str) -> bytes:
    """The HMAC key for ``secret``; an empty secret is a configuration mistake, not a key."""
    if not isinstance(secret, str) or not secret:
        raise ConfigError(
            "cluster secret must be a non-empty string",
            details={"hint": "set the same cluster secret on every node and client"},
        )
    return secret.encode()


def _transcript(role: bytes, nonce_s: bytes, nonce_c: bytes, server: str, client: str) -> bytes:
    parts = (_LABEL, role, nonce_s, nonce_c, server.encode(), client.encode())
    # Length prefixes make the encoding injective: no two part lists share a transcript.
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def _proof(key: bytes, role: bytes, ch: Challenge, resp_nonce: bytes, client: str) -> bytes:
    msg = _transcript(role, ch.nonce, resp_nonce, ch.server_name, client)
    return hmac.new(key, msg, hashlib.sha256).digest()


async def _send(comm: Comm, msg: Message) -> None:
    await comm.write(encode_frame(Envelope(Kind.ONEWAY, 0, msg)))


async def _recv(comm: Comm) -> Message:
    return decode_frame(await comm.read()).body


async def server_handshake(
    comm: Comm,
    secret: str,
    *,
    name: str,
    timeout: float = DEFAULT_AUTH_TIMEOUT,
    nonce_source: NonceSource = secrets.token_bytes,
) -> str:
    """Authenticate the client on a fresh comm; return its name.

    On any failure the comm is closed and ``AuthFailed`` (or ``ConnectionClosed`` /
    ``ProtocolError``) is raised; the failure is logged with the peer address. Nothing the
    client sends other than the single ``AuthResponse`` is read before it has authenticated.
    """
    key = check_secret(secret)
    peer = comm.peer_address
    challenge = Challenge(
        server_name=name, protocol_version=PROTOCOL_VERSION, nonce=nonce_source(NONCE_BYTES)
    )
    try:
        async with asyncio.timeout(timeout):
            await _send(comm, challenge)
            reply = await _recv(comm)
            if not isinstance(reply, AuthResponse):
                raise AuthFailed("expected AuthResponse", details={"got": message_type_name(reply)})
            if reply.protocol_version != PROTOCOL_VERSION:
                raise AuthFailed(
                    "protocol version mismatch",
                    details={"ours": PROTOCOL_VERSION, "theirs": reply.protocol_version},
                )
            expected = _proof(key, b"client", challenge, reply.nonce, reply.client_name)
            if len(reply.nonce) != NONCE_BYTES or not hmac.compare_digest(expected, reply.proof):
                raise AuthFailed("bad proof", details={"client_name": reply.client_name})
            server_proof = _proof(key, b"server", challenge, reply.nonce, reply.client_name)
            await _send(comm, AuthOk(proof=server_proof))
            return reply.client_name
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


class ClientHandshake:
    """The client's side of the handshake, its steps without the I/O: the asyncio
    ``client_handshake`` and the blocking ``shardex.net.blocking.BlockingConn`` feed it the
    server's frames and send what it returns, so both check and answer alike.

        response = hs.answer(challenge)   # the server's first frame -> our AuthResponse
        server_name = hs.finish(ok)       # the server's last frame -> its name
    """

    __slots__ = ("_challenge", "_key", "_nonce_c", "_source", "name", "peer")

    def __init__(self, secret: str, *, name: str, peer: str, nonce_source: NonceSource) -> None:
        self._key = check_secret(secret)
        self.name = name
        self.peer = peer
        self._source = nonce_source
        self._challenge: Challenge | None = None
        self._nonce_c = b""

    def answer(self, challenge: Message) -> AuthResponse:
        """The server's first frame, checked - a ``Challenge`` in our protocol version, else
        the error it carries (``ErrorReply``) or ``ProtocolError`` - and our answer: our
        nonce and proof."""
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
        return AuthResponse(
            client_name=self.name,
            protocol_version=PROTOCOL_VERSION,
            nonce=nonce_c,
            proof=_proof(self._key, b"client", challenge, nonce_c, self.name),
        )

    def finish(self, ok: Message) -> str:
        """The server's last frame: its proof (``AuthOk``), else the error it sent. Returns
        the server's name."""
        peer, challenge = self.peer, self._challenge
        assert challenge is not None, "answer() first"
        if isinstance(ok, ErrorReply):
            raise ShardexError.from_wire(ok.code, ok.message, {**ok.details, "peer": peer})
        if not isinstance(ok, AuthOk):
            raise ProtocolError(
                f"{peer} sent {message_type_name(ok)} instead of AuthOk",
                details={"peer": peer},
            )
        expected = _proof(self._key, b"server", challenge, self._nonce_c, self.name)
        if not hmac.compare_digest(expected, ok.proof):
            raise AuthFailed(
                f"server {peer} failed to prove it knows the cluster secret",
                details={"peer": peer, "server_name": challenge.server_name},
            )
        return challenge.server_name

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
    secret: str,
    *,
    name: str,
    timeout: float = DEFAULT_AUTH_TIMEOUT,
    nonce_source: NonceSource = secrets.token_bytes,
) -> str:
    """Authenticate to the server (and it to us) on a fresh comm; return the server's name.

    Raises ``AuthFailed`` if either side's proof fails, ``ProtocolError`` for a peer that
    does not speak this protocol, ``NodeUnavailable`` if the handshake times out or the
    server hangs up. The comm is closed on any failure.
    """
    hs = ClientHandshake(secret, name=name, peer=comm.peer_address, nonce_source=nonce_source)
    try:
        async with asyncio.timeout(timeout):
            await _send(comm, hs.answer(await _recv(comm)))
            return hs.finish(await _recv(comm))
    except (TimeoutError, ShardexError) as e:
        comm.abort()
        failure = hs.failed(e, timeout)
        if failure is e:
            raise
        raise failure from (None if isinstance(e, TimeoutError) else e)
