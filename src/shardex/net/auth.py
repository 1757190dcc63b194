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


def check_challenge(challenge: Message, peer: str) -> Challenge:
    """The server's first frame, checked: a ``Challenge`` in our protocol version, else the
    error it carries (``ErrorReply``) or ``ProtocolError``. Shared by ``client_handshake``
    and the client's blocking scan sockets (``shardex.client.direct_conn``)."""
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
    return challenge


def auth_response(key: bytes, challenge: Challenge, nonce_c: bytes, name: str) -> AuthResponse:
    """The client's answer to ``challenge``: its nonce and proof."""
    return AuthResponse(
        client_name=name,
        protocol_version=PROTOCOL_VERSION,
        nonce=nonce_c,
        proof=_proof(key, b"client", challenge, nonce_c, name),
    )


def check_auth_ok(
    ok: Message, key: bytes, challenge: Challenge, nonce_c: bytes, name: str, peer: str
) -> None:
    """The server's last frame: its proof (``AuthOk``), else the error it sent."""
    if isinstance(ok, ErrorReply):
        raise ShardexError.from_wire(ok.code, ok.message, {**ok.details, "peer": peer})
    if not isinstance(ok, AuthOk):
        raise ProtocolError(
            f"{peer} sent {message_type_name(ok)} instead of AuthOk",
            details={"peer": peer},
        )
    expected = _proof(key, b"server", challenge, nonce_c, name)
    if not hmac.compare_digest(expected, ok.proof):
        raise AuthFailed(
            f"server {peer} failed to prove it knows the cluster secret",
            details={"peer": peer, "server_name": challenge.server_name},
        )


def handshake_timed_out(peer: str, timeout: float) -> NodeUnavailable:
    return NodeUnavailable(
        f"handshake with {peer} timed out after {timeout}s",
        details={"address": peer, "timeout": timeout},
    )


def handshake_closed(peer: str) -> NodeUnavailable:
    return NodeUnavailable(
        f"{peer} closed the connection during the handshake", details={"address": peer}
    )


def log_auth_failure(peer: str, e: ShardexError) -> None:
    if isinstance(e, AuthFailed):
        log.warning("authentication with %s failed: %s", peer, e.message)


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
    key = check_secret(secret)
    peer = comm.peer_address
    try:
        async with asyncio.timeout(timeout):
            challenge = check_challenge(await _recv(comm), peer)
            nonce_c = nonce_source(NONCE_BYTES)
            await _send(comm, auth_response(key, challenge, nonce_c, name))
            check_auth_ok(await _recv(comm), key, challenge, nonce_c, name, peer)
            return challenge.server_name
    except TimeoutError:
        comm.abort()
        raise handshake_timed_out(peer, timeout) from None
    except ConnectionClosed as e:
        comm.abort()
        raise handshake_closed(peer) from e
    except ShardexError as e:
        log_auth_failure(peer, e)
        comm.abort()
        raise
