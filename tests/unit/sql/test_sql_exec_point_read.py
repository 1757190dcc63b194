"""A request_plus point read run in-process (``point_read``, via ``local_leaf.speculate``):
the rows it answers equal the leaf pipeline's, it stands only at a snapshot that covers the
high seqnos read after the statement arrived (a write acknowledged before the statement is
seen), it hands a large read to the leaf, and an owner's failure ends the rows as it ends
the leaf's. The index and the document owners are fakes that record what was asked."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from shardex.core.keycodec import encode_entry
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.local_leaf import LocalRun, speculate
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.plan import PhysicalPlan, bind_statement, plan_select
from shardex.sql.exec.point_read import POINT_ROWS, point_shaped
from shardex.sql.exec.rows import decode_row
from tests.unit.sql.test_sql_exec_plan import BY_CITY, KS, MEMBERS, STATE

SQL = f"SELECT META().id AS id, name FROM {KS} WHERE city = $1 AND age = $2"
PARAMS = ["rome", 30]
OLD, NEW = 5, 6  # partition 0's seqno in the index's newest snapshot, and after a write


def _ts(seqno: int) -> Timestamp:
    return Timestamp({0: (seqno, 1)})


class FakeIndex:
    """Snapshots by partition 0's seqno: the entries the spans find in each."""

    def __init__(self, newest: int, entries: dict[int, list[bytes]]) -> None:
        self.newest = newest
        self.entries = entries
        self.waited: list[Timestamp | None] = []
        self.point_reads: list[int] = []
        self.leaf_reads: list[int] = []

    async def stable_ts(
        self, index_id: str, partitions: list[int], wait_for: Timestamp | None, timeout: float
    ) -> Timestamp:
        assert index_id == BY_CITY.id
        self.waited.append(wait_for)
        if wait_for is None:
            return _ts(self.newest)
        self.newest = max(self.newest, wait_for.to_wire()[0][0])  # the pipeline caught up
        return _ts(self.newest)

    def read_local_now(
        self, index_id: str, partitions: list[int], spans: Any, ts: Timestamp, most: int
    ) -> list[bytes] | None:
        seqno = ts.to_wire()[0][0]
        self.point_reads.append(seqno)
        found = self.entries[seqno]
        return None if len(found) > most else list(found)

    async def read_local(
        self, index_id: str, partitions: list[int], spans: Any, ts: Timestamp, **kw: Any
    ) -> AsyncIterator[list[bytes]]:
        seqno = ts.to_wire()[0][0]
        self.leaf_reads.append(seqno)
        found = self.entries[seqno]
        for i in range(0, len(found), 100):
            yield found[i : i + 100]


class FakeDocuments:
    """The documents, none of them this node's: every fetch goes to an owner, which fails
    with ``fail`` while it is set."""

    def __init__(self, docs: dict[str, Any]) -> None:
        self.docs = docs
        self.fail: ShardexError | None = None
        self.fetches = 0

    def get_many_now(self, keyspace: str, docids: list[str]) -> None:
        return None

    async def get_many(self, keyspace: str, docids: list[str]) -> list[tuple[str, Any]]:
        self.fetches += 1
        if self.fail is not None:
            raise self.fail
        return [(d, self.docs[d]) for d in docids if d in self.docs]


def _entries(ids: list[str]) -> list[bytes]:
    return sorted(encode_entry(["rome", 30], d) for d in ids)


def _plan(tuning: dict[str, bool] | None = None) -> PhysicalPlan:
    plan = plan_select(
        bind_statement(SQL, False), PARAMS, state=STATE, members=MEMBERS, tuning=tuning
    )
    plan.query_id = "q1"
    return plan


async def _run(
    index: FakeIndex,
    docs: FakeDocuments,
    high: Mapping[int, tuple[int, int]],
    tuning: dict[str, bool] | None = None,
) -> tuple[PhysicalPlan, Timestamp, list[Any]]:
    plan = _plan(tuning)

    async def seqnos() -> Mapping[int, tuple[int, int]]:
        return high

    local = LocalRun(plan, SQL, False, 1 << 24, True)
    ts, chunks = await speculate(
        index,  # type: ignore[arg-type]
        docs,  # type: ignore[arg-type]
        NodeMemory(1 << 26),
        local,
        seqnos(),
        PARAMS,
        "q1",
        5.0,
    )
    return plan, ts, [decode_row(c) async for chunk in chunks for c in chunk]


def test_a_one_leaf_fetching_rows_plan_is_a_point_read_and_its_switch_turns_it_off() -> None:
    plan = _plan()
    assert plan.record is BY_CITY and len(plan.leaves) == 1 and plan.mode == "rows"
    assert point_shaped(plan, False)
    assert not point_shaped(plan, True)  # a DML's SELECT keeps its leaf
    assert not point_shaped(_plan({"point_read": False}), False)
    covering = plan_select(
        bind_statement(f"SELECT age FROM {KS} WHERE city = $1", False),
        ["rome"],
        state=STATE,
        members=MEMBERS,
    )
    assert not point_shaped(covering, False)  # nothing to fetch: the leaf is as short


async def test_at_a_covering_snapshot_the_point_read_answers_without_the_leaf() -> None:
    index = FakeIndex(NEW, {NEW: _entries(["u1"])})
    docs = FakeDocuments({"u1": {"city": "rome", "age": 30, "name": "ann"}})
    plan, ts, rows = await _run(index, docs, {0: (NEW, 1)})
    assert rows == [{"id": "u1", "name": "ann"}]
    assert plan.point and ts == _ts(NEW)
    assert index.point_reads == [NEW] and index.leaf_reads == [] and index.waited == [None]


async def test_a_write_acknowledged_before_the_statement_is_seen() -> None:
    """The index's newest snapshot predates the write the round's seqnos name: its rows
    (none) are dropped and the read runs again at a snapshot that covers the write."""
    index = FakeIndex(OLD, {OLD: [], NEW: _entries(["u9"])})
    docs = FakeDocuments({"u9": {"city": "rome", "age": 30, "name": "new"}})
    plan, ts, rows = await _run(index, docs, {0: (NEW, 1)})
    assert rows == [{"id": "u9", "name": "new"}]
    assert ts == _ts(NEW) and plan.point
    assert index.waited == [None, _ts(NEW)] and index.point_reads == [OLD, NEW]


async def test_more_entries_than_a_point_read_takes_run_the_leaf_with_the_same_rows() -> None:
    ids = [f"u{i:03d}" for i in range(POINT_ROWS + 1)]
    docs = FakeDocuments({d: {"city": "rome", "age": 30, "name": d} for d in ids})
    index = FakeIndex(NEW, {NEW: _entries(ids)})
    plan, _, rows = await _run(index, docs, {0: (NEW, 1)})
    assert sorted(r["id"] for r in rows) == ids and not plan.point
    assert index.point_reads == [NEW] and index.leaf_reads == [NEW]
    # The switch off: the leaf alone, the same rows.
    off = FakeIndex(NEW, {NEW: _entries(ids[:3])})
    plan, _, rows = await _run(off, docs, {0: (NEW, 1)}, {"point_read": False})
    assert [r["id"] for r in rows] == ids[:3] and not plan.point
    assert off.point_reads == [] and off.leaf_reads == [NEW]


@pytest.mark.parametrize("point_read", [True, False])
async def test_a_lost_owner_ends_the_rows_as_it_ends_the_leafs(point_read: bool) -> None:
    """An owner that fails the fetch at a covering snapshot ends the statement's rows with
    its error, with the point read as with the leaf (the statement's failover rules see the
    same error); at a snapshot that does not cover the round, the failed read is dropped
    and the read at a covering one stands."""
    tuning = {"point_read": point_read}
    docs = FakeDocuments({"u1": {"city": "rome", "age": 30, "name": "ann"}})
    docs.fail = ShardexError("node n2 is down", code=ErrorCode.NODE_UNAVAILABLE)
    index = FakeIndex(NEW, {NEW: _entries(["u1"])})
    with pytest.raises(ShardexError) as err:
        await _run(index, docs, {0: (NEW, 1)}, tuning)
    assert err.value.code is ErrorCode.NODE_UNAVAILABLE and "n2" in str(err.value)

    index = FakeIndex(OLD, {OLD: _entries(["u1"]), NEW: _entries(["u1"])})
    original = index.stable_ts

    async def owner_back(*args: Any) -> Timestamp:
        if args[2] is not None:  # waiting for a covering snapshot: the failover happened
            docs.fail = None
        return await original(*args)

    index.stable_ts = owner_back  # type: ignore[method-assign]
    plan, ts, rows = await _run(index, docs, {0: (NEW, 1)}, tuning)
    assert rows == [{"id": "u1", "name": "ann"}] and ts == _ts(NEW)
    assert plan.point is point_read
