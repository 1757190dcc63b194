"""The timekeeper wired into a real ``Node`` (manager + data + index services, RocksDB, TCP
on loopback, in this process): AdvanceStability reaches the real indexer handlers, the TS is
published, and ``list_indexes`` / ``stability`` show it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardex.api.timekeeper import AdvanceStability, StabilityAdvanced
from shardex.client import Client, connect
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.member_list import MemoryMemberStore
from shardex.net.tcp import TcpTransport
from shardex.node.server import Node

pytestmark = pytest.mark.timeout(60)

SECRET = "timekeeper-node-secret"


class NodeThread:
    """One node on its own loop thread (the sync client runs on another)."""

    def __init__(self, data_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.node = Node(
            transport=TcpTransport(),
            secret=SECRET,
            name="node1",
            member_id="m-node1",
            address="127.0.0.1:0",
            services=("manager", "data", "index"),
            store=MemoryMemberStore(),
            heartbeat_interval=0.1,
            failure_timeout=0.6,
            data_dir=data_dir,
        )
        self.run(self.node.start())

    def run(self, coro: object, timeout: float = 30) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.run(self.node.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeThread]:
    n = NodeThread(tmp_path / "node1")
    try:
        deadline = time.monotonic() + 20
        while not (n.node.coordinator and n.node.coordinator.is_master):
            assert time.monotonic() < deadline, "no master"
            time.sleep(0.05)
        yield n
    finally:
        n.stop()


def advance(client: Client, ts: Timestamp, ids: list[str], **kw: object) -> StabilityAdvanced:
    msg = AdvanceStability(keyspace="ks", ts=dict(ts.to_wire()), index_ids=ids, **kw)  # type: ignore[arg-type]

    async def go() -> StabilityAdvanced:
        conn = await client.rpc.connection()
        return await conn.request(msg, 10, expect=StabilityAdvanced)

    return client.rpc.run(go())


def test_advance_on_a_real_node(node: NodeThread) -> None:
    with connect(node.node.address, secret=SECRET) as c:
        c.create_keyspace("ks", 4)
        ix = c.create_index("ks", "by_age", ["age"], partition_by=["META().id"], num_partition=2)
        assert ix["state"] == "BUILDING" and ix["stability_ts"] is None
        assert ix["stats_source"] == "indexers" and ix["items_count"] == 0
        ts = c.high_seqnos("ks")  # nothing written: every partition at seqno 0
        reply = advance(c, ts, [ix["id"], "no-such-index"], batch_id=1)
        # Allocated slices that applied the (empty) TS are stable at it.
        assert reply.published == [ix["id"]] and reply.skipped == ["no-such-index"]
        assert reply.items_count == {ix["id"]: 0}
        assert c.stability("ks") == {ix["id"]: ts}
        # The indexers are told after the reply: poll their view, with a deadline.
        deadline = time.monotonic() + 10
        listed = c.list_indexes("ks")[0]
        while listed["stability_ts"] is None and time.monotonic() < deadline:
            time.sleep(0.02)
            listed = c.list_indexes("ks")[0]
        assert listed["stability_ts"] == {p: 0 for p in range(4)}
        assert listed["stats_source"] == "indexers"
        # A delivery made to another incarnation of the indexer: STALE_DELIVERY, kept.
        with pytest.raises(ShardexError) as err:
            advance(c, ts, [ix["id"]], incarnations={"node1": "an-older-process"})
        assert err.value.code is ErrorCode.STALE_DELIVERY
        assert err.value.details["node"] == "node1"
