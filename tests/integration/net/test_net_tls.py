"""TLS on the TCP transport, real sockets on 127.0.0.1: mutual TLS between nodes, users'
clients verifying the server, the failures (wrong CA, expired certificate, plaintext to a
TLS port and TLS to a plaintext one), on asyncio's loop, on uvloop and on the blocking
sockets that direct KV and scans use."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from shardex.errors import AuthFailed, ConnectionClosed, NodeUnavailable, RequestTimeout
from shardex.net import Connection, Message, RpcServer, TcpTransport, connect
from shardex.net.blocking import BlockingConn
from shardex.net.certs import make_ca, make_node_cert
from shardex.net.messages import Kind
from shardex.net.tls import TlsConfig
from shardex.net.transport import Comm

pytestmark = pytest.mark.timeout(30)

SECRET = "correct horse battery staple"


class Echo(Message, tag="test.tls.Echo"):
    text: str


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, TlsConfig]]:
    """One cluster CA with nodes n1, n2 (loopback), and a second CA with a node of its own;
    an expired certificate of the first CA; a node without loopback addresses."""
    cluster = tmp_path_factory.mktemp("cluster-ca")
    other = tmp_path_factory.mktemp("other-ca")
    make_ca(cluster)
    make_ca(other)
    for name in ("n1", "n2"):
        make_node_cert(cluster, name, ["127.0.0.1"])
    make_node_cert(other, "stranger", ["127.0.0.1"])
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    make_node_cert(cluster, "old", ["127.0.0.1"], not_before=long_ago, days=1)
    make_node_cert(cluster, "far", ["10.9.9.9", "db.example.com"])
    yield {
        "n1": TlsConfig.for_node(cluster, "n1"),
        "n2": TlsConfig.for_node(cluster, "n2"),
        "old": TlsConfig.for_node(cluster, "old"),
        "far": TlsConfig.for_node(cluster, "far"),
        "user": TlsConfig(ca=cluster / "ca.pem"),
        "user-pem": TlsConfig(ca_pem=(cluster / "ca.pem").read_text()),
        "other-user-pem": TlsConfig(ca_pem=(other / "ca.pem").read_text()),
        "stranger": TlsConfig.for_node(other, "stranger"),
        "other-user": TlsConfig(ca=other / "ca.pem"),
    }


async def _server(tls: TlsConfig | None) -> tuple[RpcServer, str, list[Comm]]:
    """An RPC server answering ``Echo``; the comms it served, for their TLS facts."""
    server = RpcServer(TcpTransport(tls=tls), SECRET, name="srv")
    comms: list[Comm] = []

    async def echo(msg: Echo, conn: Connection) -> Echo:
        comms.append(conn._comm)
        return Echo(text=msg.text.upper())

    server.route(Echo, echo)
    return server, await server.start("127.0.0.1:0"), comms


async def _echo(tls: TlsConfig | None, address: str, text: str = "hi") -> Connection:
    conn = await connect(TcpTransport(tls=tls), address, SECRET, name="cli", timeout=5)
    assert (await conn.request(Echo(text=text), 5, expect=Echo)).text == text.upper()
    return conn


async def _mutual_and_user(pki: dict[str, TlsConfig]) -> None:
    server, address, comms = await _server(pki["n1"])
    try:
        node = await _echo(pki["n2"], address)
        user = await _echo(pki["user"], address)
        # The server saw node n2's certificate on the first, nothing on the second.
        assert [c.peer_node for c in comms] == ["n2", None]
        assert all(c.encrypted for c in comms)
        # Both clients verified the server's certificate: it names node n1.
        assert node._comm.peer_node == user._comm.peer_node == "n1"
        await node.close()
        await user.close()
    finally:
        await server.stop()


async def test_mutual_tls_between_nodes_and_a_user_client(pki: dict[str, TlsConfig]) -> None:
    await _mutual_and_user(pki)


def test_mutual_tls_on_uvloop(pki: dict[str, TlsConfig]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_mutual_and_user(pki))


async def test_a_ca_given_as_pem_text_verifies_the_server(pki: dict[str, TlsConfig]) -> None:
    """As the pipeline's read tasks on other hosts connect: the CA's text, no file."""
    server, address, _ = await _server(pki["n1"])
    try:
        conn = await _echo(pki["user-pem"], address)
        assert conn._comm.peer_node == "n1" and conn._comm.encrypted
        await conn.close()
        with pytest.raises(AuthFailed, match="cannot verify the certificate"):
            await _echo(pki["other-user-pem"], address)
    finally:
        await server.stop()


def test_the_ca_is_a_file_or_pem_text(tmp_path: Path) -> None:
    from shardex.errors import ConfigError

    with pytest.raises(ConfigError, match="one of them"):
        TlsConfig()
    with pytest.raises(ConfigError, match="one of them"):
        TlsConfig(ca=tmp_path / "ca.pem", ca_pem="-----BEGIN CERTIFICATE-----")
    with pytest.raises(ConfigError, match="CA given as PEM"):
        TlsConfig(ca_pem="-----BEGIN CERTIFICATE-----\nnot base64\n").client_context()


@pytest.mark.parametrize(
    "loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_both_ends_run_tls_in_memory_over_plain_transports(
    pki: dict[str, TlsConfig], loop_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither end uses the loop's TLS: the dialling comm runs it in memory as the accepted
    one does (``TlsMemoryComm``), over a plain transport, on both loops; a frame of many
    records (50 KB) and its reply cross whole, and the client's records are decrypted by
    its comm, not the loop."""
    from shardex.net import tcp_tls

    decrypted: list[int] = []
    received = tcp_tls.TlsMemoryComm.data_received

    def counted(self: Any, data: bytes) -> None:
        decrypted.append(len(data))
        received(self, data)

    monkeypatch.setattr(tcp_tls.TlsMemoryComm, "data_received", counted)

    async def go() -> None:
        server, address, comms = await _server(pki["n1"])
        try:
            conn = await _echo(pki["n2"], address, "x" * 50_000)
            for comm in (conn._comm, comms[0]):
                assert isinstance(comm, tcp_tls.TlsMemoryComm)
                assert comm._transport is not None
                assert comm._transport.get_extra_info("sslcontext") is None
            assert conn._comm.peer_node == "n1" and comms[0].peer_node == "n2"
            await conn.close()
        finally:
            await server.stop()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(go())
    # Both ends' handshake records and the 50 KB request and reply.
    assert sum(decrypted) > 2 * 50_000


async def test_plaintext_comm_has_no_peer_node() -> None:
    server, address, comms = await _server(None)
    try:
        conn = await _echo(None, address)
        assert comms[0].peer_node is None and not comms[0].encrypted
        await conn.close()
    finally:
        await server.stop()


async def test_client_with_another_ca_refuses_the_server(pki: dict[str, TlsConfig]) -> None:
    server, address, _ = await _server(pki["n1"])
    try:
        with pytest.raises(AuthFailed) as e:
            await _echo(pki["other-user"], address)
        assert address in e.value.message
        assert "cannot verify the certificate" in e.value.message
        assert e.value.details["address"] == address
    finally:
        await server.stop()


async def test_server_refuses_a_node_certificate_of_another_ca(
    pki: dict[str, TlsConfig], caplog: pytest.LogCaptureFixture
) -> None:
    server, address, _ = await _server(pki["n1"])
    # It trusts our CA (so it verifies the server) but presents a stranger's certificate.
    stranger = TlsConfig(ca=pki["user"].ca, cert=pki["stranger"].cert, key=pki["stranger"].key)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="shardex.net.tcp_tls"),
            pytest.raises(AuthFailed) as e,
        ):
            await _echo(stranger, address)
        assert address in e.value.message
        # TLS 1.3: the server checks our certificate after our side of the handshake is done
        # and only closes; the client says what that means, the server's log says why.
        assert "did not accept our certificate" in e.value.message
        assert any("unable to get local issuer" in r.getMessage() for r in caplog.records)
        assert any("TLS handshake with" in r.getMessage() for r in caplog.records)
        # The server still serves the others.
        await (await _echo(pki["n2"], address)).close()
    finally:
        await server.stop()


async def test_expired_server_certificate_is_refused(pki: dict[str, TlsConfig]) -> None:
    server, address, _ = await _server(pki["old"])
    try:
        with pytest.raises(AuthFailed) as e:
            await _echo(pki["user"], address)
        assert "certificate has expired" in e.value.message
        assert address in e.value.message
    finally:
        await server.stop()


async def test_expired_client_certificate_is_refused(
    pki: dict[str, TlsConfig], caplog: pytest.LogCaptureFixture
) -> None:
    server, address, _ = await _server(pki["n1"])
    try:
        with (
            caplog.at_level(logging.WARNING, logger="shardex.net.tcp_tls"),
            pytest.raises(AuthFailed) as e,
        ):
            await _echo(pki["old"], address)
        assert "did not accept our certificate" in e.value.message
        assert address in e.value.message
        assert any("certificate has expired" in r.getMessage() for r in caplog.records)
    finally:
        await server.stop()


async def test_certificate_for_other_addresses_is_refused(pki: dict[str, TlsConfig]) -> None:
    server, address, _ = await _server(pki["far"])
    try:
        with pytest.raises(AuthFailed) as e:
            await _echo(pki["user"], address)
        assert "mismatch" in e.value.message
    finally:
        await server.stop()


async def test_plaintext_client_is_refused_cleanly_and_the_server_keeps_serving(
    pki: dict[str, TlsConfig], caplog: pytest.LogCaptureFixture
) -> None:
    server, address, _ = await _server(pki["n1"])
    try:
        with (
            caplog.at_level(logging.WARNING, logger="shardex.net.tcp_tls"),
            pytest.raises(AuthFailed) as e,
        ):
            await _echo(None, address)
        assert "requires TLS" in e.value.message
        assert "CA" in e.value.details["hint"]
        assert any("refused a plaintext connection" in r.getMessage() for r in caplog.records)
        # Bytes that are not TLS at all (an HTTP request) get the same refusal.
        reader, writer = await asyncio.open_connection(*address.rsplit(":", 1))
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        reply = await asyncio.wait_for(reader.read(), 10)
        assert b"requires TLS" in reply
        writer.close()
        await (await _echo(pki["n2"], address)).close()
    finally:
        await server.stop()


async def test_a_client_silent_in_the_tls_handshake_is_dropped(
    pki: dict[str, TlsConfig], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that starts a TLS handshake and stops sending is cut off once the
    handshake's time is up, and the server keeps serving."""
    from shardex.net import tcp_tls

    monkeypatch.setattr(tcp_tls, "_TLS_HANDSHAKE_TIMEOUT", 0.3)
    server, address, comms = await _server(pki["n1"])
    try:
        with caplog.at_level(logging.WARNING, logger="shardex.net.tcp_tls"):
            reader, writer = await asyncio.open_connection(*address.rsplit(":", 1))
            writer.write(bytes([0x16, 0x03, 0x01]))  # the start of a ClientHello, no more
            # The server hangs up (EOF), however long that takes on a loaded machine.
            assert await asyncio.wait_for(reader.read(), 20) == b""
            writer.close()
        assert any(
            "TLS handshake with" in r.getMessage() and "TimeoutError" in r.getMessage()
            for r in caplog.records
        )
        assert comms == []  # never handed to the RPC layer
        await (await _echo(pki["n2"], address)).close()
    finally:
        await server.stop()


async def test_tls_client_to_a_plaintext_port_is_told_so(pki: dict[str, TlsConfig]) -> None:
    server, address, _ = await _server(None)
    try:
        with pytest.raises(NodeUnavailable) as e:
            await _echo(pki["user"], address)
        assert "does not speak TLS" in e.value.message and address in e.value.message
        await (await _echo(None, address)).close()  # and it still serves plaintext
    finally:
        await server.stop()


# --- the blocking sockets (direct KV and scans) ---------------------------------------------


def _open(address: str, tls: TlsConfig | None) -> BlockingConn:
    return BlockingConn.open(
        address,
        SECRET,
        name="blocking",
        timeout=5.0,
        max_frame=1 << 20,
        nonce=secrets.token_bytes,
        tls=tls,
    )


def _blocking_echo(conn: BlockingConn, text: str) -> str:
    rid = conn.new_request_id()
    msg = Echo(text=text)
    conn.send(msg, rid, Kind.REQUEST)
    return conn.reply(rid, msg, 5.0, Echo).text


def _until_gone(conn: BlockingConn, timeout: float = 10.0) -> bool:
    """Poll ``peer_gone`` until it says so (the node's close reaches the socket soon after
    its stop) or the deadline passes."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if conn.peer_gone():
            return True
        time.sleep(0.02)
    return False


async def test_blocking_socket_over_tls(pki: dict[str, TlsConfig]) -> None:
    server, address, comms = await _server(pki["n1"])
    try:
        conn = await asyncio.to_thread(_open, address, pki["user"])
        assert conn.peer_label == f"srv@{conn.peer}"
        assert await asyncio.to_thread(_blocking_echo, conn, "a" * 70_000) == "A" * 70_000
        # Idle and alive: the session tickets the server sent are no end of the stream.
        assert not await asyncio.to_thread(conn.peer_gone)
        assert await asyncio.to_thread(_blocking_echo, conn, "again") == "AGAIN"
        assert comms[0].encrypted and comms[0].peer_node is None
        node = await asyncio.to_thread(_open, address, pki["n2"])
        assert await asyncio.to_thread(_blocking_echo, node, "n") == "N"
        assert comms[-1].peer_node == "n2"
        await server.stop()
        assert await asyncio.to_thread(_until_gone, conn)
        node.close()
        with pytest.raises(ConnectionClosed):
            await asyncio.to_thread(_blocking_echo, node, "x")
    finally:
        await server.stop()


async def test_blocking_socket_failures(pki: dict[str, TlsConfig]) -> None:
    server, address, _ = await _server(pki["n1"])
    plain, plain_address, _ = await _server(None)
    old, old_address, _ = await _server(pki["old"])
    try:
        with pytest.raises(AuthFailed, match="cannot verify the certificate"):
            await asyncio.to_thread(_open, address, pki["other-user"])
        with pytest.raises(AuthFailed, match="did not accept our certificate"):
            await asyncio.to_thread(_open, address, pki["old"])
        with pytest.raises(AuthFailed, match="certificate has expired"):
            await asyncio.to_thread(_open, old_address, pki["user"])
        with pytest.raises(AuthFailed, match="requires TLS"):
            await asyncio.to_thread(_open, address, None)
        with pytest.raises(NodeUnavailable, match="does not speak TLS"):
            await asyncio.to_thread(_open, plain_address, pki["user"])
    finally:
        await server.stop()
        await plain.stop()
        await old.stop()


def test_listening_needs_a_certificate(pki: dict[str, TlsConfig], tmp_path: Path) -> None:
    from shardex.errors import ConfigError

    async def go() -> None:
        with pytest.raises(ConfigError, match="certificate"):
            await RpcServer(TcpTransport(tls=pki["user"]), SECRET, name="s").start("127.0.0.1:0")
        missing = TlsConfig(ca=tmp_path / "nope.pem")
        with pytest.raises(ConfigError, match="does not exist"):
            missing.client_context()

    asyncio.run(go())


class Silent(Message, tag="test.tls.Silent"):
    """A request the server never answers: its handler waits until the server stops."""


async def test_blocking_tls_read_ends_at_its_deadline(pki: dict[str, TlsConfig]) -> None:
    """A TLS read bounded by the kernel's SO_RCVTIMEO alone would never end (the SSL layer
    retries the blocking socket's EAGAIN): a node that stops answering, e.g. behind a cut
    link, would hold the caller for good. The deadline must end it, and the socket stays
    usable."""
    server, address, _ = await _server(pki["n1"])
    stop = asyncio.Event()

    async def never(msg: Silent, conn: Connection) -> Message | None:
        await stop.wait()
        return None

    server.route(Silent, never)
    try:
        conn = await asyncio.to_thread(_open, address, pki["user"])

        def ask_silent() -> None:
            rid = conn.new_request_id()
            msg = Silent()
            conn.send(msg, rid, Kind.REQUEST)
            conn.reply(rid, msg, 0.5, Echo)

        with pytest.raises(RequestTimeout):
            await asyncio.wait_for(asyncio.to_thread(ask_silent), 30)
        assert await asyncio.to_thread(_blocking_echo, conn, "still") == "STILL"
        await asyncio.to_thread(conn.close)
    finally:
        stop.set()
        await server.stop()
