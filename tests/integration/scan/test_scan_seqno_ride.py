"""request_plus high seqnos riding in ``ScanSlices``, over the real-TCP two-node
setup of ``scan_env.py``. Both nodes stand in for data owners too: the keyspace's
8 partitions alternate between them (``data_topologies``), and each node's "data service"
is a function answering the fake keyspace's seqnos of its own partitions (what a data node
answers: every write made so far is acknowledged).

A request_plus scan coordinated on n1 reads n1's partitions in-process and n2's inside n2's
``ScanSlices`` (its ``SlicesOpened.high_seqnos``): no ``HighSeqnos`` message at all. A reply
without them (an indexer node with no data service) makes the coordinator ask the owner
itself, and the scan still waits for every acknowledged write.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shardex.api.data import HighSeqnos, HighSeqnosReply
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.net import Connection
from shardex.scan import request_plus
from shardex.testing.index import random_workload
from tests.integration.scan.test_scan_request_plus import _view
from tests.integration.scan_env import KS, NODES, Env, _until, as_rows, oracle_rows

Seqnos = Callable[[str, list[int]], dict[int, tuple[int, int]]]


def owner(p: int) -> str:
    return NODES[p % 2]


@pytest.fixture
async def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    monkeypatch.setattr(request_plus, "SPECULATE_BACKOFF", 3600.0)  # no clock in the tests
    e = Env(tmp_path)
    topo = Topology(seq_num=1, assignment={p: owner(p) for p in range(8)})
    e.holder.state = msgspec.structs.replace(e.holder.state, data_topologies={KS: [topo]})
    await e.start()
    try:
        yield e
    finally:
        await e.stop()


def data_service(env: Env, node: str, asked: list[tuple[str, list[int]]]) -> Seqnos:
    """``node``'s high seqnos: the fake keyspace's, of the partitions it owns."""

    def local(keyspace: str, parts: list[int]) -> dict[int, tuple[int, int]]:
        asked.append((node, list(parts)))
        ts = env.ks.ts().to_wire()
        return {p: ts[p] for p in parts if owner(p) == node and p in ts}

    return local


def serve_high_seqnos(env: Env, node: str, local: Seqnos, asked: list[str]) -> None:
    """``node`` answers ``HighSeqnos`` (these nodes run no data service of their own)."""

    async def on_high_seqnos(msg: HighSeqnos, conn: Connection) -> HighSeqnosReply:
        asked.append(node)
        return HighSeqnosReply(entries=local(msg.keyspace, msg.partitions or []))

    env.nodes[node].server.route(HighSeqnos, on_high_seqnos)


def spy_scan_slices(env: Env) -> list[tuple[str, list[int]]]:
    """The (keyspace, partitions) whose high seqnos n2's scan server reads on arrival."""
    seen: list[tuple[str, list[int]]] = []
    server = env.nodes["n2"].scan_server
    real = server.high_seqnos_here

    def spy(keyspace: str, partitions: list[int]) -> dict[int, tuple[int, int]] | None:
        seen.append((keyspace, partitions))
        return real(keyspace, partitions)

    server.high_seqnos_here = spy  # type: ignore[method-assign]
    return seen


def outcomes(env: Env) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in env.nodes.values():
        for k, v in n.coord.speculation.items():
            out[k] = out.get(k, 0) + v
    return out


async def scan(env: Env) -> tuple[Timestamp | None, list[dict[str, Any]]]:
    assert env.client is not None
    client = env.client

    def run() -> tuple[Timestamp | None, list[dict[str, Any]]]:
        res = client.scan(KS, "by_name", None, "request_plus")
        return res.ts, list(res)

    return await asyncio.to_thread(run)


async def test_the_indexer_nodes_high_seqnos_ride_in_their_scan_request(env: Env) -> None:
    ts = await env.round(random.Random(31), 200)
    asked: list[tuple[str, list[int]]] = []
    env.nodes["n1"].coord.view.local_seqnos = data_service(env, "n1", asked)
    env.nodes["n2"].scan_server.local_seqnos = data_service(env, "n2", asked)
    seen = spy_scan_slices(env)
    # No node answers HighSeqnos: a separate request would fail the scan (NODE_UNAVAILABLE).
    got_ts, rows = await scan(env)
    assert got_ts == ts
    assert as_rows(rows) == oracle_rows(env.defs["by_name"], env.ks.documents_at(ts), None)
    assert sorted(asked) == [("n1", [0, 2, 4, 6]), ("n2", [1, 3, 5, 7])]
    assert seen == [(KS, [1, 3, 5, 7])]
    assert outcomes(env) == {"hit": 1}


async def _writes_ahead(env: Env, seed: int) -> tuple[Timestamp, list[tuple[str, list[int]]]]:
    """A stabilised round, then writes acknowledged and delivered but not stabilised (their
    TS is returned); n1's coordinator reads its own seqnos through a recording fake."""
    rng = random.Random(seed)
    await env.round(rng, 150)
    random_workload(env.ks, rng, 60)
    ahead = env.ks.ts()
    await env.deliver(ahead)
    asked: list[tuple[str, list[int]]] = []
    env.nodes["n1"].coord.view.local_seqnos = data_service(env, "n1", asked)
    return ahead, asked


async def test_seqnos_carried_ahead_of_the_index_make_the_scan_wait_for_them(env: Env) -> None:
    ahead, asked = await _writes_ahead(env, 32)
    env.nodes["n2"].scan_server.local_seqnos = data_service(env, "n2", asked)
    first = asyncio.ensure_future(scan(env))
    await _until(lambda: outcomes(env).get("miss") == 1 or first.done())
    assert not first.done()
    await env.stabilise(ahead)
    got_ts, rows = await first
    assert got_ts == ahead
    assert as_rows(rows) == oracle_rows(env.defs["by_name"], env.ks.documents_at(ahead), None)


async def test_a_reply_without_the_seqnos_makes_the_coordinator_ask_the_owner(env: Env) -> None:
    rng = random.Random(33)
    await env.round(rng, 150)
    # Writes acknowledged on n2's partitions only: n1's seqnos alone would not show them.
    before = env.ks.ts()
    random_workload(env.ks, rng, 80)
    moved = {p: e for p, e in env.ks.ts().to_wire().items() if owner(p) == "n2"}
    ahead = Timestamp({**before.to_wire(), **moved})
    assert ahead != before
    await env.deliver(env.ks.ts())
    asked: list[tuple[str, list[int]]] = []
    env.nodes["n1"].coord.view.local_seqnos = data_service(env, "n1", asked)
    n2_local = data_service(env, "n2", asked)
    # n2 hosts slices but reads no seqnos in its ScanSlices (no data service there, say);
    # it answers a HighSeqnos.
    env.nodes["n2"].scan_server.local_seqnos = None
    requests: list[str] = []
    serve_high_seqnos(env, "n2", n2_local, requests)
    first = asyncio.ensure_future(scan(env))
    await _until(lambda: outcomes(env).get("miss") == 1 or first.done())
    assert not first.done()  # waits: the snapshot read does not hold n2's writes
    assert requests == ["n2"]
    await env.stabilise(env.ks.ts())
    got_ts, rows = await first
    assert got_ts is not None and got_ts.covers(ahead)
    assert as_rows(rows) == oracle_rows(env.defs["by_name"], env.ks.documents_at(got_ts), None)


async def test_a_scan_without_stability_waits_for_the_shared_rounds_seqnos(env: Env) -> None:
    ahead, asked = await _writes_ahead(env, 34)
    requests: list[str] = []
    serve_high_seqnos(env, "n2", data_service(env, "n2", asked), requests)
    assert env.client is not None
    client = env.client

    def run() -> list[dict[str, Any]]:
        return list(client.scan(KS, "by_name", None, "request_plus", stability="none"))

    # The tips are read once the published stability TS covers every acknowledged write.
    first = asyncio.ensure_future(asyncio.to_thread(run))
    watches = [n.scan_server.watch for n in env.nodes.values()]
    await _until(lambda: any(w._events for w in watches) or first.done())
    assert not first.done()
    assert requests == ["n2"] and sorted(asked) == [("n1", [0, 2, 4, 6]), ("n2", [1, 3, 5, 7])]
    await env.stabilise(ahead)
    rows = await first
    assert as_rows(rows) == oracle_rows(env.defs["by_name"], env.ks.documents_at(ahead), None)


async def test_with_every_other_owner_riding_only_the_own_node_is_read_without_a_round() -> None:
    local = {0: (10, 7), 2: (11, 7)}
    view = _view(owner, local)  # n1 owns 0 and 2 (read in-process), n2 owns 1 and 3
    owners = await view.data_owners(KS)
    rounds_before = asyncio.all_tasks()
    got = view.shared_partial_high_seqnos(KS, skip=["n2"], owners=owners)
    assert got.done() and got.result() == local  # read now: no task, no request
    assert asyncio.all_tasks() == rounds_before
    local[0] = (12, 7)
    again = view.shared_partial_high_seqnos(KS, skip=["n2"], owners=owners)
    assert again.result()[0] == (12, 7)  # each scan reads on its own arrival
    # A failing local read leaves the partitions to ``high_seqnos(known=...)``.
    view.local_seqnos = _failing
    assert view.shared_partial_high_seqnos(KS, skip=["n2"], owners=owners).result() == {}
    # Without a data service here, this node's partitions go through a round.
    view.local_seqnos = None
    assert not view._only_local(owners, ["n2"])
    await view.pool.close()


def _failing(keyspace: str, parts: list[int]) -> dict[int, tuple[int, int]]:
    from shardex.api.errors import KeyspaceNotFound

    raise KeyspaceNotFound("not open here yet")
