"""The short paths of a scan (its latency), over the same real-TCP two-node setup as
``test_scan_service.py``:

* a small scan is answered in the replies alone (no stream on either hop);
* a scan larger than what a reply carries continues as a stream after the reply's entries;
* a coordinator reads its own node's slices in-process (``local_index``) with the same
  results and errors as over the network;
* scan stability in one round: when the nodes' newest snapshots differ, the oldest is pinned
  and only the nodes that read another one are asked again;
* a coordinator sends the opens over live connections without a task per node;
* an indexer answers a ``ScanSlices`` that needs no wait in the receive callback (no task),
  one that waits in a task;
* an indexer reads on its event loop only when no slice lock is held; otherwise it waits in
  its scan pool and the loop keeps serving;
* the client sends its next scans of an index to the node holding most of its slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shardex.api.delivery import Stabilised, StabiliseSlices
from shardex.api.scan import ScanSlices
from shardex.api.scan_streams import OutStreams
from shardex.api.spans import encode_spans, to_user_spans
from shardex.client import connect
from shardex.client.scan import _EntryRows
from shardex.core.keycodec import decode_entry, encode_entry
from shardex.errors import ErrorCode, ShardexError
from shardex.index.scan_server import INLINE_ROWS, IndexScanServer
from shardex.scan.slice_opens import SliceOpens
from shardex.testing.index import random_workload
from tests.integration.scan_env import KS, NODES, SECRET, Env, _until, as_rows, oracle_rows


@contextlib.asynccontextmanager
async def _held_elsewhere(lock: contextlib.AbstractContextManager[Any]) -> AsyncIterator[None]:
    """``lock`` held by another thread for the block's duration (taken before it starts)."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        await asyncio.to_thread(locked.wait, 10)
        yield
    finally:
        release.set()
        await asyncio.to_thread(holder.join)


CITIES = ("lima", "oslo", "paris", "rome")


def user(i: int) -> dict[str, Any]:
    """A document every index of the workload holds (by_name needs type 'user')."""
    return {"type": "user", "name": f"n{i % 97:02}", "age": i % 50, "city": CITIES[i % 4]}


@pytest.fixture
def started_streams(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The scan ids of every outgoing stream any node starts."""
    started: list[int] = []
    real = OutStreams.start

    def spy(self: OutStreams, conn: Any, scan_id: int, credit: int, producer: Any) -> Any:
        started.append(scan_id)
        return real(self, conn, scan_id, credit, producer)

    monkeypatch.setattr(OutStreams, "start", spy)
    return started


async def test_a_small_scan_is_answered_by_the_replies_alone(
    env: Env, started_streams: list[int]
) -> None:
    ts = await env.round(random.Random(11), 300)
    assert env.client is not None
    client = env.client
    want = oracle_rows(env.defs["by_name"], env.ks.documents_at(ts), None)
    assert 20 < len(want) < INLINE_ROWS
    res = await asyncio.to_thread(client.scan, KS, "by_name", None, "at_plus", ts, 20, 3)
    assert res.started.done and len(res.started.entries) == 20
    assert as_rows(await asyncio.to_thread(list, res)) == want[3:23]
    res = await asyncio.to_thread(client.scan, KS, "by_name", None, "at_plus", ts)
    assert as_rows(await asyncio.to_thread(list, res)) == want
    res = await asyncio.to_thread(client.scan, KS, "by_name", None, "at_plus", ts, ordered=False)
    assert res.started.done  # the slices' answers come back as one block
    assert sorted(as_rows(await asyncio.to_thread(list, res)), key=repr) == sorted(want, key=repr)
    assert started_streams == []  # no ScanBlock / ScanEnd on either hop
    for node in env.nodes.values():
        assert node.streams.open_streams == 0


async def test_a_large_scan_streams_what_follows_the_replys_entries(
    env: Env, started_streams: list[int]
) -> None:
    for i in range(3 * INLINE_ROWS):
        env.ks.upsert(f"d{i:05}", user(i))
    ts = env.ks.ts()
    await env.deliver(ts)
    await env.stabilise(ts)
    want = oracle_rows(env.defs["by_name"], env.ks.documents_at(ts), None)
    got = await env.scan("by_name", consistency="at_plus", at=ts)
    assert as_rows(got) == want  # the k-way merge puts the replies' entries first per slice
    unordered = await env.scan("by_name", consistency="at_plus", at=ts, ordered=False)
    assert sorted(as_rows(unordered), key=repr) == sorted(want, key=repr)
    assert started_streams  # the rest came as streams


async def test_the_coordinators_own_slices_are_read_in_process(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    for node in env.nodes.values():
        node.coord.local_index = node.scan_server
    local_opens: list[list[int]] = []
    real = type(env.nodes["n1"].scan_server).open_local

    async def spy(self: Any, msg: ScanSlices) -> Any:
        local_opens.append(msg.partitions)
        return await real(self, msg)

    monkeypatch.setattr(type(env.nodes["n1"].scan_server), "open_local", spy)
    rng = random.Random(12)
    ts = await env.round(rng, 200)
    for i in range(2 * INLINE_ROWS):  # large enough that the local rest is streamed too
        env.ks.upsert(f"big{i:05}", user(i))
    ts = env.ks.ts()
    await env.deliver(ts)
    await env.stabilise(ts)
    docs = env.ks.documents_at(ts)
    for name, spans in [("by_name", None), ("by_city", [{"low": ["lima"], "high": ["rome"]}])]:
        want = oracle_rows(env.defs[name], docs, spans)
        assert as_rows(await env.scan(name, spans, consistency="at_plus", at=ts)) == want
        page = await env.scan(name, spans, "at_plus", ts, limit=15, offset=7)
        assert as_rows(page) == want[7:22]
    assert local_opens and all(p for p in local_opens)
    # Errors of the local slices are the same errors: a released snapshot.
    ctx = env.client.query_context() if env.client is not None else None
    assert ctx is not None
    await asyncio.to_thread(lambda: list(ctx.scan(KS, "by_name", consistency="at_plus", at=ts)))
    for _ in range(6):
        await env.round(rng, 5)
    with pytest.raises(ShardexError) as info:
        await asyncio.to_thread(lambda: list(ctx.scan(KS, "by_name")))
    assert info.value.code is ErrorCode.SNAPSHOT_TOO_OLD


async def test_stability_pins_the_oldest_snapshot_when_nodes_differ(env: Env) -> None:
    rng = random.Random(13)
    old = await env.round(rng, 150)
    random_workload(env.ks, rng, 80)
    new = env.ks.ts()
    await env.deliver(new)
    ids = [d.id for d in env.defs.values()]
    # Only n1 stabilises the newer TS: n1's newest snapshot is `new`, n2's is `old`.
    msg = StabiliseSlices(keyspace=KS, ts=dict(new.to_wire()), index_ids=ids)
    await env.ask("n1", msg, Stabilised)
    opened: list[tuple[str, Any]] = []
    for name in NODES:
        server = env.nodes[name].scan_server
        real = server._arrival  # once per open, answered at once or after a wait

        def spy(msg: ScanSlices, real: Any = real, name: str = name) -> Any:
            opened.append((name, msg.snapshot_ts))
            return real(msg)

        server._arrival = spy  # type: ignore[method-assign]
    assert env.client is not None
    client = env.client
    res = await asyncio.to_thread(client.scan, KS, "by_name", None, stability="scan")
    rows = await asyncio.to_thread(list, res)
    assert res.ts == old  # one TS for every slice: the one both nodes hold
    assert as_rows(rows) == oracle_rows(env.defs["by_name"], env.ks.documents_at(old), None)
    # One round to both, then n1 alone again at the pinned TS.
    assert sorted(n for n, ts in opened if ts is None) == ["n1", "n2"]
    assert [n for n, ts in opened if ts is not None] == ["n1"]
    # Once n2 has it too, one round is enough.
    await env.ask("n2", msg, Stabilised)
    opened.clear()
    res = await asyncio.to_thread(client.scan, KS, "by_name", None, stability="scan")
    rows = await asyncio.to_thread(list, res)
    assert res.ts == new and len(opened) == 2
    assert as_rows(rows) == oracle_rows(env.defs["by_name"], env.ks.documents_at(new), None)


async def test_an_open_that_needs_no_wait_is_answered_in_the_receive_callback(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(16)
    ts = await env.round(rng, 150)
    in_task: list[bool] = []
    waited: list[list[int]] = []
    real_now, real_wait = IndexScanServer._open_now, IndexScanServer._scan_waiting

    def now_spy(self: IndexScanServer, msg: ScanSlices, **kw: Any) -> Any:
        in_task.append(asyncio.current_task() is not None)
        return real_now(self, msg, **kw)

    async def wait_spy(self: IndexScanServer, msg: ScanSlices, conn: Any) -> Any:
        waited.append(msg.partitions)
        return await real_wait(self, msg, conn)

    monkeypatch.setattr(IndexScanServer, "_open_now", now_spy)
    monkeypatch.setattr(IndexScanServer, "_scan_waiting", wait_spy)
    want = oracle_rows(env.defs["by_name"], env.ks.documents_at(ts), None)
    assert as_rows(await env.scan("by_name", consistency="at_plus", at=ts)) == want
    assert as_rows(await env.scan("by_name", limit=7)) == want[:7]
    # Every slice opened in the receive callback, outside any task, none waited.
    assert in_task and not any(in_task)
    assert waited == []
    # A TS the slices do not cover yet: the open waits, in a task, for the delivery.
    random_workload(env.ks, rng, 60)
    new = env.ks.ts()
    scan = asyncio.ensure_future(env.scan("by_name", consistency="at_plus", at=new))
    await _until(lambda: len(waited) == len(NODES))
    assert not scan.done()
    await env.deliver(new)
    await env.stabilise(new)
    assert as_rows(await scan) == oracle_rows(env.defs["by_name"], env.ks.documents_at(new), None)


async def test_opens_over_live_connections_go_out_without_a_task_per_node(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    for node in env.nodes.values():
        node.coord.local_index = node.scan_server
    ts = await env.round(random.Random(17), 200)
    ways: list[str] = []
    real_sent, real_tasks = SliceOpens._sent, SliceOpens._in_tasks

    async def sent_spy(self: SliceOpens, *args: Any) -> Any:
        ways.append("sent")
        return await real_sent(self, *args)

    async def tasks_spy(self: SliceOpens, *args: Any) -> Any:
        ways.append("tasks")
        return await real_tasks(self, *args)

    monkeypatch.setattr(SliceOpens, "_sent", sent_spy)
    monkeypatch.setattr(SliceOpens, "_in_tasks", tasks_spy)
    want = oracle_rows(env.defs["by_name"], env.ks.documents_at(ts), None)
    for _ in range(3):
        assert as_rows(await env.scan("by_name", consistency="at_plus", at=ts)) == want
        assert as_rows(await env.scan("by_name", limit=9, offset=2)) == want[2:11]
    # by_name has slices on both nodes: once connected, no open runs in a task of its own.
    assert ways[-4:] == ["sent"] * 4
    # The other node's failure is the scan's error, and no stream is left open.
    real_now = IndexScanServer._open_now
    n2 = env.nodes["n2"].scan_server

    def failing(self: IndexScanServer, msg: ScanSlices, **kw: Any) -> Any:
        if self is n2:
            raise ShardexError("slices not ready", code=ErrorCode.INDEX_NOT_READY)
        return real_now(self, msg, **kw)

    monkeypatch.setattr(IndexScanServer, "_open_now", failing)
    with pytest.raises(ShardexError) as info:
        await env.scan("by_name", consistency="at_plus", at=ts)
    assert info.value.code is ErrorCode.INDEX_NOT_READY
    assert ways[-1] == "sent"
    for node in env.nodes.values():
        assert node.streams.open_streams == 0


async def test_a_held_slice_lock_sends_the_read_to_the_pool_not_the_loop(env: Env) -> None:
    ts = await env.round(random.Random(14), 100)
    server = env.nodes["n1"].scan_server
    held = server.host.engine.slice(env.defs["by_city"].id, 0)
    async with _held_elsewhere(held.lock):  # as by a stabilise's fsync
        scan = asyncio.ensure_future(env.scan("by_city", consistency="at_plus", at=ts))
        # The node's event loop keeps serving (a blocked loop would not answer this) ...
        for _ in range(3):
            await asyncio.sleep(0.05)
            assert not scan.done()
        ping = await env.scan("by_name", limit=1)  # n1 coordinates; by_name needs no lock
        assert len(ping) == 1
    got = await scan  # ... and the scan completes once the lock is free
    assert as_rows(got) == oracle_rows(env.defs["by_city"], env.ks.documents_at(ts), None)


async def test_a_point_read_takes_few_entries_on_the_loop_and_leaves_more_to_read_local(
    env: Env,
) -> None:
    """``read_local_now`` (a SQL point read's index read): the very entries ``read_local``
    yields when they are at most ``most``; None past that, and None while a slice lock is
    held elsewhere (the read must not block the loop)."""
    ts = await env.round(random.Random(15), 300)
    server = env.nodes["n1"].scan_server
    defn = env.defs["by_city"]
    parts = sorted(p for p, n in env.placement[defn.id].items() if n == "n1")
    for spans in (None, [{"low": ["lima"], "high": ["lima"]}]):
        enc = encode_spans(to_user_spans(spans), defn) if spans else None
        blocks = server.read_local(defn.id, parts, enc, ts, ordered=False)
        want = [e async for block in blocks for e in block]
        assert len(want) > 1, spans
        assert server.read_local_now(defn.id, parts, enc, ts, len(want)) == want
        assert server.read_local_now(defn.id, parts, enc, ts, len(want) + 5) == want
        assert server.read_local_now(defn.id, parts, enc, ts, len(want) - 1) is None
    held = server.host.engine.slice(defn.id, parts[0])
    async with _held_elsewhere(held.lock):
        assert server.read_local_now(defn.id, parts, None, ts, 10_000) is None


def test_rows_decode_each_distinct_key_once_and_own_their_key_lists() -> None:
    desc = [True, False]  # a DESC part: the prefix check works on the encoded bytes
    keys = [["rome", 3], ["rome", 3], ["rome", 30], ["oslo", 3], ["oslo", 3]]
    entries = sorted(encode_entry(k, f"d{i}", desc) for i, k in enumerate(keys))
    want = [{"docid": d, "key": k} for k, d in (decode_entry(e, desc) for e in entries)]
    rows = list(_EntryRows(desc, covering=True).of(entries))
    assert rows == want
    rows[0]["key"].append("mine")
    assert rows[1]["key"] == want[1]["key"]
    assert list(_EntryRows(desc, covering=False).of(entries)) == [
        {"docid": r["docid"]} for r in want
    ]


async def test_the_client_sends_its_next_scans_where_the_slices_are(env: Env) -> None:
    ts = await env.round(random.Random(15), 120)
    want = oracle_rows(env.defs["by_city"], env.ks.documents_at(ts), None)
    n1, n2 = env.nodes["n1"].address, env.nodes["n2"].address
    client = await asyncio.to_thread(connect, n2, secret=SECRET, name="via-n2")
    try:
        # by_city's one slice is on n1: n2 coordinates the first scan and names n1 ...
        res = await asyncio.to_thread(client.scan, KS, "by_city", None, "at_plus", ts)
        assert res.started.prefer == n1
        assert as_rows(await asyncio.to_thread(list, res)) == want
        # ... which coordinates the next ones (no node holds more of them)
        res = await asyncio.to_thread(client.scan, KS, "by_city", None, "at_plus", ts)
        assert res.started.prefer == ""
        assert as_rows(await asyncio.to_thread(list, res)) == want
        targets = client._scans.targets  # both scan paths' (``ScanTargets``)
        assert targets.prefer == {(KS, "by_city"): n1}
        # A preferred node that cannot be reached is skipped and forgotten.
        targets.prefer[(KS, "by_city")] = "127.0.0.1:1"
        res = await asyncio.to_thread(client.scan, KS, "by_city", None, "at_plus", ts)
        assert as_rows(await asyncio.to_thread(list, res)) == want
        assert targets.prefer == {(KS, "by_city"): n1}
    finally:
        await asyncio.to_thread(client.close)
