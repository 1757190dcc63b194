"""Single-document requests from the calling thread (``shardex.client.direct_kv``), against
three in-process data services on loopback TCP (``test_replication``'s cluster) and a
control node standing in for the managers: the requests take no hop to the client's loop,
each thread has its own sockets, and everything that needs routing - no cached topology, a
stale one, a failed-over or stopped owner - is handed to the loop path, which retries as it
always did. Errors and their words are the loop path's.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest

import shardex.data.replication as replication
from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.data import Get, Upsert
from shardex.api.membership import MembersReply, MembersRequest
from shardex.client import BulkWriteError, Client, connect
from shardex.client import routing as client_routing
from shardex.core.topology import Topology
from shardex.errors import ConnectionClosed, ErrorCode, RequestTimeout, ShardexError
from shardex.meta.member_list import MemberView
from shardex.net import Connection, RpcServer, TcpTransport
from shardex.sim.network import SimNetwork
from shardex.sim.transport import SimTransport
from tests.integration.data.test_replication import (
    KS,
    NODES,
    PARTS,
    SECRET,
    Cluster,
    Coordinator,
    chains_state,
    docid_in,
)

Env = tuple[Cluster, RpcServer]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    """The three data nodes (partition p active on NODES[p % 3], its replica on the next;
    writes at durability persist) and a control node answering the client's state and
    member list."""
    c = Cluster(Coordinator(chains_state(1)))
    ctl = RpcServer(TcpTransport(), SECRET, name="ctl")

    async def state(msg: StateRequest, conn: Connection) -> StateReply:
        return StateReply(node="ctl", master="ctl", is_master=True, state=c.coord.state)

    async def members(msg: MembersRequest, conn: Connection) -> MembersReply:
        views = [
            MemberView(
                member_id=n,
                name=n,
                address=a,
                services=("data",),
                incarnation=1,
                state="up",
                last_heartbeat_age=0.0,
            )
            for n, a in c.addresses.items()
        ]
        return MembersReply(
            observer="ctl",
            observer_id="ctl",
            observer_is_manager=True,
            version=1,
            digest="",
            heartbeat_interval=1.0,
            failure_timeout=5.0,
            members=views,
        )

    ctl.route(StateRequest, state)
    ctl.route(MembersRequest, members)
    try:
        for name in NODES:
            await c.start_node(name, tmp_path / name)
        for ds in c.services.values():
            await ds.reconcile()
        await ctl.start("127.0.0.1:0")
        yield c, ctl
    finally:
        await ctl.stop()
        await c.pool.close()
        for server in c.servers.values():
            await server.stop()
        for ds in c.services.values():
            await ds.stop()


async def _client(env: Env, **kw: Any) -> Client:
    address = env[1].address
    assert address is not None
    return await asyncio.to_thread(lambda: connect(address, secret=SECRET, **kw))


class Hops:
    """Counts the client's hand-offs to its loop thread (``RpcSession.run``) while in use."""

    def __init__(self, client: Client) -> None:
        self.n = 0
        self._rpc = client.rpc

    def __enter__(self) -> Hops:
        real = type(self._rpc).run.__get__(self._rpc)

        def run(coro: Coroutine[Any, Any, Any]) -> Any:
            self.n += 1
            return real(coro)

        self._rpc.run = run  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self._rpc.run


async def _until_replicated(cluster: Cluster, partition: int, seqno: int) -> None:
    """Until ``partition``'s replica holds ``seqno``."""
    topo = cluster.coord.state.data_topologies[KS][-1]
    replica = cluster.services[topo.replicas[partition][0]].engine
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while replica.partition_info(KS, partition).high_seqno < seqno:
        assert loop.time() < deadline, "the replica never caught up"
        await asyncio.sleep(0.02)


def _error(fn: Callable[[], Any]) -> ShardexError:
    with pytest.raises(ShardexError) as info:
        fn()
    return info.value


def _words(message: str) -> str:
    return re.sub(r"\d+", "N", message)


def _same_error(a: ShardexError, b: ShardexError) -> None:
    assert (type(a), a.code, a.message) == (type(b), b.code, b.message)


def _moved(client: Client, partition: int, node: str) -> None:
    """The client's cached topology names ``node`` as ``partition``'s owner (stale: the
    cluster's does not), until its next refresh."""
    router = client.rpc.router
    state = router._state
    if state is None:  # dropped after an owner's timeout or lost connection: refetch
        state = client.rpc.run(router.refresh())
    topo = state.data_topologies[KS][-1]
    stale = Topology(seq_num=topo.seq_num, assignment={**topo.assignment, partition: node})
    router.force_topology(KS, stale)


# -- the direct path ----------------------------------------------------------------------


async def test_every_document_call_goes_from_the_calling_thread(env: Env) -> None:
    client = await _client(env)
    loop_client = await _client(env, direct_kv=False)
    try:
        ks, ks_loop = client.keyspace(KS), loop_client.keyspace(KS)
        docs = [docid_in(p, i) for p in range(PARTS) for i in range(3)]

        def calls() -> tuple[int, list[Any]]:
            ks.upsert("warm", {"w": 1})  # the first call fetches the topology: on the loop
            kv = client._kv
            assert kv is not None
            sent = kv.sent
            out: list[Any] = []
            with Hops(client) as hops:
                calls_of(out)
            assert hops.n == 0
            assert kv.sent - sent == len(docs) * 5 + len(docs[::2])
            return hops.n, out

        def calls_of(out: list[Any]) -> None:
            for i, d in enumerate(docs):
                r1 = ks.insert(d, {"i": i})
                r2 = ks.upsert(d, {"i": i, "v": 2}, r1.cas)
                r3 = ks.replace(d, {"i": i, "v": 3}, r2.cas, durability="persist_active")
                got = ks.get_versioned(d)
                assert (got.cas, got.seqno) == (r3.cas, r3.seqno)
                out.append(ks.get(d))
                assert ks_loop.get(d) == out[-1]  # the loop path reads what this wrote
                assert r1.partition == r3.partition
            for d in docs[::2]:
                ks.delete(d)

        _, out = await asyncio.to_thread(calls)
        assert out == [{"i": i, "v": 3} for i in range(len(docs))]
        for d in docs[::2]:
            gone = await asyncio.to_thread(_error, lambda d=d: ks_loop.get(d))
            assert gone.code is ErrorCode.DOC_NOT_FOUND
    finally:
        await asyncio.to_thread(client.close)
        await asyncio.to_thread(loop_client.close)


async def test_each_thread_has_its_own_sockets_and_close_shuts_them(env: Env) -> None:
    client = await _client(env)
    assert client._sockets is not None
    at_connect = len(client._sockets._all)  # the connecting thread's (``preconnect``)
    ks = client.keyspace(KS)
    barrier = threading.Barrier(4)
    seen: dict[int, set[int]] = {}
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(20):
                ks.upsert(f"t{t}-{i}", {"t": t, "i": i})
            assert client._sockets is not None
            seen[t] = {id(c) for c in client._sockets.mine().values()}
            assert len(seen[t]) == len(NODES)  # one per owner node it wrote to
            barrier.wait(10)  # every thread alive (its sockets too) while they are counted
            assert len(client._sockets._all) == 4 * len(NODES) + at_connect
            barrier.wait(10)
        except BaseException as e:  # reported by the test's thread
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        await asyncio.to_thread(th.join, 30)
    assert not errors, errors
    assert sum(len(s) for s in seen.values()) == len(set().union(*seen.values())) == 12
    sockets = list(client._sockets._all) if client._sockets is not None else []
    await asyncio.to_thread(client.close)
    assert all(s.closed for s in sockets)
    closed = _error(lambda: ks.upsert("after", {}))
    assert isinstance(closed, ConnectionClosed) and closed.message == "client is closed"
    assert _error(lambda: ks.get("t0-0")).message == "client is closed"


# -- what the loop path takes over ------------------------------------------------------------


async def test_a_stale_topology_goes_to_the_loop_which_refreshes_and_retries(env: Env) -> None:
    client = await _client(env)
    ks = client.keyspace(KS)
    d = docid_in(0)  # on n1

    def stale() -> None:
        ks.upsert(d, {"v": 1})
        router = client.rpc.router
        for op in ("upsert", "get"):
            _moved(client, 0, "n2")  # the cached topology says n2, which refuses it
            refreshes = router.refreshes
            with Hops(client) as hops:
                if op == "upsert":
                    ks.upsert(d, {"v": 2})
                else:
                    assert ks.get(d) == {"v": 2}
            assert hops.n == 1 and router.refreshes == refreshes + 1, op
        with Hops(client) as hops:  # refreshed: direct again
            assert ks.get(d) == {"v": 2}
        assert hops.n == 0

    try:
        await asyncio.to_thread(stale)
    finally:
        await asyncio.to_thread(client.close)


async def test_a_failed_over_owner_hands_the_write_to_the_loop(env: Env) -> None:
    cluster, _ = env
    client = await _client(env)
    ks = client.keyspace(KS)
    d = docid_in(0)  # on n1
    await asyncio.to_thread(ks.upsert, d, {"v": 1})
    state = cluster.coord.state
    topo = state.data_topologies[KS][-1]
    # n1 failed over (it still runs): its partitions 0 and 3 promoted on n2, their replicas
    await _until_replicated(cluster, 0, 1)
    failed = Topology(
        seq_num=2,
        assignment={**topo.assignment, 0: "n2", 3: "n2"},
        replicas={p: [n for n in r if n not in ("n1", "n2")] for p, r in topo.replicas.items()},
    )
    await cluster.publish(
        msgspec.structs.replace(
            state, cas=2, data_topologies={KS: [topo, failed]}, failed_over={"n1": 2}
        )
    )
    assert cluster.services["n1"].failed_over

    def write() -> tuple[int, int]:
        refreshes = client.rpc.router.refreshes
        with Hops(client) as hops:
            r = ks.upsert(d, {"v": 2})
        assert r.partition == 0
        return hops.n, client.rpc.router.refreshes - refreshes

    try:
        assert await asyncio.to_thread(write) == (1, 1)  # refused by n1, then n2 on the loop
        assert await asyncio.to_thread(ks.get, d) == {"v": 2}
        info = cluster.services["n2"].engine.partition_info(KS, 0)
        assert info.high_seqno == 2  # the promoted copy: the first write, then this one
    finally:
        await asyncio.to_thread(client.close)


async def test_a_socket_the_node_closed_is_replaced_before_sending(env: Env) -> None:
    cluster, _ = env
    client = await _client(env)
    ks = client.keyspace(KS)
    d = docid_in(1)  # on n2
    one_thread = ThreadPoolExecutor(1)  # every call on one thread: its socket to n2
    loop = asyncio.get_running_loop()

    def write_and_read() -> tuple[int, dict[str, Any]]:
        with Hops(client) as hops:
            ks.upsert(d, {"v": 2})
            got = ks.get(d)
        return hops.n, got

    try:
        await loop.run_in_executor(one_thread, ks.upsert, d, {"v": 0})  # topology fetched
        await loop.run_in_executor(one_thread, ks.upsert, d, {"v": 1})  # direct: a socket
        sockets = await loop.run_in_executor(one_thread, lambda: dict(client._sockets.mine()))
        name = client.name + "/scan"
        dropped = [c for c in cluster.servers["n2"].connections if c.peer_name == name]
        assert len(dropped) == 1
        await dropped[0].close()
        # Sent on a new socket, the write is not resent (nor lost) and goes direct.
        assert await loop.run_in_executor(one_thread, write_and_read) == (0, {"v": 2})
        now = await loop.run_in_executor(one_thread, lambda: dict(client._sockets.mine()))
        (n2,) = [a for a in now if a == cluster.addresses["n2"]]
        assert now[n2] is not sockets[n2] and sockets[n2].closed
    finally:
        one_thread.shutdown()
        await asyncio.to_thread(client.close)


async def test_a_stopped_owner_gives_the_loop_paths_error(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, _ = env
    monkeypatch.setattr(client_routing, "ROUTE_ATTEMPTS", 3)  # ~0.15 s of retrying
    client = await _client(env)
    loop_client = await _client(env, direct_kv=False)
    d = docid_in(2)  # on n3
    try:
        for c in (client, loop_client):
            await asyncio.to_thread(c.keyspace(KS).upsert, d, {"v": 1})
        await cluster.stop_node("n3")

        def down(c: Client) -> tuple[ShardexError, ShardexError]:
            ks = c.keyspace(KS)
            return _error(lambda: ks.upsert(d, {"v": 2})), _error(lambda: ks.get(d))

        (w, r), (lw, lr) = [await asyncio.to_thread(down, c) for c in (client, loop_client)]
        assert w.code is ErrorCode.NODE_UNAVAILABLE and r.code is ErrorCode.NODE_UNAVAILABLE
        _same_error(w, lw)
        _same_error(r, lr)
        assert w.details["attempts"] == lw.details["attempts"] == 3
    finally:
        await asyncio.to_thread(client.close)
        await asyncio.to_thread(loop_client.close)


# -- errors ---------------------------------------------------------------------------------


async def test_each_write_carries_its_own_durability_timeout(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With partition 0's replica stalled, majority writes on either path and in batches
    are ambiguous after the ``durability_timeout`` they were given (not the node's default),
    even one longer than the client's request timeout; a bad value is refused unsent."""
    cluster, _ = env
    monkeypatch.setattr(replication, "INLINE_APPLY", -1)  # applies in the I/O pool
    cluster.services["n1"].replication.waits.timeout = 60.0
    client = await _client(env, request_timeout=0.5)
    loop_client = await _client(env, direct_kv=False, request_timeout=0.5)
    n2 = cluster.services["n2"]
    gate = threading.Event()
    real = n2.engine.replicas.apply_runs

    def stalled(*args: Any, **kwargs: Any) -> Any:
        gate.wait(10)
        return real(*args, **kwargs)

    def calls() -> tuple[list[ShardexError], ShardexError, int]:
        ks, ks_loop = client.keyspace(KS), loop_client.keyspace(KS)
        d0, d1, d2 = (docid_in(0, i) for i in range(3))
        for k in (ks, ks_loop):  # warm (topology, connections) once the replica is reached
            _majority_write_until_possible(k, d0)
        n2.engine.replicas.apply_runs = stalled  # type: ignore[method-assign]
        try:
            errs = [
                _error(partial(ks.upsert, d0, {}, durability="majority", durability_timeout=t))
                for t in (0.2, 1.0)
            ]
            errs.append(
                _error(lambda: ks_loop.insert(d1, {}, durability="majority", durability_timeout=1))
            )
            bulk = _error(
                lambda: ks.upsert_many([(d2, {})], durability="majority", durability_timeout=0.2)
            )
        finally:
            gate.set()
        kv = client._kv
        assert kv is not None
        sent = kv.sent
        bad = _error(lambda: ks.delete(d0, durability="majority", durability_timeout=-1))
        return [*errs, bad], bulk, kv.sent - sent

    try:
        (*ambiguous, bad), bulk, sent = await asyncio.to_thread(calls)
    finally:
        client.close()
        loop_client.close()
    # 1.0 s is past the 0.5 s request timeout: the client waited for the node's answer
    assert [(e.code, e.details.get("durability_timeout")) for e in ambiguous] == [
        (ErrorCode.DURABILITY_AMBIGUOUS, 0.2),
        (ErrorCode.DURABILITY_AMBIGUOUS, 1.0),
        (ErrorCode.DURABILITY_AMBIGUOUS, 1.0),
    ]
    assert isinstance(bulk, BulkWriteError)
    ((_, _, item),) = bulk.failures
    assert (item.code, item.details["durability_timeout"]) == (ErrorCode.DURABILITY_AMBIGUOUS, 0.2)
    assert bad.code is ErrorCode.BAD_REQUEST and "-1" in bad.message and sent == 0


def _majority_write_until_possible(ks: Any, docid: str) -> None:
    """A majority write of ``docid``, retried while its active's sender has not reached the
    replica yet (DURABILITY_IMPOSSIBLE: nothing written)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            ks.upsert(docid, {"v": 1}, durability="majority")
            return
        except ShardexError as exc:
            if exc.code is not ErrorCode.DURABILITY_IMPOSSIBLE or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


async def test_errors_are_the_loop_paths(env: Env) -> None:
    client = await _client(env)
    loop_client = await _client(env, direct_kv=False)
    try:

        def errors(c: Client) -> list[ShardexError]:
            ks = c.keyspace(KS)
            d = f"err-{c is client}"
            r = ks.insert(d, {"v": 1})
            return [
                _error(lambda: ks.insert(d, {"v": 2})),  # DOC_EXISTS
                _error(lambda: ks.upsert(d, {"v": 2}, r.cas + 1)),  # CAS_MISMATCH
                _error(lambda: ks.replace(d + "-none", {"v": 2})),  # DOC_NOT_FOUND
                _error(lambda: ks.delete(d + "-none")),
                _error(lambda: ks.get(d + "-none")),
            ]

        got = await asyncio.to_thread(errors, client)
        want = await asyncio.to_thread(errors, loop_client)
        assert [e.code for e in got] == [
            ErrorCode.DOC_EXISTS,
            ErrorCode.CAS_MISMATCH,
            ErrorCode.DOC_NOT_FOUND,
            ErrorCode.DOC_NOT_FOUND,
            ErrorCode.DOC_NOT_FOUND,
        ]
        for a, b in zip(got, want, strict=True):
            assert (type(a), a.code) == (type(b), b.code)
            # The same words: only the docid and the CAS values differ.
            assert _words(a.message.replace("err-True", "err-False")) == _words(b.message)
    finally:
        await asyncio.to_thread(client.close)
        await asyncio.to_thread(loop_client.close)


async def test_a_silent_or_vanishing_owner_errs_as_on_the_loop_and_writes_are_sent_once(
    env: Env,
) -> None:
    """A write with no reply in time: RequestTimeout; one whose connection ends after it
    was sent: CONNECTION_CLOSED; neither resent. A read that times out is retried by the
    loop path, which finds the real owner."""
    got_upserts: list[str] = []
    hang = asyncio.Event()
    rogue = RpcServer(TcpTransport(), SECRET, name="rogue")

    quiet_doc, drop_doc = docid_in(0, 1), docid_in(0, 2)  # partition 0, as ``d``

    async def upsert(msg: Upsert, conn: Connection) -> None:
        got_upserts.append(msg.docid)
        if msg.docid == drop_doc:
            conn.abort()  # the node dies with the write in hand
        await hang.wait()

    async def get(msg: Get, conn: Connection) -> None:
        await hang.wait()

    rogue.route(Upsert, upsert)
    rogue.route(Get, get)
    address = await rogue.start("127.0.0.1:0")
    client = await _client(env, request_timeout=0.5)
    loop_client = await _client(env, request_timeout=0.5, direct_kv=False)
    d = docid_in(0)
    try:

        def errors(c: Client) -> list[ShardexError]:
            ks = c.keyspace(KS)
            ks.upsert(d, {"v": 1})
            out = []
            for docid in (quiet_doc, drop_doc):
                _moved(c, 0, "rogue")
                c.rpc.router._addresses["rogue"] = address  # a refresh forgets it
                out.append(_error(lambda docid=docid: ks.upsert(docid, {"v": 2})))
                # The failure dropped the stale topology: the next write reaches the real
                # owner instead of the silent node again.
                ks.upsert(docid, {"v": 3})
            return out

        for c in (client, loop_client):
            got_upserts.clear()
            (quiet, drop) = await asyncio.to_thread(errors, c)
            assert isinstance(quiet, RequestTimeout) and isinstance(drop, ConnectionClosed)
            assert len(got_upserts) == 2  # each sent once: never resent
            if c is client:
                direct = (quiet, drop)
            else:
                _same_error(direct[0], quiet)
                assert (type(direct[1]), direct[1].code) == (type(drop), drop.code)
                # "Upsert: connection to rogue@... is closed (connection to ... closed by peer)"
                prefix = drop.message.split(" (")[0]
                assert direct[1].message.split(" (")[0] == prefix

        # A read to the silent node times out and the loop path retries it: the real owner.
        def read() -> Any:
            _moved(client, 0, "rogue")
            return client.keyspace(KS).get(d)

        assert await asyncio.to_thread(read) == {"v": 1}
    finally:
        hang.set()
        await asyncio.to_thread(client.close)
        await asyncio.to_thread(loop_client.close)
        await rogue.stop()


# -- where it is off ------------------------------------------------------------------------


def test_the_simulator_and_the_opt_out_keep_the_loop_path() -> None:
    sim = Client(["n1:1"], SECRET, transport=SimTransport(SimNetwork(1), "c"))
    off = Client(["127.0.0.1:1"], SECRET, direct_kv=False)
    scans_off = Client(["127.0.0.1:1"], SECRET, direct_scans=False)
    try:
        assert sim._kv is None and sim.keyspace(KS)._direct is None
        assert off._kv is None and off._scans.direct is not None
        assert scans_off._kv is not None and scans_off._scans.direct is None
        assert scans_off.keyspace(KS)._direct is scans_off._kv
    finally:
        for c in (sim, off, scans_off):
            c.close()
