"""Leaf calls (``sql/exec/leaf_calls.py``): which statements ask their leaves by request and
reply, the result made from the replies, the protocol taking over when a leaf's rows outgrow
a reply, and a lost leaf node named so the statement fails over."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from shardex.api.query_ids import QueryId
from shardex.api.sql_exec import LeafCancel, LeafRequest, LeafRows
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.failover import failed_leaf
from shardex.sql.exec.leaf_calls import (
    CALL_MAX_BYTES,
    CALL_MAX_ROWS,
    LARGE_BACKOFF,
    LeafCalls,
    SeqnoRide,
    answer_leaf,
)
from shardex.sql.exec.local_leaf import LocalRun
from shardex.sql.exec.memory import MIN_QUERY_MEMORY, NodeMemory, value_size
from shardex.sql.exec.plan import PhysicalPlan, bind_statement, plan_select
from shardex.sql.exec.rows import decode_row, encode_row
from tests.unit.sql.test_sql_exec_plan import KS, MEMBERS, STATE

# ``by_age``: 4 partitions by META().id over 3 nodes: a range on age has 3 leaves.
ROWS = f"SELECT META().id AS id, age FROM {KS} WHERE age >= 30"


def _plan(sql: str, tuning: dict[str, bool] | None = None) -> PhysicalPlan:
    b = bind_statement(sql, False)
    return plan_select(b, None, state=STATE, members=MEMBERS, tuning=tuning)


class _Directory:
    def __init__(self, down: set[str] | None = None) -> None:
        self.down = down or set()

    def is_down(self, member: str) -> bool:
        return member in self.down


class _Query:
    """What ``LeafCalls`` reads of the ``QueryService``: this member and the directory."""

    def __init__(self, member_id: str = "m9", down: set[str] | None = None) -> None:
        self.member_id = member_id
        self.directory = _Directory(down)


class _Pool:
    """Answers each ``LeafRequest`` by its leaf's address (the node name here)."""

    def __init__(self, replies: dict[str, LeafRows | ShardexError]) -> None:
        self.replies = replies
        self.asked: list[tuple[str, LeafRequest]] = []
        self.sent: list[tuple[str, Any]] = []  # one-way messages (LeafCancel)

    async def send(self, address: str, msg: Any) -> None:
        self.sent.append((address, msg))

    async def request(self, address: str, msg: Any, timeout: float, *, expect: Any) -> Any:
        self.asked.append((address, msg))
        reply = self.replies[address]
        if isinstance(reply, ShardexError):
            raise reply
        return reply


class _View:
    """What ``LeafCalls`` reads of the ``ClusterView``: addresses (the node names here), the
    data owners and the high-seqno rounds, recorded."""

    def __init__(self, owners: dict[str, list[int]] | None = None) -> None:
        self.owners = owners or {}
        self.skipped: list[str] = []
        self.known: list[dict[int, tuple[int, int]]] = []

    def address(self, node: str) -> str:
        return node

    async def data_owners(self, keyspace: str) -> dict[str, list[int]]:
        return self.owners

    def shared_partial_high_seqnos(
        self, keyspace: str, skip: Any, owners: dict[str, list[int]]
    ) -> asyncio.Future[dict[int, tuple[int, int]]]:
        self.skipped = sorted(skip)
        fut = asyncio.get_running_loop().create_future()
        asked = [p for n, ps in owners.items() if n not in self.skipped for p in ps]
        fut.set_result({p: (7, 1) for p in asked})
        return fut

    async def high_seqnos(self, keyspace: str, *, known: Any) -> Any:
        self.known.append(dict(known))
        return known


class _Scan:
    """What ``LeafCalls`` reads of the ``ScanCoordinator``: its view."""

    def __init__(self, view: _View) -> None:
        self.view = view
        self.local_index = None


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _calls(
    pool: _Pool, query: _Query | None = None, clock: _Clock | None = None, view: Any = None
) -> LeafCalls:
    return LeafCalls(
        query or _Query(),  # type: ignore[arg-type]
        pool,  # type: ignore[arg-type]
        _Scan(view or _View()),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]  # a rows plan's root reads no document
        NodeMemory(),
        clock or _Clock(),
    )


def _rows(node: str, n: int) -> LeafRows:
    return LeafRows(rows=[encode_row({"id": f"{node}-{i}"}) for i in range(n)], complete=True)


async def _collect(chunks: AsyncIterator[list[bytes]]) -> list[Any]:
    return [decode_row(cell) async for chunk in chunks for cell in chunk]


async def _never() -> AsyncIterator[list[bytes]]:
    raise AssertionError("streamed although every leaf answered")
    yield []  # pragma: no cover


def test_small_results_call_their_leaves_and_large_ones_keep_the_stream() -> None:
    calls = _calls(_Pool({}))
    assert calls.wanted(_plan(ROWS), ROWS, False)  # rows mode: learns early when large
    limited = ROWS + f" ORDER BY age LIMIT {CALL_MAX_ROWS}"
    assert calls.wanted(_plan(limited), limited, False)
    for sql, why in [
        (ROWS + f" ORDER BY age LIMIT {CALL_MAX_ROWS + 1}", "a LIMIT past the bound"),
        (ROWS + " ORDER BY age", "a sort without LIMIT reads everything first"),
        (f"SELECT age, COUNT(*) AS n FROM {KS} WHERE age >= 30 GROUP BY age", "GROUP BY"),
        (f"SELECT DISTINCT age FROM {KS} WHERE age >= 30", "DISTINCT"),
    ]:
        assert not calls.wanted(_plan(sql), sql, False), why
    assert not calls.wanted(_plan(ROWS), ROWS, True), "a DML's derived SELECT"
    off = _plan(ROWS, tuning={"leaf_calls": False})
    assert not calls.wanted(off, ROWS, False), "the switch off"
    keys = f"SELECT name FROM {KS} USE KEYS 'a'"
    assert not calls.wanted(_plan(keys), keys, False), "no index leaves"


async def test_the_result_is_the_leaves_rows_in_plan_order_with_the_limit() -> None:
    sql = ROWS + " LIMIT 4"
    plan = _plan(sql)
    nodes = [leaf.node for leaf in plan.leaves]
    assert len(nodes) == 3
    pool = _Pool({node: _rows(node, 2) for node in nodes})
    calls = _calls(pool)
    local = LocalRun(plan, sql, False, 1 << 20, True)
    q = QueryId("m9", "q1")
    got = await _collect(calls.rows(None, local, q, None, [], 5.0, _never))
    assert got == [{"id": f"{n}-{i}"} for n in nodes[:2] for i in range(2)]
    # One request per leaf, each with its own leaf's arguments and the bound.
    assert sorted(a for a, _ in pool.asked) == sorted(nodes)
    for address, msg in pool.asked:
        leaf = next(leaf for leaf in plan.leaves if leaf.node == address)
        assert msg.args["partitions"] == leaf.partitions and msg.query_id == q
        assert msg.max_bytes == CALL_MAX_BYTES and msg.timeout == 5.0


async def test_a_leaf_past_the_bound_hands_the_statement_to_the_stream() -> None:
    plan = _plan(ROWS)
    nodes = [leaf.node for leaf in plan.leaves]
    replies: dict[str, LeafRows | ShardexError] = {n: _rows(n, 1) for n in nodes}
    replies[nodes[1]] = LeafRows(rows=[], complete=False)
    clock = _Clock()
    calls = _calls(_Pool(replies), clock=clock)
    streamed = [encode_row({"id": "streamed"})]

    async def stream() -> AsyncIterator[list[bytes]]:
        async def chunks() -> AsyncIterator[list[bytes]]:
            yield streamed

        return chunks()

    local = LocalRun(plan, ROWS, False, 1 << 20, True)
    got = await _collect(calls.rows(None, local, QueryId("m9", "q"), None, [], 5.0, stream))
    assert got == [{"id": "streamed"}]  # nothing of the called leaves' rows
    # The text keeps the stream for a while, then is tried again.
    assert not calls.wanted(_plan(ROWS), ROWS, False)
    clock.now += LARGE_BACKOFF + 0.1
    assert calls.wanted(_plan(ROWS), ROWS, False)


@pytest.mark.parametrize("code", [ErrorCode.CONNECTION_CLOSED, ErrorCode.NODE_UNAVAILABLE])
async def test_a_lost_leaf_node_is_named_so_the_statement_fails_over(code: ErrorCode) -> None:
    plan = _plan(ROWS)
    lost = plan.leaves[2]
    replies: dict[str, LeafRows | ShardexError] = {
        leaf.node: _rows(leaf.node, 1) for leaf in plan.leaves
    }
    replies[lost.node] = ShardexError("gone", code=code, details={"value": "127.0.0.1:1"})
    calls = _calls(_Pool(replies))
    local = LocalRun(plan, ROWS, False, 1 << 20, True)
    with pytest.raises(ShardexError) as info:
        await _collect(calls.rows(None, local, QueryId("m9", "q"), None, [], 5.0, _never))
    assert info.value.code is code
    assert failed_leaf(info.value, plan) == lost.node


async def test_a_leaf_node_known_down_is_not_asked() -> None:
    plan = _plan(ROWS)
    down = plan.leaves[0]
    pool = _Pool({leaf.node: _rows(leaf.node, 1) for leaf in plan.leaves})
    calls = _calls(pool, _Query(down={down.member}))
    local = LocalRun(plan, ROWS, False, 1 << 20, True)
    with pytest.raises(ShardexError) as info:
        await _collect(calls.rows(None, local, QueryId("m9", "q"), None, [], 5.0, _never))
    assert info.value.code is ErrorCode.NODE_UNAVAILABLE
    assert failed_leaf(info.value, plan) == down.node
    assert down.node not in [a for a, _ in pool.asked]


class _IndexScan:
    """A leaf node's index service, as far as a call reads it before the leaf: the high
    seqnos it serves."""

    def high_seqnos_here(self, keyspace: str, partitions: list[int]) -> Any:
        return {p: (3, 1) for p in partitions} if partitions else None


async def test_a_leaf_call_stops_reading_once_past_the_bound(monkeypatch: Any) -> None:
    import shardex.sql.exec.leaf_calls as leaf_calls

    read: list[int] = []
    closed: list[bool] = []

    async def pipeline(*args: Any) -> AsyncIterator[list[bytes]]:
        try:
            for i in range(100):
                read.append(i)
                yield [b"x" * 100]
        finally:
            closed.append(True)

    monkeypatch.setattr(leaf_calls, "leaf_pipeline", pipeline)
    msg = LeafRequest(query_id=QueryId("m1", "q"), args={}, params=[], timeout=5, max_bytes=250)
    reply = await answer_leaf(_IndexScan(), None, NodeMemory(), msg, "m2")  # type: ignore[arg-type]
    assert reply == LeafRows(rows=[], complete=False)
    assert read == [0, 1, 2] and closed == [True]
    big = LeafRequest(
        query_id=QueryId("m1", "q"),
        args={},
        params=[],
        timeout=5,
        max_bytes=10**6,
        seqnos_keyspace=KS,
        seqnos_of=[4],
    )
    reply = await answer_leaf(_IndexScan(), None, NodeMemory(), big, "m2")  # type: ignore[arg-type]
    assert reply.complete and len(reply.rows) == 100
    assert reply.high_seqnos == {4: (3, 1)}  # read on arrival, answered with the rows


async def test_a_node_without_an_index_service_refuses_a_leaf_call() -> None:
    msg = LeafRequest(query_id=QueryId("m1", "q"), args={}, params=[], timeout=5, max_bytes=9)
    with pytest.raises(ShardexError) as info:
        await answer_leaf(None, None, NodeMemory(), msg, "m2")  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.QUERY_STATE and "m2" in info.value.message


class _SeqnoPool(_Pool):
    """Each leaf node answers the high seqnos it was asked for, as (seqno 5, uuid 1)."""

    async def request(self, address: str, msg: Any, timeout: float, *, expect: Any) -> Any:
        reply = await super().request(address, msg, timeout, expect=expect)
        if isinstance(reply, LeafRows) and msg.seqnos_of:
            assert msg.seqnos_keyspace == KS
            high = {p: (5, 1) for p in msg.seqnos_of}
            return LeafRows(rows=reply.rows, complete=reply.complete, high_seqnos=high)
        return reply


async def test_the_high_seqnos_ride_in_the_calls_and_the_round_asks_only_the_others() -> None:
    plan = _plan(ROWS)
    nodes = sorted(leaf.node for leaf in plan.leaves)
    owners = {nodes[0]: [0, 1], nodes[1]: [2, 3], nodes[2]: [4, 5], "n9": [6, 7]}
    view = _View(owners)
    pool = _SeqnoPool({n: _rows(n, 1) for n in nodes})
    calls = _calls(pool, view=view)
    ride = SeqnoRide(view, KS)  # type: ignore[arg-type]
    local = LocalRun(plan, ROWS, False, 1 << 20, True)
    rows = calls.rows(None, local, QueryId("m9", "q"), None, [], 5.0, _never, ride)
    waited = asyncio.ensure_future(ride.wait_for())
    assert len(await _collect(rows)) == 3
    # Each leaf node read its own partitions; the round asked the node without a leaf.
    assert {a: m.seqnos_of for a, m in pool.asked} == {n: owners[n] for n in nodes}
    assert view.skipped == nodes
    assert await waited == {**{p: (5, 1) for p in range(6)}, 6: (7, 1), 7: (7, 1)}


async def test_a_ride_whose_calls_fail_leaves_every_owner_to_the_round() -> None:
    plan = _plan(ROWS)
    nodes = sorted(leaf.node for leaf in plan.leaves)
    view = _View({n: [i] for i, n in enumerate(nodes)})
    replies: dict[str, LeafRows | ShardexError] = {n: _rows(n, 1) for n in nodes}
    replies[nodes[0]] = ShardexError("bad", code=ErrorCode.BAD_REQUEST)
    calls = _calls(_SeqnoPool(replies), view=view)
    ride = SeqnoRide(view, KS)  # type: ignore[arg-type]
    local = LocalRun(plan, ROWS, False, 1 << 20, True)
    waited = asyncio.ensure_future(ride.wait_for())
    with pytest.raises(ShardexError):
        await _collect(calls.rows(None, local, QueryId("m9", "q"), None, [], 5.0, _never, ride))
    assert await waited == {} and view.known == [{}]  # nothing known: every owner asked


class _LeafQuery(_Query):
    """The leaf node's ``QueryService`` as a call uses it: admission of the call."""

    @contextlib.contextmanager
    def leaf_call(self, q: QueryId) -> Iterator[None]:
        yield


class _ToLeafNode(_Pool):
    """The initiator's pool wired to a leaf node in-process: each request runs there in a
    task of its own (as the node's responder runs it: the caller giving up does not stop
    it), one-way messages go to its handler."""

    def __init__(self, leaf: LeafCalls, replies: dict[str, LeafRows | ShardexError]) -> None:
        super().__init__(replies)
        self.leaf = leaf
        self.leaf_tasks: list[asyncio.Task[Any]] = []

    async def request(self, address: str, msg: Any, timeout: float, *, expect: Any) -> Any:
        if address in self.replies:
            return await super().request(address, msg, timeout, expect=expect)
        task = asyncio.ensure_future(self.leaf.on_leaf_request(msg, None))  # type: ignore[arg-type]
        self.leaf_tasks.append(task)
        return await asyncio.shield(task)

    async def send(self, address: str, msg: Any) -> None:
        await super().send(address, msg)
        await self.leaf.on_leaf_cancel(msg, None)  # type: ignore[arg-type]


def _leaf_node() -> LeafCalls:
    scan = _Scan(_View())
    scan.local_index = _IndexScan()  # type: ignore[assignment]
    return LeafCalls(
        _LeafQuery("m2"),  # type: ignore[arg-type]
        _Pool({}),  # type: ignore[arg-type]
        scan,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        NodeMemory(),
    )


def _counting_leaf(monkeypatch: Any, blocks: int) -> tuple[list[int], list[bool]]:
    """The leaf's pipeline replaced by one that reads ``blocks`` small blocks, yielding to
    the loop between them; returns the blocks read and whether it was closed."""
    import shardex.sql.exec.leaf_calls as leaf_calls

    read: list[int] = []
    closed: list[bool] = []

    async def pipeline(*args: Any) -> AsyncIterator[list[bytes]]:
        try:
            for i in range(blocks):
                read.append(i)
                await asyncio.sleep(0)
                yield [b"x" * 10]
        finally:
            closed.append(True)

    monkeypatch.setattr(leaf_calls, "leaf_pipeline", pipeline)
    return read, closed


async def test_an_abandoned_call_stops_the_leaf_on_its_node(monkeypatch: Any) -> None:
    """Another leaf fails: the initiator gives up the calls still out and tells their nodes;
    the leaf there stops reading (counted blocks), instead of running to its end."""
    blocks = 5000
    read, closed = _counting_leaf(monkeypatch, blocks)
    plan = _plan(ROWS)
    slow, failing = plan.leaves[0].node, plan.leaves[1].node
    replies: dict[str, LeafRows | ShardexError] = {
        failing: ShardexError("bad leaf", code=ErrorCode.BAD_REQUEST),
        plan.leaves[2].node: _rows(plan.leaves[2].node, 1),
    }
    leaf = _leaf_node()
    pool = _ToLeafNode(leaf, replies)
    calls = _calls(pool)
    local = LocalRun(plan, ROWS, False, 1 << 20, True)
    q = QueryId("m9", "q")
    with pytest.raises(ShardexError) as info:
        await _collect(calls.rows(None, local, q, None, [], 5.0, _never))
    assert info.value.code is ErrorCode.BAD_REQUEST
    (task,) = pool.leaf_tasks
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and closed == [True]
    assert len(read) < blocks, "the leaf ran to its end"
    assert [(a, type(m).__name__, m.query_id) for a, m in pool.sent] == [(slow, "LeafCancel", q)]
    assert leaf.calls_cancelled == 1


async def test_a_cancel_that_overtakes_its_call_refuses_the_call(monkeypatch: Any) -> None:
    read, _ = _counting_leaf(monkeypatch, 10)
    leaf = _leaf_node()
    q = QueryId("m1", "q")
    await leaf.on_leaf_cancel(LeafCancel(query_id=q), None)  # type: ignore[arg-type]
    msg = LeafRequest(query_id=q, args={}, params=[], timeout=5, max_bytes=10**6)
    with pytest.raises(ShardexError) as info:
        await leaf.on_leaf_request(msg, None)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.QUERY_CANCELLED and read == []


def _wide_rows(node: str, n: int, size: int) -> LeafRows:
    rows = [encode_row({"id": f"{node}-{i}", "pad": "x" * size}) for i in range(n)]
    return LeafRows(rows=rows, complete=True)


async def test_the_replies_are_charged_to_the_statements_memory() -> None:
    """The rows the calls brought are held in the statement's account here until the root
    has read them; replies past its quota hand the statement to the stream."""
    plan = _plan(ROWS)
    replies = {leaf.node: _wide_rows(leaf.node, 20, 2000) for leaf in plan.leaves}
    held = sum(value_size(r.rows) for r in replies.values())
    memory = NodeMemory()
    calls = LeafCalls(
        _Query(),  # type: ignore[arg-type]
        _Pool(dict(replies)),  # type: ignore[arg-type]
        _Scan(_View()),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        memory,
    )
    local = LocalRun(plan, ROWS, False, 1 << 20, True)
    rows = calls.rows(None, local, QueryId("m9", "q1"), None, [], 5.0, _never)
    first = await anext(rows)
    assert first and memory.used >= held  # charged while the root reads them
    rest = [c async for c in rows]
    assert sum(map(len, [first, *rest])) == 60 and memory.used == 0 and memory.running() == 0

    streamed = [encode_row({"id": "streamed"})]

    async def stream() -> AsyncIterator[list[bytes]]:
        async def chunks() -> AsyncIterator[list[bytes]]:
            yield streamed

        return chunks()

    assert held > MIN_QUERY_MEMORY
    small = LocalRun(plan, ROWS, False, MIN_QUERY_MEMORY, True)
    got = await _collect(calls.rows(None, small, QueryId("m9", "q2"), None, [], 5.0, stream))
    assert got == [{"id": "streamed"}] and memory.used == 0
