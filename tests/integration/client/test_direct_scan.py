"""Scans over a blocking socket in the calling thread (``shardex.client.direct_scan``), over
the real-TCP two-node setup of ``test_scan_service.py``: the same rows as the loop path, the
same back-pressure, failover, errors and messages; half-read and nested scans, ``close()``
from another thread, and the loop path kept for the simulator and ``direct_scans=False``.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from shardex.api.scan import IndexScan, IndexScanStarted
from shardex.client import Client, connect
from shardex.client import scan as client_scan
from shardex.client.direct_scan import DirectScanResult
from shardex.client.scan import ScanResult
from shardex.errors import AuthFailed, ConnectionClosed, ErrorCode, RequestTimeout, ShardexError
from shardex.net import Connection, RpcServer, TcpTransport
from shardex.sim.network import SimNetwork
from shardex.sim.transport import SimTransport
from tests.integration.scan.test_scan_request_plus import fake_high_seqnos
from tests.integration.scan_env import KS, SECRET, Env, _until, as_rows, oracle_rows


async def _client(address: str | list[str], **kw: Any) -> Client:
    return await asyncio.to_thread(lambda: connect(address, secret=SECRET, **kw))


@pytest.fixture
async def loop_client(env: Env) -> AsyncIterator[Client]:
    """A client of ``env``'s nodes whose scans take the loop path (the reference)."""
    c = await _client(env.nodes["n1"].address, direct_scans=False)
    yield c
    await asyncio.to_thread(c.close)


def _rows(client: Client, *args: Any, **kw: Any) -> tuple[type, list[dict[str, Any]]]:
    res = client.scan(KS, *args, **kw)
    return type(res), list(res)


def _error(fn: Callable[[], Any]) -> ShardexError:
    with pytest.raises(ShardexError) as info:
        fn()
    return info.value


def _same_error(a: ShardexError, b: ShardexError) -> None:
    assert (type(a), a.code, a.message) == (type(b), b.code, b.message)


def _scan_streams(env: Env, client: Client) -> int:
    """Streams the nodes have open towards ``client``'s scan connections."""
    name = client.name + "/scan"
    return sum(
        1 for n in env.nodes.values() for (c, _) in n.streams._streams if c.peer_name == name
    )


# -- rows --------------------------------------------------------------------------------


async def test_rows_are_the_loop_paths_for_every_kind_of_scan(
    env: Env, loop_client: Client
) -> None:
    rng = random.Random(21)
    ts = await env.round(rng, 300)
    fake_high_seqnos(env, [])
    assert env.client is not None
    direct = env.client
    cases: list[tuple[str, Any, dict[str, Any]]] = [
        ("by_name", None, {}),
        ("by_name", [{"low": ["bob"], "high": ["dee"], "inclusion": "low"}], {}),
        ("by_name", [{"low": ["ann", 1], "high": ["ann", 3]}, {"low": ["eve"]}], {}),
        ("by_age", [{"low": [1], "high": [3], "inclusion": "neither"}], {}),
        ("by_city", [{"low": ["oslo"], "high": ["rome"]}], {}),
        ("#primary", [{"low": ["doc1"], "high": ["doc3"]}], {}),
    ]
    kinds: list[dict[str, Any]] = [
        {"consistency": "at_plus", "at": ts},
        {"consistency": "at_plus", "at": ts, "limit": 7, "offset": 3},
        {"consistency": "at_plus", "at": ts, "ordered": False},
        {"consistency": "at_plus", "at": ts, "covering": False},
        {"consistency": "not_bounded", "limit": 50},
        {"consistency": "request_plus"},
        {"consistency": "request_plus", "offset": 5, "ordered": False, "covering": False},
    ]
    checked = 0
    for name, spans, _ in cases:
        for kw in kinds:
            kind_d, got = await asyncio.to_thread(_rows, direct, name, spans, **kw)
            kind_l, want = await asyncio.to_thread(_rows, loop_client, name, spans, **kw)
            assert kind_d is DirectScanResult and kind_l is ScanResult
            if kw.get("ordered", True):
                assert got == want, (name, kw)
            else:  # slices interleave as they arrive: the same rows, not the same order
                assert sorted(map(repr, got)) == sorted(map(repr, want)), (name, kw)
            checked += len(got)
    assert checked > 400  # not a comparison of empty results
    # And against the oracle, for one multi-slice case.
    docs = env.ks.documents_at(ts)
    _, got = await asyncio.to_thread(_rows, direct, "by_name", None, "at_plus", ts)
    assert as_rows(got) == oracle_rows(env.defs["by_name"], docs, None)


async def test_many_blocks_and_query_contexts_read_the_same(env: Env, loop_client: Client) -> None:
    ts = await env.many_in_paris()
    assert env.client is not None
    direct = env.client
    _, got = await asyncio.to_thread(_rows, direct, "#primary", None, "at_plus", ts)
    _, want = await asyncio.to_thread(_rows, loop_client, "#primary", None, "at_plus", ts)
    assert len(got) == 12_000 and got == want

    def in_ctx(c: Client) -> list[dict[str, Any]]:
        with c.query_context() as ctx:
            return list(ctx.scan(KS, "by_city", consistency="at_plus", at=ts, limit=500))

    assert await asyncio.to_thread(in_ctx, direct) == await asyncio.to_thread(in_ctx, loop_client)


# -- back-pressure, abandoned and nested scans -------------------------------------------


async def test_a_slow_reader_is_sent_its_credit_and_no_more(env: Env) -> None:
    ts = await env.many_in_paris()
    assert env.client is not None
    client = env.client
    res = await asyncio.to_thread(client.scan, KS, "#primary", None, "at_plus", ts)
    assert isinstance(res, DirectScanResult)
    blocks = res.blocks()
    first = await asyncio.to_thread(next, blocks)
    out = env.nodes["n1"].streams
    (stream,) = [s for (c, _), s in out._streams.items() if c.peer_name == client.name + "/scan"]
    await _until(lambda: stream.credit.available <= 0 and stream.blocks >= 1 + 4)
    await asyncio.sleep(0.2)  # time to overrun, were credits not respected
    assert stream.blocks == 1 + 4
    second = await asyncio.to_thread(next, blocks)  # one read: one credit, one more block
    await _until(lambda: stream.blocks >= 1 + 4 + 1)
    await asyncio.sleep(0.2)
    assert stream.blocks == 1 + 4 + 1
    rest = await asyncio.to_thread(lambda: [e for b in blocks for e in b])
    assert len(first) + len(second) + len(rest) == 12_000
    assert out.open_streams == 0


async def test_a_scan_abandoned_half_read_then_a_new_scan_on_that_socket(env: Env) -> None:
    ts = await env.many_in_paris()
    assert env.client is not None
    client = env.client
    want = oracle_rows(env.defs["#primary"], env.ks.documents_at(ts), None)

    def on_one_thread() -> list[list[tuple[Any, str]]]:
        out = []
        res = client.scan(KS, "#primary", None, "at_plus", ts)
        it = iter(res)
        for _ in range(3000):  # past the reply's entries: blocks stream, some still unread
            next(it)
        del it  # dropped, not closed: the generator's end cancels the stream
        sockets = dict(client._sockets._local.conns)  # type: ignore[union-attr]
        # An error half-way: the same.
        try:
            with client.scan(KS, "#primary", None, "at_plus", ts) as res2:
                for i, _ in enumerate(res2):
                    if i == 4000:
                        raise KeyError("the caller's own error")
        except KeyError:
            pass
        for limit in (None, 10):
            out.append(as_rows(list(client.scan(KS, "#primary", None, "at_plus", ts, limit))))
        # Still the same sockets: the frames left behind were skipped, not fatal.
        assert client._sockets._local.conns == sockets  # type: ignore[union-attr]
        return out

    full, first10 = await asyncio.to_thread(on_one_thread)
    assert full == want and first10 == want[:10]
    await _until(lambda: _scan_streams(env, client) == 0)


async def test_a_scan_nested_in_a_streaming_one_takes_the_loop_path(env: Env) -> None:
    ts = await env.many_in_paris()
    assert env.client is not None
    client = env.client
    want = oracle_rows(env.defs["#primary"], env.ks.documents_at(ts), None)

    def nested() -> tuple[list[Any], list[Any], type, type]:
        outer = client.scan(KS, "#primary", None, "at_plus", ts)
        it = iter(outer)
        head = [next(it) for _ in range(3000)]
        inner = client.scan(KS, "#primary", None, "at_plus", ts)
        inner_rows = list(inner)
        outer_rows = head + list(it)
        after = client.scan(KS, "#primary", None, "at_plus", ts, limit=5)
        list(after)
        return as_rows(outer_rows), as_rows(inner_rows), type(inner), type(after)

    outer, inner, inner_type, after_type = await asyncio.to_thread(nested)
    assert outer == want and inner == want
    assert inner_type is ScanResult  # the socket was busy with the outer scan's stream
    assert after_type is DirectScanResult  # and free again once that one ended


# -- failover ------------------------------------------------------------------------------


async def test_a_node_that_refuses_or_drops_the_scan_fails_over_like_the_loop_path(
    env: Env,
) -> None:
    ts = await env.round(random.Random(22), 100)
    dropper = RpcServer(TcpTransport(), SECRET, name="dropper")

    async def drop(msg: IndexScan, conn: Connection) -> None:
        conn.abort()  # the node dies with the scan in hand: no reply, no row

    dropper.route(IndexScan, drop)
    dropped = await dropper.start("127.0.0.1:0")
    refused = await _refused_address()
    n1 = env.nodes["n1"].address
    want = oracle_rows(env.defs["by_name"], env.ks.documents_at(ts), None)
    try:
        for direct in (True, False):
            c = await _client([n1, refused, dropped], direct_scans=direct)
            try:
                # Its scans start at the client's node: make that the dead one, then the dropper.
                for first in (1, 2):
                    c.rpc.current = first
                    c._scans.targets.prefer.clear()
                    kind, rows = await asyncio.to_thread(_rows, c, "by_name", None, "at_plus", ts)
                    assert as_rows(rows) == want, (direct, first)
                    assert kind is (DirectScanResult if direct else ScanResult)
            finally:
                await asyncio.to_thread(c.close)
    finally:
        await dropper.stop()


async def test_a_socket_the_node_closed_since_the_last_scan_is_replaced(env: Env) -> None:
    ts = await env.round(random.Random(23), 60)
    assert env.client is not None and env.client._sockets is not None
    client, direct = env.client, env.client._sockets
    one_thread = ThreadPoolExecutor(1)  # both scans on one thread: its sockets
    loop = asyncio.get_running_loop()

    def scan() -> int:
        return len(list(client.scan(KS, "by_city", None, "at_plus", ts)))

    try:
        n = await loop.run_in_executor(one_thread, scan)
        before = list(direct._all)
        assert before and not any(c.closed for c in before)
        name = client.name + "/scan"
        for node in env.nodes.values():  # the nodes drop the client's scan connections
            for c in node.server.connections:
                if c.peer_name == name:
                    await c.close()
        assert await loop.run_in_executor(one_thread, scan) == n
        # The dead socket was found dead on use and replaced by a new one to that node.
        assert any(c.closed for c in before)
        assert {c.address for c in direct._all if not c.closed} >= {
            c.address for c in before if c.closed
        }
    finally:
        one_thread.shutdown()


async def _refused_address() -> str:
    """A loopback port nobody listens on (bound, then closed)."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    return f"127.0.0.1:{port}"


# -- errors ----------------------------------------------------------------------------


async def test_a_wrong_secret_gives_the_loop_paths_auth_error(env: Env) -> None:
    address = env.nodes["n1"].address
    errors = []
    for direct in (True, False):
        c = Client([address], "w" * 32, direct_scans=direct)
        try:
            errors.append(await asyncio.to_thread(_error, lambda c=c: list(c.scan(KS, "by_name"))))
        finally:
            await asyncio.to_thread(c.close)
    assert isinstance(errors[0], AuthFailed)
    _same_error(errors[0], errors[1])


async def test_scan_timeouts_are_the_loop_paths(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that answers and then sends nothing: SCAN_TIMEOUT after the block wait; one
    that never answers: the reply's RequestTimeout. The same errors and words both ways."""
    monkeypatch.setattr(client_scan, "REPLY_MARGIN", 0.0)
    quiet = RpcServer(TcpTransport(), SECRET, name="quiet")
    hang = asyncio.Event()

    async def answer(msg: IndexScan, conn: Connection) -> IndexScanStarted:
        if msg.index == "hangs":
            await hang.wait()
        return IndexScanStarted(scan_id=msg.scan_id, index_id="ks/quiet", desc=[False])

    quiet.route(IndexScan, answer)
    address = await quiet.start("127.0.0.1:0")
    try:
        errors: dict[tuple[bool, str], ShardexError] = {}
        for direct in (True, False):
            c = await _client(address, direct_scans=direct, request_timeout=0.2)
            try:
                for index in ("quiet", "hangs"):
                    errors[(direct, index)] = await asyncio.to_thread(
                        _error, lambda c=c, i=index: list(c.scan(KS, i, timeout=0.3))
                    )
                # The socket stays usable after a timeout, as the loop path's connection.
                errors[(direct, "again")] = await asyncio.to_thread(
                    _error, lambda c=c: list(c.scan(KS, "quiet", timeout=0.3))
                )
            finally:
                await asyncio.to_thread(c.close)
        assert errors[(True, "quiet")].code is ErrorCode.SCAN_TIMEOUT
        assert errors[(True, "quiet")].details["index"] == "ks/quiet"
        assert isinstance(errors[(True, "hangs")], RequestTimeout)
        for what in ("quiet", "hangs", "again"):
            _same_error(errors[(True, what)], errors[(False, what)])
    finally:
        hang.set()
        await quiet.stop()


# -- close, the simulator, the opt-out ---------------------------------------------------------


async def test_close_from_another_thread_wakes_a_blocked_scan_and_closes_every_socket(
    env: Env,
) -> None:
    big = await env.many_in_paris()
    c = await _client(env.nodes["n1"].address)
    assert c._scans.direct is not None
    p = next(iter(big))
    ahead = big.with_entry(p, big.seqno(p) + 100, big[p].uuid)  # never reached: it waits
    outcome: list[BaseException] = []
    half = await asyncio.to_thread(c.scan, KS, "#primary", None, "at_plus", big)
    blocks = half.blocks()
    await asyncio.to_thread(next, blocks)

    def blocked() -> None:
        try:
            list(c.scan(KS, "by_city", consistency="at_plus", at=ahead))
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=blocked)
    t.start()
    await _until(lambda: len(c._sockets._all) >= 2)  # type: ignore[union-attr]
    await asyncio.sleep(0.2)  # in its recv
    sockets = list(c._sockets._all)  # type: ignore[union-attr]
    await asyncio.to_thread(c.close)
    await asyncio.to_thread(t.join, 10)
    assert not t.is_alive()
    (err,) = outcome
    assert isinstance(err, ConnectionClosed) and err.message == "client is closed"
    assert all(s.closed for s in sockets)
    # Use after close: the loop path's error, whether scanning or reading a scan.
    closed = _error(lambda: c.scan(KS, "by_city"))
    assert closed.message == "client is closed"
    _same_error(_error(lambda: next(blocks)), closed)
    await _until(lambda: _scan_streams(env, c) == 0)


def test_the_simulator_and_the_opt_out_keep_the_loop_path() -> None:
    sim = Client(["n1:1"], SECRET, transport=SimTransport(SimNetwork(1), "c"))
    assert sim._scans.direct is None
    off = Client(["127.0.0.1:1"], SECRET, direct_scans=False)
    assert off._scans.direct is None
    on = Client(["127.0.0.1:1"], SECRET)
    assert on._scans.direct is not None
    for c in (sim, off, on):
        c.close()
