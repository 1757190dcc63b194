"""Mutual challenge-response authentication, on the handshake functions directly."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shardex.errors import AuthFailed, ConfigError, NodeUnavailable, ProtocolError
from shardex.net import auth
from shardex.net.auth import client_handshake, server_handshake
from shardex.net.messages import (
    AuthOk,
    AuthResponse,
    Challenge,
    Envelope,
    ErrorReply,
    Kind,
    Ping,
    UserSalt,
    decode_frame,
    encode_frame,
)
from shardex.net.tcp import TcpTransport
from shardex.net.transport import Comm, Listener

pytestmark = pytest.mark.timeout(20)

SECRET = "correct horse battery staple"


class Recorder(Comm):
    """Wraps a comm and keeps every frame it writes (to inspect what crossed the wire)."""

    def __init__(self, inner: Comm) -> None:
        self.inner = inner
        self.sent: list[bytes] = []

    async def read(self) -> bytes:
        return await self.inner.read()

    async def write(self, frame: bytes) -> None:
        self.sent.append(frame)
        await self.inner.write(frame)

    async def close(self) -> None:
        await self.inner.close()

    def abort(self) -> None:
        self.inner.abort()

    @property
    def closed(self) -> bool:
        return self.inner.closed

    @property
    def local_address(self) -> str:
        return self.inner.local_address

    @property
    def peer_address(self) -> str:
        return self.inner.peer_address


async def pair() -> tuple[Comm, Comm, Listener]:
    """A connected (client comm, server comm, listener) over loopback TCP."""
    transport = TcpTransport()
    accepted: asyncio.Future[Comm] = asyncio.get_running_loop().create_future()

    async def on_comm(comm: Comm) -> None:
        accepted.set_result(comm)

    listener = await transport.listen("127.0.0.1:0", on_comm)
    client = await transport.connect(listener.address, timeout=2)
    return client, await asyncio.wait_for(accepted, 2), listener


async def test_mutual_handshake_names_and_no_secret_on_the_wire() -> None:
    client, server, listener = await pair()
    rc, rs = Recorder(client), Recorder(server)
    server_peer, client_peer = await asyncio.gather(
        server_handshake(rs, SECRET, name="node-a"),
        client_handshake(rc, SECRET, name="client-b"),
    )
    assert (server_peer.name, server_peer.kind, client_peer) == ("client-b", "node", "node-a")
    wire = b"".join(rc.sent + rs.sent)
    assert SECRET.encode() not in wire
    kinds = [type(decode_frame(f).body) for f in rs.sent + rc.sent]
    assert kinds == [Challenge, AuthOk, AuthResponse]
    await client.close()
    await server.close()
    await listener.stop()


async def test_wrong_secret_fails_on_both_sides_and_server_logs_peer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="shardex.net.auth")
    client, server, listener = await pair()
    results = await asyncio.gather(
        server_handshake(server, SECRET, name="node-a"),
        client_handshake(client, "wrong", name="intruder"),
        return_exceptions=True,
    )
    assert all(isinstance(r, AuthFailed) for r in results), results
    assert client.closed and server.closed
    assert any(
        "authentication failed for " + server.peer_address in r.getMessage() for r in caplog.records
    )
    await listener.stop()


async def test_client_rejects_a_server_that_cannot_prove_the_secret() -> None:
    client, server, listener = await pair()

    async def impostor() -> None:
        # Knows the protocol but not the secret: accepts anything, sends a made-up proof.
        ch = Challenge(server_name="evil", protocol_version=1, nonce=b"n" * 32)
        await server.write(encode_frame(Envelope(Kind.ONEWAY, 0, ch)))
        decode_frame(await server.read())
        await server.write(encode_frame(Envelope(Kind.ONEWAY, 0, AuthOk(proof=b"p" * 32))))

    task = asyncio.create_task(impostor())
    with pytest.raises(AuthFailed, match="failed to prove"):
        await client_handshake(client, SECRET, name="c")
    await task
    assert client.closed
    await server.close()
    await listener.stop()


async def test_replayed_response_fails_against_a_fresh_challenge() -> None:
    # Record a good AuthResponse, then replay it to a second server session.
    client, server, listener = await pair()
    rc = Recorder(client)
    await asyncio.gather(
        server_handshake(server, SECRET, name="s"), client_handshake(rc, SECRET, name="c")
    )
    recorded = rc.sent[0]
    assert isinstance(decode_frame(recorded).body, AuthResponse)

    client2, server2, listener2 = await pair()
    task = asyncio.create_task(server_handshake(server2, SECRET, name="s"))
    decode_frame(await client2.read())  # fresh challenge, ignored
    await client2.write(recorded)
    with pytest.raises(AuthFailed):
        await task
    reply = decode_frame(await client2.read())
    assert reply.kind is Kind.ERROR and isinstance(reply.body, ErrorReply)
    assert reply.body.code == "AUTH_FAILED" and reply.body.message == "authentication failed"
    for c in (client, server, client2):
        await c.close()
    await listener.stop()
    await listener2.stop()


async def test_silent_peer_is_cut_off_after_the_auth_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="shardex.net.auth")
    client, server, listener = await pair()
    with pytest.raises(AuthFailed, match="timed out"):
        await server_handshake(server, SECRET, name="s", timeout=0.05)
    assert server.closed
    assert any("timed out" in r.getMessage() for r in caplog.records)
    decode_frame(await client.read())  # the challenge; then the hang-up
    with pytest.raises(Exception):  # noqa: B017 (EOF or reset, both ConnectionClosed)
        await client.read()
    await listener.stop()


async def test_client_times_out_on_a_mute_server() -> None:
    client, server, listener = await pair()
    with pytest.raises(NodeUnavailable, match="timed out"):
        await client_handshake(client, SECRET, name="c", timeout=0.05)
    await server.close()
    await listener.stop()


async def test_anything_but_auth_response_is_rejected_before_processing() -> None:
    client, server, listener = await pair()
    task = asyncio.create_task(server_handshake(server, SECRET, name="s"))
    decode_frame(await client.read())
    await client.write(encode_frame(Envelope(Kind.REQUEST, 1, Ping())))
    with pytest.raises(AuthFailed, match="expected AuthResponse"):
        await task
    await client.close()
    await listener.stop()


async def test_client_refuses_a_peer_speaking_another_protocol() -> None:
    client, server, listener = await pair()
    await server.write(encode_frame(Envelope(Kind.ONEWAY, 0, Ping())))
    with pytest.raises(ProtocolError):
        await client_handshake(client, SECRET, name="c")
    await server.close()
    await listener.stop()


def test_empty_secret_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        auth.check_secret("")


def test_proofs_differ_by_role_and_by_every_input() -> None:
    key = auth.NodeSecret(SECRET).key()
    ch = Challenge(server_name="s", protocol_version=1, nonce=b"a" * 32)
    base = auth._proof(key, b"client", ch, b"b" * 32, "c")
    assert base != auth._proof(key, b"server", ch, b"b" * 32, "c")
    assert base != auth._proof(key, b"client", ch, b"c" * 32, "c")
    assert base != auth._proof(key, b"client", ch, b"b" * 32, "d")
    assert base != auth._proof(b"other", b"client", ch, b"b" * 32, "c")
    # Length prefixes: shifting bytes between adjacent fields changes the transcript.
    ch2 = Challenge(server_name="sc", protocol_version=1, nonce=b"a" * 32)
    assert auth._proof(key, b"client", ch2, b"b" * 32, "") != base


@pytest.mark.parametrize(
    ("time_cost", "memory_cost", "parallelism", "salt"),
    [(10_000, 64, 1, b"s" * 16), (1, 1 << 30, 1, b"s" * 16), (1, 8, 4, b"s" * 16), (1, 64, 1, b"")],
)
def test_a_client_refuses_argon2_work_a_server_should_not_ask_for(
    time_cost: int, memory_cost: int, parallelism: int, salt: bytes
) -> None:
    hs = auth.ClientHandshake(
        auth.UserLogin("ann", "pw"), name="ann", peer="p", nonce_source=lambda n: b"n" * n
    )
    hs.answer(Challenge(server_name="s", protocol_version=1, nonce=b"a" * 32))
    hostile = UserSalt(
        salt=salt, time_cost=time_cost, memory_cost=memory_cost, parallelism=parallelism
    )
    with pytest.raises(ProtocolError, match="out of bounds"):
        hs.next(hostile)
