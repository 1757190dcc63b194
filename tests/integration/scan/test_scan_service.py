"""The scan path over real TCP in one process: two indexer nodes (``IndexService`` with the
scan server and a scan coordinator each, behind ``RpcServer``s on loopback), fed by the
pipeline's projector and router, scanned through the real ``Client``.

The coordinator state comes from a holder object standing in for the manager replica (the
cluster test in ``tests/spark/test_scan.py`` runs the real one). Every scan result is checked
against the oracle's entries for the documents at the scan's TS.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
import pytest

from shardex.api.delivery import (
    RollbackSlices,
    SlicesRolledBack,
)
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import BUILDING
from shardex.testing.index import random_workload
from tests.integration.scan_env import (
    KS,
    NODES,
    Env,
    _until,
    as_rows,
    oracle_rows,
)


async def test_scans_equal_the_oracle_with_spans_limit_offset_and_order(env: Env) -> None:
    rng = random.Random(3)
    ts = await env.round(rng, 300)
    docs = env.ks.documents_at(ts)
    cases: list[tuple[str, Any]] = [
        ("by_name", None),
        ("by_name", [{"low": ["bob"], "high": ["dee"], "inclusion": "low"}]),
        ("by_name", [{"low": ["ann", 1], "high": ["ann", 3]}, {"low": ["eve"]}]),
        ("by_age", [{"low": [1], "high": [3], "inclusion": "neither"}]),
        ("by_city", [{"low": ["oslo"], "high": ["rome"]}]),
        ("#primary", [{"low": ["doc1"], "high": ["doc3"]}]),
    ]
    for name, spans in cases:
        defn = env.defs[name]
        want = oracle_rows(defn, docs, spans)
        assert want, name
        got = await env.scan(name, spans, consistency="at_plus", at=ts)
        assert as_rows(got) == want, name
        for _ in range(4):
            offset, limit = rng.randrange(0, len(want) + 2), rng.randrange(0, 15)
            page = await env.scan(name, spans, "at_plus", ts, limit=limit, offset=offset)
            assert as_rows(page) == want[offset : offset + limit], (name, offset, limit)
        unordered = await env.scan(name, spans, "at_plus", ts, ordered=False)
        assert sorted(as_rows(unordered), key=repr) == sorted(want, key=repr)
        ids = await env.scan(name, spans, "at_plus", ts, covering=False)
        assert ids == [{"docid": d} for _, d in want]
    # not_bounded reads the tips: the same here, nothing is queued.
    assert as_rows(await env.scan("by_name")) == oracle_rows(env.defs["by_name"], docs, None)


async def test_an_equality_span_on_the_partition_key_reads_one_slice(env: Env) -> None:
    ts = await env.round(random.Random(4), 200)
    assert env.client is not None
    client = env.client
    spans = [{"low": ["rome"], "high": ["rome"]}]
    # by_city is unpartitioned; by_name partitions by city but leads with name: no elimination
    res = await asyncio.to_thread(client.scan, KS, "by_name", [{"low": ["ann"], "high": ["ann"]}])
    assert res.partitions == [0, 1, 2, 3]
    res.close()
    defn = msgspec.structs.replace(env.defs["by_city"])
    res = await asyncio.to_thread(client.scan, KS, "by_city", spans, "at_plus", ts)
    rows = await asyncio.to_thread(list, res)
    assert as_rows(rows) == oracle_rows(defn, env.ks.documents_at(ts), spans)
    assert res.ts == ts and res.partitions == [0]


async def test_at_plus_waits_for_the_stabilise_then_sees_the_writes(env: Env) -> None:
    rng = random.Random(5)
    await env.round(rng, 100)
    random_workload(env.ks, rng, 50)
    ahead = env.ks.ts()
    await env.deliver(ahead)  # queued, not stabilised: a scan at_plus ahead must wait
    scan = asyncio.ensure_future(env.scan("by_name", consistency="at_plus", at=ahead))
    watch = env.nodes["n1"].scan_server.watch
    await _until(lambda: bool(watch._events) or scan.done())  # waiting on n1's slices
    assert not scan.done()
    await env.stabilise(ahead)
    got = await scan
    assert as_rows(got) == oracle_rows(env.defs["by_name"], env.ks.documents_at(ahead), None)


async def test_a_scan_that_cannot_catch_up_times_out_naming_the_lag(env: Env) -> None:
    ts = await env.round(random.Random(6), 60)
    p = next(iter(ts))
    ahead = ts.with_entry(p, ts.seqno(p) + 7, ts[p].uuid)
    with pytest.raises(ShardexError) as info:
        await env.scan("by_city", consistency="at_plus", at=ahead, timeout=0.5)
    assert info.value.code is ErrorCode.SCAN_TIMEOUT
    assert info.value.details["behind"] == {str(p): [ts.seqno(p) + 7, ts.seqno(p)]}
    assert "7 mutation(s) behind" in info.value.message


async def test_query_stability_pins_a_ts_until_it_is_released(env: Env) -> None:
    rng = random.Random(7)
    ts = await env.round(rng, 120)
    assert env.client is not None
    ctx = env.client.query_context()

    def scan_in_ctx() -> list[dict[str, Any]]:
        return list(ctx.scan(KS, "by_name", consistency="at_plus", at=ts))

    first = await asyncio.to_thread(scan_in_ctx)
    assert ctx.pinned[KS] == ts
    await env.round(rng, 40)  # newer TS: the context still reads the pinned one
    assert await asyncio.to_thread(scan_in_ctx) == first
    for _ in range(5):  # the slices keep 5 snapshots: the pinned one is released
        await env.round(rng, 10)
    with pytest.raises(ShardexError) as info:
        await asyncio.to_thread(scan_in_ctx)
    assert info.value.code is ErrorCode.SNAPSHOT_TOO_OLD


async def test_errors_name_the_index_and_change_nothing(env: Env) -> None:
    await env.round(random.Random(8), 50)
    with pytest.raises(ShardexError) as info:
        await env.scan("nope")
    assert info.value.code is ErrorCode.INDEX_NOT_FOUND
    assert info.value.details["index"] == "nope"
    env.holder.state = env._state(BUILDING, "by_age")
    with pytest.raises(ShardexError) as info:
        await env.scan("by_age")
    assert info.value.code is ErrorCode.INDEX_NOT_READY
    assert info.value.details["state"] == BUILDING
    with pytest.raises(ShardexError) as info:
        await env.scan("by_name", [{"low": [1], "inclusion": "all"}])
    assert info.value.code is ErrorCode.BAD_REQUEST
    with pytest.raises(ShardexError) as info:
        await env.scan("by_name", consistency="at_plus")
    assert info.value.code is ErrorCode.BAD_REQUEST
    # A rolled-back data partition: the slices that applied beyond it answer INDEX_IN_ROLLBACK.
    p = next(p for p, e in env.ks.ts().items() if e.seqno > 1)
    for node in NODES:
        await env.ask(node, RollbackSlices(keyspace=KS, partition=p, seqno=0), SlicesRolledBack)
    with pytest.raises(ShardexError) as info:
        await env.scan("by_city")
    assert info.value.code is ErrorCode.INDEX_IN_ROLLBACK


async def test_back_pressure_bounds_what_a_slow_reader_is_sent(env: Env) -> None:
    ts = await env.many_in_paris()
    assert env.client is not None
    client = env.client
    res = await asyncio.to_thread(client.scan, KS, "#primary", None, "at_plus", ts)
    blocks = res.blocks()
    first = await asyncio.to_thread(next, blocks)
    assert first[0] < first[-1]
    out = env.nodes["n1"].streams
    (stream,) = [s for (c, _), s in out._streams.items() if c.peer_name == client.name + "/scan"]
    # Sends until its credit is spent, then waits: the block the reader took gives one back
    # (which may arrive after the initial credit ran out), so 1 + 4 and no more.
    await _until(lambda: stream.credit.available <= 0 and stream.blocks >= 1 + 4)
    assert stream.blocks == 1 + 4
    rest = await asyncio.to_thread(lambda: [e for b in blocks for e in b])
    assert len(first) + len(rest) == 12_000
    assert out.open_streams == 0
