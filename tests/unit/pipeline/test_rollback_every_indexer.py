"""A change-stream ROLLBACK reaches every indexer node of the cluster (``pipeline/rollback.py``),
not only the owners of the keyspace's current index topologies.

Real indexer engines stand in for three index nodes; the driver's sends go straight to them.
n1 owns both indexes' current topologies; n3 holds retired copies (its slices switched away)
that took rows of the branch the rollback discards: one queued them above the rollback seqno,
the other applied beyond it. n4 runs the index service but is unreachable; n5 runs no indexer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardex.api.delivery import RollbackSlices, SlicesRolledBack
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import NodeUnavailable
from shardex.index.engine import IndexerEngine
from shardex.index.records import STATE_ACTIVE, STATE_NEEDS_REBUILD
from shardex.meta.index_definition import make_definition
from shardex.meta.index_state import ACTIVE, IndexRecord
from shardex.pipeline import indexers, rollback
from shardex.pipeline.registry import IndexRegistry, IndexView
from shardex.pipeline.source.types import RollbackInfo
from shardex.testing.index import FakeKeyspace, LocalPipeline

KS = "ks"
ROLLBACK_SEQNO = 4  # data partition 0 rolled back to seqno 4: seqnos 5-7 are the lost branch
UUID = 0xABC

DEFS = [
    make_definition(id="prim", name="#primary", keyspace=KS, is_primary=True),
    make_definition(id="city", name="by_city", keyspace=KS, keys=["city"]),
]


class _Status:
    """What ``Client.cluster_status`` returns, as far as the rollback reads it."""

    def __init__(self, members: list[tuple[str, tuple[str, ...], str]]) -> None:
        self.members = [_Member(n, s, st) for n, s, st in members]


class _Member:
    def __init__(self, name: str, services: tuple[str, ...], state: str) -> None:
        self.name, self.services, self.state = name, services, state


class _Client:
    """Sends go to the engines (the index service's ``on_rollback`` is ``rollback_to``)."""

    def __init__(self, engines: dict[str, IndexerEngine], status: _Status) -> None:
        self.engines = engines
        self.status = status
        self.asked: list[str] = []
        self.unreachable = {"n4"}  # down in the membership: no engine answers for it
        self.rpc = self  # the client's RPC parts: ``run`` here

    def cluster_status(self) -> _Status:
        return self.status

    def run(self, coro: Any) -> Any:
        return asyncio.run(coro)


class _Registry(IndexRegistry):
    """The current topologies: both indexes on n1 alone (no coordinator to read)."""

    def __init__(self, moving: dict[int, str] | None = None) -> None:
        super().__init__(client=None, keyspace=KS)  # type: ignore[arg-type]
        topo = Topology(seq_num=2, assignment={0: "n1"})
        self._views = {
            d.id: IndexView(IndexRecord(definition=d, state=ACTIVE), topo, moving or {})
            for d in DEFS
        }
        self.forgotten: list[str] = []

    def refresh(self, *, force: bool = False) -> dict[str, IndexView]:
        return dict(self._views)

    def forget(self, index_id: str) -> None:
        self.forgotten.append(index_id)


def _ts(seqno: int) -> Timestamp:
    return Timestamp({0: (seqno, UUID)})


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[dict[str, IndexerEngine]]:
    out = {n: IndexerEngine(tmp_path / n, sync=False) for n in ("n1", "n3")}
    yield out
    for e in out.values():
        e.close()


@pytest.fixture
def cluster(
    engines: dict[str, IndexerEngine], monkeypatch: pytest.MonkeyPatch
) -> tuple[_Client, _Registry]:
    ks = FakeKeyspace(num_partitions=1, uuid=UUID)
    for i in range(7):  # seqnos 1-7 of data partition 0
        ks.upsert(f"d{i}", {"city": f"c{i}"})
    # n1 (current owner) is at seqno 3; n3's retired copies took the lost branch.
    LocalPipeline(DEFS, engines, {d.id: {0: "n1"} for d in DEFS}).create_slices()
    old = LocalPipeline(DEFS, engines, {d.id: {0: "n3"} for d in DEFS})
    old.create_slices()
    LocalPipeline(DEFS, engines, {d.id: {0: "n1"} for d in DEFS}).deliver(ks.changes(None, _ts(3)))
    for d in DEFS:
        engines["n1"].stabilise(d.id, _ts(3))
    old.deliver(ks.changes(None, _ts(7)))
    engines["n3"].stabilise("prim", _ts(2))  # 3-7 stay queued, 5-7 above the rollback point
    engines["n3"].stabilise("city", _ts(7))  # applied beyond the rollback point

    status = _Status(
        [
            ("n1", ("data", "index"), "up"),
            ("n3", ("index",), "up"),
            ("n4", ("index",), "down"),
            ("n5", ("data", "manager"), "up"),
        ]
    )
    client = _Client(engines, status)

    async def to_node(c: _Client, node: str, msg: Any, expect: type, timeout: Any = None) -> Any:
        assert isinstance(msg, RollbackSlices) and expect is SlicesRolledBack
        c.asked.append(node)
        if node in c.unreachable:
            raise NodeUnavailable(f"node {node!r} is unreachable")
        hit = c.engines[node].rollback_to(msg.keyspace, msg.partition, msg.seqno)
        return SlicesRolledBack(
            node=node, needs_rebuild=[(s.definition.id, s.partition) for s in hit]
        )

    monkeypatch.setattr(indexers, "to_node", to_node)
    return client, _Registry()


def _queued_above(engine: IndexerEngine, index_id: str, seqno: int) -> list[int]:
    sl = engine.slice(index_id, 0)
    return sorted(s for s in sl._queue.by_partition.get(0, {}) if s > seqno)


def test_a_node_outside_the_current_topologies_drops_the_lost_branch_and_is_marked(
    cluster: tuple[_Client, _Registry],
    engines: dict[str, IndexerEngine],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, registry = cluster
    n1, n3 = engines["n1"], engines["n3"]
    assert _queued_above(n3, "prim", ROLLBACK_SEQNO) == [5, 6, 7]
    assert n3.slice("city", 0).state == STATE_ACTIVE

    info = RollbackInfo(keyspace=KS, partition=0, rollback_seqno=ROLLBACK_SEQNO)
    with caplog.at_level(logging.WARNING, logger=rollback.__name__):
        rebuild = rollback.handle_rollback(client, registry, info)  # type: ignore[arg-type]

    # n3 is in no current topology, yet it was told: the lost branch's queued versions are
    # gone (the surviving ones at or below the point stay), the slice that applied beyond
    # the point needs a rebuild, and the index it belongs to is rebuilt.
    assert _queued_above(n3, "prim", ROLLBACK_SEQNO) == []
    assert sorted(n3.slice("prim", 0)._queue.by_partition[0]) == [3, 4]
    assert n3.slice("prim", 0).state == STATE_ACTIVE
    assert n3.slice("city", 0).state == STATE_NEEDS_REBUILD
    assert rebuild == ["city"] and registry.forgotten == ["city"]
    # The owner at seqno 3 is untouched.
    assert [n1.slice(d.id, 0).state for d in DEFS] == [STATE_ACTIVE, STATE_ACTIVE]
    # Every indexer member was asked, a node without the index service was not; the
    # unreachable one is named in a warning and did not fail the rollback.
    assert sorted(client.asked) == ["n1", "n3", "n4"]
    (line,) = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert "indexer n4" in line and "membership: down" in line


def test_an_unreachable_owner_still_fails_the_rollback(
    cluster: tuple[_Client, _Registry], engines: dict[str, IndexerEngine]
) -> None:
    client, registry = cluster
    client.unreachable.add("n1")  # the owner of the current topologies cannot be reached
    info = RollbackInfo(keyspace=KS, partition=0, rollback_seqno=ROLLBACK_SEQNO)
    with pytest.raises(NodeUnavailable):
        rollback.handle_rollback(client, registry, info)  # type: ignore[arg-type]
    # The other indexers were told all the same.
    assert engines["n3"].slice("city", 0).state == STATE_NEEDS_REBUILD
    assert registry.forgotten == []


def test_without_a_membership_the_owners_are_still_told(
    cluster: tuple[_Client, _Registry], engines: dict[str, IndexerEngine]
) -> None:
    client, registry = cluster

    def broken() -> Any:
        raise NodeUnavailable("the connected node is gone")

    client.cluster_status = broken  # type: ignore[method-assign]
    info = RollbackInfo(keyspace=KS, partition=0, rollback_seqno=ROLLBACK_SEQNO)
    assert rollback.handle_rollback(client, registry, info) == []  # type: ignore[arg-type]
    assert client.asked == ["n1"]


def test_a_move_target_is_an_owner_it_must_answer(
    cluster: tuple[_Client, _Registry], engines: dict[str, IndexerEngine]
) -> None:
    client, _ = cluster
    registry = _Registry(moving={0: "n4"})  # the stream routes to n4: it must be told
    info = RollbackInfo(keyspace=KS, partition=0, rollback_seqno=ROLLBACK_SEQNO)
    with pytest.raises(NodeUnavailable):
        rollback.handle_rollback(client, registry, info)  # type: ignore[arg-type]
    client.unreachable.clear()
    engines["n4"] = engines.pop("n3")  # reachable again, holding what n3 held
    assert rollback.handle_rollback(client, registry, info) == ["city"]  # type: ignore[arg-type]
    engines["n3"] = engines.pop("n4")  # closed by the fixture
