"""The partitioned stream reader's per-batch calls without Spark or a cluster: what
``partitions`` costs per batch (the owner map kept between batches, ranges pickled as
tuples) and how ``latestOffset`` feeds the call statistics."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Coroutine
from typing import Any

import pytest

from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.pipeline.source import stream as source_stream
from shardex.pipeline.source.options import SourceOptions
from shardex.pipeline.source.stream import ShardexStreamReader
from shardex.pipeline.source.types import PartitionRange

OWNERS = {p: f"n{p % 3}" for p in range(8)}


class FakeRouter:
    def __init__(self) -> None:
        self.refreshes = 0
        self.reads = 0

    async def refresh(self) -> None:
        self.refreshes += 1

    async def keyspace(self, name: str) -> tuple[None, Topology]:
        self.reads += 1
        return None, Topology(seq_num=1, assignment=dict(OWNERS))


class FakeClient:
    """What ``_OffsetSource.owners`` uses of a client (its ``rpc``): ``run`` (a hop to the
    client's loop thread, counted) and the router."""

    def __init__(self) -> None:
        self.router = FakeRouter()
        self.rpc = self
        self.hops = 0

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        self.hops += 1
        return asyncio.run(coro)


def _reader() -> tuple[ShardexStreamReader, FakeClient]:
    opts = SourceOptions.parse({"addresses": "127.0.0.1:1", "secret": "s", "keyspace": "ks"})
    reader = ShardexStreamReader(opts)
    client = FakeClient()
    reader.offsets._client = client  # type: ignore[assignment]
    return reader, client


def _ts(seqno: int) -> dict[str, Any]:
    return Timestamp({p: (seqno + p, 7) for p in OWNERS}).to_json()


def test_partition_ranges_pickle_as_tuples_and_round_trip() -> None:
    r = PartitionRange(3, 10, 7, 25, 8)
    assert r.__reduce__() == (PartitionRange, (3, 10, 7, 25, 8))
    back = pickle.loads(pickle.dumps((r, PartitionRange(0, 0, 0, 4, 9))))
    assert back == (r, PartitionRange(0, 0, 0, 4, 9))
    assert back[0].count == 15


def test_partitions_reads_the_owner_map_once_per_refresh_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader, client = _reader()
    clock = [1000.0]
    monkeypatch.setattr(source_stream.time, "monotonic", lambda: clock[0])
    first = reader.partitions(_ts(0), _ts(10))
    assert (client.router.refreshes, client.router.reads) == (1, 1)
    hops = client.hops
    for i in range(1, 20):
        parts = reader.partitions(_ts(10 * i), _ts(10 * i + 10))
        # one task per owner node, every partition planned, with no trip to the client
        assert sorted(r.partition for t in parts for r in t.ranges) == sorted(OWNERS)
        assert len(parts) == 3
    assert client.hops == hops and len(first) == 3
    clock[0] += source_stream.OWNERS_MAX_AGE + 1  # the period ends: refreshed and read again
    reader.partitions(_ts(300), _ts(310))
    assert (client.router.refreshes, client.router.reads) == (2, 2)
    assert reader.partitions(_ts(5), _ts(5)) == []  # nothing moved: no task


def test_latest_offset_samples_the_rpc_apart_for_batches_and_idle_polls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader, _ = _reader()
    offsets = reader.offsets
    answers = [Timestamp.from_json(_ts(10)), Timestamp.from_json(_ts(10))]

    def high_seqnos(*, fresh: bool = False, partial: bool = False) -> Timestamp:
        offsets.last_rpc = 0.002
        return answers.pop(0)

    monkeypatch.setattr(offsets, "high_seqnos", high_seqnos)
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    assert reader.latestOffset(_ts(0), ReadAllAvailable()) == _ts(10)  # a batch
    assert reader.latestOffset(_ts(10), ReadAllAvailable()) == _ts(10)  # idle
    snap = offsets.stats.snapshot()
    assert snap["calls"] == {"latestOffset": 1, "latestOffset idle": 1}
    assert snap["samples"]["high_seqnos_rpc"] == 1
    assert snap["samples"]["high_seqnos_rpc idle"] == 1
    assert snap["latest_calls"] == 2
