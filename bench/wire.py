"""Wire protocol benchmark: ``python -m bench.wire [--quick] [--duration S] [--only NAME]``.

The server runs in a separate process (its own core and event loop, as a real peer would);
the client is this process. Everything goes over loopback TCP through the full stack:
TcpTransport framing, msgspec encoding, authentication, Connection request matching.

Measures, each for ``--duration`` seconds (default 2):
- baseline: the same framing echoed over plain asyncio streams (no codec, no RPC), to show
  what this machine's kernel and event loop allow before shardex adds anything;
- round trips per second on one connection, one request at a time (64-byte payload),
  with latency percentiles;
- pipelined requests: N concurrent requests in flight on one connection;
- one-way throughput in MB/s with 64 KiB and 1 MiB payloads (time until the server has
  received the last byte).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import statistics
import time
from multiprocessing.connection import Connection as Pipe
from typing import Any

from bench.common.runner import BenchContext, Row, run_suite
from shardex.net import Connection, Message, RpcServer, TcpTransport, connect

SECRET = "bench-secret"


class BenchEcho(Message):
    payload: bytes


class BenchBlob(Message):
    data: bytes


class BenchFlush(Message):
    """One-way, after the blobs: the server answers once it has handled everything before."""

    seq: int


class BenchFlushed(Message):
    seq: int
    received_bytes: int


# --- server process --------------------------------------------------------------------


def _serve(pipe: Pipe) -> None:
    asyncio.run(_serve_async(pipe))


async def _serve_async(pipe: Pipe) -> None:
    server = RpcServer(TcpTransport(), SECRET, name="bench-server")
    received = {"bytes": 0}

    @server.route(BenchEcho)
    async def echo(msg: BenchEcho, conn: Connection) -> Message:
        return msg

    @server.route(BenchBlob)
    async def blob(msg: BenchBlob, conn: Connection) -> None:
        received["bytes"] += len(msg.data)

    @server.route(BenchFlush)
    async def flush(msg: BenchFlush, conn: Connection) -> None:
        await conn.send(BenchFlushed(seq=msg.seq, received_bytes=received["bytes"]))
        received["bytes"] = 0

    async def raw_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Baseline: the same length-prefixed framing on plain streams, no codec, no RPC.
        try:
            while True:
                header = await reader.readexactly(4)
                writer.write(header + await reader.readexactly(int.from_bytes(header, "big")))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    raw = await asyncio.start_server(raw_echo, "127.0.0.1", 0)
    raw_port = raw.sockets[0].getsockname()[1]
    pipe.send((await server.start("127.0.0.1:0"), f"127.0.0.1:{raw_port}"))
    # Run until the parent says stop (or dies: recv raises EOFError).
    loop = asyncio.get_running_loop()
    with contextlib.suppress(EOFError):
        await loop.run_in_executor(None, pipe.recv)
    raw.close()
    await server.stop()


class ServerProcess:
    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._pipe, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child,), daemon=True)
        self._proc.start()
        if not self._pipe.poll(30):
            raise RuntimeError("bench server did not start within 30 s")
        self.address, self.raw_address = self._pipe.recv()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._pipe.send("stop")
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.terminate()


_server: ServerProcess | None = None


def server() -> ServerProcess:
    global _server
    if _server is None:
        _server = ServerProcess()
    return _server


async def _client(handlers: dict[type[Message], Any] | None = None) -> Connection:
    return await connect(
        TcpTransport(), server().address, SECRET, name="bench-client", handlers=handlers
    )


def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# --- benchmarks --------------------------------------------------------------------------


async def round_trip(ctx: BenchContext) -> list[Row]:
    conn = await _client()
    msg = BenchEcho(payload=b"p" * 64)
    for _ in range(200):  # warm-up: connection, decoder, caches
        await conn.request(msg, 5)
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + ctx.duration
    now = start
    while now < deadline:
        await conn.request(msg, 5)
        t = time.perf_counter()
        latencies.append(t - now)
        now = t
    elapsed = now - start
    await conn.close()
    latencies.sort()
    return [
        {
            "bench": "round trip, sequential",
            "payload_B": 64,
            "in_flight": 1,
            "ops_per_s": len(latencies) / elapsed,
            "MB_per_s": "",
            "p50_us": _pct(latencies, 0.5) * 1e6,
            "p99_us": _pct(latencies, 0.99) * 1e6,
            "mean_us": statistics.fmean(latencies) * 1e6,
        }
    ]


async def baseline_round_trip(ctx: BenchContext) -> list[Row]:
    """The floor set by asyncio streams and the kernel on this machine, for comparison."""
    host, port = server().raw_address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    frame = (64).to_bytes(4, "big") + b"p" * 64
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + ctx.duration
    now = start
    while now < deadline:
        writer.write(frame)
        await reader.readexactly(len(frame))
        t = time.perf_counter()
        latencies.append(t - now)
        now = t
    elapsed = now - start
    writer.close()
    latencies.sort()
    return [
        {
            "bench": "baseline: raw streams echo",
            "payload_B": 64,
            "in_flight": 1,
            "ops_per_s": len(latencies) / elapsed,
            "MB_per_s": "",
            "p50_us": _pct(latencies, 0.5) * 1e6,
            "p99_us": _pct(latencies, 0.99) * 1e6,
            "mean_us": statistics.fmean(latencies) * 1e6,
        }
    ]


async def _pipelined_once(ctx: BenchContext, in_flight: int) -> Row:
    conn = await _client()
    msg = BenchEcho(payload=b"p" * 64)
    await asyncio.gather(*(conn.request(msg, 5) for _ in range(in_flight)))  # warm-up
    count = 0
    deadline = time.perf_counter() + ctx.duration

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            await conn.request(msg, 30)
            count += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.perf_counter() - start
    await conn.close()
    return {
        "bench": "requests, pipelined",
        "payload_B": 64,
        "in_flight": in_flight,
        "ops_per_s": count / elapsed,
        "MB_per_s": "",
        "p50_us": "",
        "p99_us": "",
        "mean_us": elapsed / count * in_flight * 1e6,
    }


async def pipelined(ctx: BenchContext) -> list[Row]:
    return [await _pipelined_once(ctx, n) for n in (16, 128)]


async def _one_way_once(ctx: BenchContext, size: int) -> Row:
    flushed: asyncio.Queue[BenchFlushed] = asyncio.Queue()

    async def on_flushed(msg: BenchFlushed, conn: Connection) -> None:
        await flushed.put(msg)

    conn = await _client({BenchFlushed: on_flushed})
    blob = BenchBlob(data=b"b" * size)
    for _ in range(8):  # warm-up
        await conn.send(blob)
    await conn.send(BenchFlush(seq=0))
    await asyncio.wait_for(flushed.get(), 30)

    frames = 0
    start = time.perf_counter()
    deadline = start + ctx.duration
    while time.perf_counter() < deadline:
        await conn.send(blob)  # waits when the socket buffer is full: backpressure
        frames += 1
    await conn.send(BenchFlush(seq=1))
    done = await asyncio.wait_for(flushed.get(), 60)
    elapsed = time.perf_counter() - start
    await conn.close()
    assert done.received_bytes == frames * size, (done.received_bytes, frames * size)
    return {
        "bench": "one-way throughput",
        "payload_B": size,
        "in_flight": "",
        "ops_per_s": frames / elapsed,
        "MB_per_s": done.received_bytes / elapsed / 1e6,
        "p50_us": "",
        "p99_us": "",
        "mean_us": elapsed / frames * 1e6,
    }


async def one_way(ctx: BenchContext) -> list[Row]:
    return [await _one_way_once(ctx, size) for size in (64 * 1024, 1024 * 1024)]


def main() -> None:
    try:
        run_suite(
            "wire", [baseline_round_trip, round_trip, pipelined, one_way], description=__doc__ or ""
        )
    finally:
        if _server is not None:
            _server.stop()


if __name__ == "__main__":
    main()
