"""request_plus in one round trip, over the real-TCP two-node setup of
``test_scan_service.py``, with the keyspace's high seqnos stood in for by the fake keyspace's
TS (these nodes run no data service):

* on an index that has caught up, the slices are read while the high seqnos are fetched, and
  that read is the answer (a "hit");
* on an index behind the high seqnos, that read is dropped and the scan waits for a snapshot
  covering them: it sees every acknowledged write (a "miss"); the index's next request_plus
  scans within ``SPECULATE_BACKOFF`` wait first;
* a failed high-seqno fetch fails the scan and leaves no read open;
* ``ClusterView.high_seqnos`` reads its own node's partitions in-process, the others over
  the network, and still names partitions nobody answers for.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from shardex.api.coordinator import StateReply
from shardex.api.scan_streams import OutStreams
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.index import scan_server
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.net import ConnectionPool, TcpTransport
from shardex.scan import coordinator, request_plus
from shardex.scan.cluster_view import ClusterView
from shardex.testing.index import random_workload
from tests.integration.scan_env import KS, NODES, Env, _until, as_rows, oracle_rows


def fake_high_seqnos(env: Env, calls: list[str]) -> None:
    """Every coordinator's high seqnos are the fake keyspace's TS at the call (what the data
    nodes would answer: every write made so far is acknowledged)."""

    async def high_seqnos(keyspace: str, *, known: Any = None) -> Timestamp:
        calls.append(keyspace)
        await asyncio.sleep(0)  # an answer that arrives after the reads started
        return env.ks.ts()

    async def high_seqnos_wire(keyspace: str, *, known: Any = None) -> dict[int, Any]:
        return (await high_seqnos(keyspace, known=known)).to_wire()

    for n in env.nodes.values():
        n.coord.view.high_seqnos = high_seqnos  # type: ignore[method-assign]
        n.coord.view.high_seqnos_wire = high_seqnos_wire  # type: ignore[method-assign]


def outcomes(env: Env) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in env.nodes.values():
        for k, v in n.coord.speculation.items():
            out[k] = out.get(k, 0) + v
    return out


async def test_a_caught_up_index_answers_from_the_read_made_while_fetching(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    ts = await env.round(random.Random(21), 200)
    calls: list[str] = []
    fake_high_seqnos(env, calls)
    # The slices' TSs stay encoded on the coordinator: equal bytes settle both "one common
    # snapshot" and "covers the high seqnos", so no TS is decoded there.
    decoded: list[bytes] = []
    real = Timestamp.from_packed.__func__  # type: ignore[attr-defined]

    def from_packed(cls: type[Timestamp], data: bytes) -> Timestamp:
        decoded.append(bytes(data))
        return real(cls, data)  # type: ignore[no-any-return]

    monkeypatch.setattr(Timestamp, "from_packed", classmethod(from_packed))
    assert env.client is not None
    client = env.client
    res = await asyncio.to_thread(client.scan, KS, "by_name", None, "request_plus")
    rows = await asyncio.to_thread(list, res)
    assert as_rows(rows) == oracle_rows(env.defs["by_name"], env.ks.documents_at(ts), None)
    assert res.ts == ts and calls == [KS]
    assert outcomes(env) == {"hit": 1}
    assert decoded == []
    assert bytes(res.started.ts) == ts.packed()  # the indexers' bytes, passed through


async def test_an_index_behind_is_read_again_once_it_covers_every_acknowledged_write(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(request_plus, "SPECULATE_BACKOFF", 3600.0)  # no clock in the test
    rng = random.Random(22)
    await env.round(rng, 150)
    random_workload(env.ks, rng, 60)
    ahead = env.ks.ts()  # acknowledged, delivered, not yet stabilised
    await env.deliver(ahead)
    fake_high_seqnos(env, [])
    assert env.client is not None
    client = env.client

    def scan() -> tuple[Timestamp | None, list[dict[str, Any]]]:
        res = client.scan(KS, "by_name", None, "request_plus")
        return res.ts, list(res)

    first = asyncio.ensure_future(asyncio.to_thread(scan))
    # The speculative read (at the older snapshot) was dropped: the scan now waits.
    await _until(lambda: outcomes(env).get("miss") == 1 or first.done())
    watches = [n.scan_server.watch for n in env.nodes.values()]
    await _until(lambda: any(w._events for w in watches) or first.done())
    assert not first.done()
    await env.stabilise(ahead)
    ts, rows = await first
    want = oracle_rows(env.defs["by_name"], env.ks.documents_at(ahead), None)
    assert ts == ahead and as_rows(rows) == want
    # Within the backoff the index's scans fetch the high seqnos first, then read once.
    ts, rows = await asyncio.to_thread(scan)
    assert ts == ahead and as_rows(rows) == want
    assert outcomes(env) == {"miss": 1, "skipped": 1}
    # Past it, they read while fetching again.
    monkeypatch.setattr(request_plus, "SPECULATE_BACKOFF", 0.0)
    ts, rows = await asyncio.to_thread(scan)
    assert ts == ahead and as_rows(rows) == want
    assert outcomes(env) == {"miss": 1, "skipped": 1, "hit": 1}


async def test_a_failed_high_seqno_fetch_fails_the_scan_and_closes_its_reads(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    await env.round(random.Random(23), 300)
    # Replies carry 5 entries, streams 5 per block with one block of credit: the indexers'
    # streams stall until read or cancelled.
    monkeypatch.setattr(scan_server, "INLINE_ROWS", 5)
    monkeypatch.setattr(coordinator, "BLOCK_ROWS", 5)
    monkeypatch.setattr(coordinator, "SLICE_BLOCK_ROWS", 5)
    monkeypatch.setattr(coordinator, "SLICE_CREDIT", 1)
    started: list[int] = []
    real = OutStreams.start

    def spy(self: OutStreams, conn: Any, scan_id: int, credit: int, producer: Any) -> Any:
        started.append(scan_id)
        return real(self, conn, scan_id, credit, producer)

    monkeypatch.setattr(OutStreams, "start", spy)

    async def unreachable(keyspace: str, *, known: Any = None) -> Timestamp:
        await asyncio.sleep(0.05)
        raise NodeUnavailable("no owner answered the high seqnos", details={})

    for n in env.nodes.values():
        n.coord.view.high_seqnos = unreachable  # type: ignore[method-assign]
        n.coord.view.high_seqnos_wire = unreachable  # type: ignore[method-assign]
    with pytest.raises(ShardexError) as info:
        await env.scan("by_name", None, "request_plus")
    assert info.value.code is ErrorCode.NODE_UNAVAILABLE
    assert started  # the speculative read had opened a stream on the other indexer
    await _until(lambda: all(n.streams.open_streams == 0 for n in env.nodes.values()))


def _view(owner_of: Callable[[int], str], local: dict[int, tuple[int, int]]) -> ClusterView:
    state = StateContext(
        cas=1,
        keyspaces={KS: KeyspaceMeta(name=KS, num_partitions=4, uuid="u", created_cas=1)},
        data_topologies={KS: [Topology(seq_num=1, assignment={p: owner_of(p) for p in range(4)})]},
    )

    class Holder:
        def __init__(self) -> None:
            self.state = state

        async def submit(self, msg: Any) -> StateReply:
            return StateReply(state=state, node="m", master="m", is_master=True)

    holder = Holder()
    pool = ConnectionPool(TcpTransport(), "s" * 32, name="view")
    view = ClusterView(pool=pool, coordinator=lambda: holder, members=lambda: [], name=NODES[0])
    view.local_seqnos = lambda ks, parts: {p: local[p] for p in parts if p in local}
    return view


async def test_the_own_nodes_high_seqnos_are_read_in_process() -> None:
    local = {p: (10 + p, 7) for p in range(4)}
    view = _view(lambda p: NODES[0], local)  # no member is reachable: no request may go out
    ts = await view.high_seqnos(KS)
    assert ts == Timestamp(local)
    await view.pool.close()


async def test_partitions_nobody_answers_for_are_named() -> None:
    local = {0: (5, 7), 2: (6, 7)}  # partition 3 is in hand-over here; 1 is on a lost node
    view = _view(lambda p: NODES[1] if p == 1 else NODES[0], local)
    with pytest.raises(NodeUnavailable) as info:
        await view.high_seqnos(KS)
    assert info.value.details["partitions"] == [1, 3]
    assert "not a cluster member" in (info.value.details["cause"] or "")
    await view.pool.close()
