"""``TlsMemoryComm``: the node side of a TLS connection, run in memory over a plain
transport. Driven here byte by byte from a client ``ssl.SSLObject`` through a recording
transport, so every way records can be cut by the network is exercised the same way each
run: the handshake and records split across reads, several records in one read, frames
split across records, the peer's close_notify, a record that does not decrypt."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardex.errors import ConnectionClosed
from shardex.net.certs import make_ca, make_node_cert
from shardex.net.framing import header
from shardex.net.tcp_comm import TcpComm
from shardex.net.tcp_tls import TlsMemoryComm
from shardex.net.tls import TlsConfig


class Wire(asyncio.Transport):
    """What the comm writes, kept; and whether it closed or aborted."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = bytearray()
        self.closed = self.aborted = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sent += data

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, TlsConfig]]:
    ca = tmp_path_factory.mktemp("ca")
    other = tmp_path_factory.mktemp("other")
    make_ca(ca)
    make_ca(other)
    for name in ("n1", "n2"):
        make_node_cert(ca, name, ["127.0.0.1"])
    make_node_cert(other, "stranger", ["127.0.0.1"])
    yield {
        "n1": TlsConfig.for_node(ca, "n1"),
        "n2": TlsConfig.for_node(ca, "n2"),
        "user": TlsConfig(ca=Path(ca / "ca.pem")),
        "stranger": TlsConfig(
            ca=Path(ca / "ca.pem"),
            cert=TlsConfig.for_node(other, "stranger").cert,
            key=TlsConfig.for_node(other, "stranger").key,
        ),
    }


class Pair:
    """A client ``SSLObject`` and the server comm, connected through ``Wire``."""

    def __init__(self, server: TlsConfig, client: TlsConfig) -> None:
        self.connected: list[TcpComm] = []
        self.handshake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.comm = TlsMemoryComm(
            1 << 20, self.connected.append, server.server_context(), self.handshake
        )
        self.wire = Wire()
        self.comm.connection_made(self.wire)
        self.c_in, self.c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = client.client_context().wrap_bio(
            self.c_in, self.c_out, server_hostname="127.0.0.1"
        )

    def to_server(self, data: bytes, step: int = 1) -> None:
        """``data`` to the comm, ``step`` bytes per read."""
        for i in range(0, len(data), step):
            self.comm.data_received(data[i : i + step])

    def from_server(self) -> bytes:
        """What the comm sent since the last call, decrypted (handshake records and tickets
        taken in along the way)."""
        self.c_in.write(bytes(self.wire.sent))
        self.wire.sent.clear()
        out = bytearray()
        while True:
            try:
                chunk = self.tls.read(1 << 16)
            except ssl.SSLWantReadError:
                return bytes(out)
            if not chunk:
                return bytes(out)
            out += chunk

    def shake(self, step: int = 1) -> None:
        for _ in range(20):
            try:
                self.tls.do_handshake()
            except ssl.SSLWantReadError:
                pass
            else:
                self.to_server(self.c_out.read(), step)
                return
            self.to_server(self.c_out.read(), step)
            self.c_in.write(bytes(self.wire.sent))
            self.wire.sent.clear()
        raise AssertionError("the handshake did not finish")

    def records(self, *payloads: bytes) -> bytes:
        """Each payload encrypted as one record."""
        out = b""
        for p in payloads:
            self.tls.write(p)
            out += self.c_out.read()
        return out


def _frame(body: bytes) -> bytes:
    return header(len(body)) + body


async def test_frames_cut_across_records_and_reads_arrive_whole_and_in_order(
    pki: dict[str, TlsConfig],
) -> None:
    p = Pair(pki["n1"], pki["n2"])
    p.shake(step=1)  # every handshake record cut into one-byte reads
    assert p.handshake.done() and p.handshake.exception() is None
    assert p.connected == [p.comm]
    assert p.comm.encrypted and p.comm.peer_node == "n2"  # the client's certificate
    big = bytes(range(256)) * 300  # 76,800 bytes: five records
    stream = _frame(b"one") + _frame(b"two") + _frame(big) + _frame(b"four")
    # Records cut at odd places through the frames: the second record ends mid-header.
    wire = p.records(stream[:5], stream[5:13], stream[13:])
    p.to_server(wire[:7], step=1)
    p.to_server(wire[7:], step=4093)
    frames = [await p.comm.read() for _ in range(4)]
    assert frames == [b"one", b"two", big, b"four"]


async def test_replies_go_out_as_records_the_client_reads(pki: dict[str, TlsConfig]) -> None:
    p = Pair(pki["n1"], pki["user"])
    p.shake(step=512)
    assert p.comm.peer_node is None  # a user's client: no certificate
    big = b"x" * 100_000
    await p.comm.write(b"small")
    await p.comm.write(big)
    assert p.from_server() == _frame(b"small") + _frame(big)


async def test_the_clients_close_notify_ends_the_stream(pki: dict[str, TlsConfig]) -> None:
    p = Pair(pki["n1"], pki["user"])
    p.shake()
    with pytest.raises(ssl.SSLWantReadError):
        p.tls.unwrap()  # our close_notify written, the server's awaited
    p.to_server(p.c_out.read())
    with pytest.raises(ConnectionClosed, match="closed by peer"):
        await p.comm.read()
    assert p.wire.closed


async def test_close_sends_a_close_notify(pki: dict[str, TlsConfig]) -> None:
    p = Pair(pki["n1"], pki["user"])
    p.shake()
    close = asyncio.create_task(p.comm.close())
    await asyncio.sleep(0)
    assert p.wire.closed
    p.comm.connection_lost(None)
    await close
    p.c_in.write(bytes(p.wire.sent))
    # A close_notify reads as the end of the data (without one: SSLWantReadError).
    assert p.tls.read(1) == b""


async def test_a_record_that_does_not_decrypt_ends_the_connection(
    pki: dict[str, TlsConfig],
) -> None:
    p = Pair(pki["n1"], pki["user"])
    p.shake()
    record = bytearray(p.records(_frame(b"tampered")))
    record[-1] ^= 1  # the tag no longer matches
    p.to_server(bytes(record), step=len(record))
    with pytest.raises(ConnectionClosed, match="lost"):
        await p.comm.read()
    assert p.wire.aborted


async def test_a_client_certificate_of_another_ca_fails_the_handshake(
    pki: dict[str, TlsConfig],
) -> None:
    p = Pair(pki["n1"], pki["stranger"])
    p.shake(step=64)
    assert isinstance(p.handshake.exception(), ssl.SSLCertVerificationError)
    assert p.connected == []  # never handed to the RPC layer
    # The client learns why: the alert went out.
    with pytest.raises(ssl.SSLError, match="UNKNOWN_CA"):
        p.from_server()
