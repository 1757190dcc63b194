"""Ejecting nodes, master side, against a fake coordinator: the refusals, and a whole eject
run (widen, wait for the new replicas, narrow, moves, restore, removal) checking that no
committed topology ever leaves a chain shorter than it was while a replacement is built."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from itertools import count
from typing import Any

import msgspec
import pytest

from shardex.api.rebalance import StartRebalance
from shardex.api.replication import CopySeqno, CopySeqnos, CopySeqnosReply
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.manager import eject
from shardex.manager.rebalance import Rebalancer
from shardex.meta.index_definition import IndexDefinition, IndexKey
from shardex.meta.index_rebalance_state import publish_index_move, replace_index_move
from shardex.meta.index_state import ACTIVE, IndexRecord
from shardex.meta.member_list import MemberInfo
from shardex.meta.rebalance_state import DONE, MoveRecord, publish, with_move
from shardex.meta.state import KeyspaceMeta, StateContext
from tests.unit.manager import coordinator_fakes as fakes

THREE = Topology(
    seq_num=1,
    assignment={0: "n1", 1: "n2", 2: "n3", 3: "n1", 4: "n2", 5: "n3"},
    replicas={0: ["n2"], 1: ["n3"], 2: ["n1"], 3: ["n3"], 4: ["n1"], 5: ["n2"]},
)


class Membership(fakes.FakeMembership):
    """The fake member list, with removal."""

    def remove(self, name: str) -> MemberInfo:
        entry = next(m for m in self.members if m.name == name)
        self.members = [m for m in self.members if m.name != name]
        return msgspec.structs.replace(entry, removed=True)


def make_ctx(
    topology: Topology = THREE,
    up: dict[str, bool] | None = None,
    services: tuple[str, ...] = ("data",),
) -> fakes.FakeCtx:
    state = StateContext(
        keyspaces={
            "ks": KeyspaceMeta(
                name="ks", num_partitions=6, uuid="u-ks", created_cas=1, num_replicas=1
            )
        },
        data_topologies={"ks": [topology]},
    )
    membership = Membership(up or {"n1": True, "n2": True, "n3": True}, services)
    ctx = fakes.FakeCtx(state, membership, (f"id{i}" for i in count(1)), request_id=None)
    ctx.epoch = 1  # type: ignore[attr-defined]  # the master's term (the Rebalancer's tasks)
    return ctx


def refused(ctx: Any, names: list[str]) -> ShardexError:
    with pytest.raises(ShardexError) as e:
        eject.check_eject(ctx, names)
    return e.value


async def test_unknown_manager_and_last_node_are_refused() -> None:
    e = refused(make_ctx(), ["n9"])
    assert e.code is ErrorCode.BAD_REQUEST and e.details["node"] == "n9"
    assert e.details["members"] == ["n1", "n2", "n3"]
    e = refused(make_ctx(services=("data", "manager")), ["n2", "n3"])
    assert "one manager at a time" in str(e) and e.details["managers"] == ["n2", "n3"]
    ctx = make_ctx(services=("data", "manager"))
    ctx.state = msgspec.structs.replace(ctx.state, voters={"n3": "n3-id"})
    ctx.node_name = "n1"
    e = refused(ctx, ["n3"])
    assert "only coordinator voter" in str(e) and e.details["node"] == "n3"
    e = refused(make_ctx(), ["n1", "n2", "n3"])
    assert "no serving data node would remain" in str(e)
    assert eject.check_eject(make_ctx(), ["n3", " n3"]) == ["n3"]


async def test_a_down_node_with_actives_is_refused_one_with_none_is_not() -> None:
    e = refused(make_ctx(up={"n1": True, "n2": True, "n3": False}), ["n3"])
    assert e.code is ErrorCode.NODE_UNAVAILABLE and e.details["partitions"] == ["ks/2", "ks/5"]
    only_replicas = msgspec.structs.replace(
        THREE, assignment={p: "n1" if p % 2 else "n2" for p in range(6)}
    )
    ctx = make_ctx(only_replicas, up={"n1": True, "n2": True, "n3": False})
    assert eject.check_eject(ctx, ["n3"]) == ["n3"]


def with_index(ctx: fakes.FakeCtx, topology: Topology, num_replica: int = 0) -> None:
    """``ctx``'s state with index ``ks.by_age`` (ACTIVE) placed by ``topology``."""
    defn = IndexDefinition(
        id="i1", name="by_age", keyspace="ks", keys=[IndexKey(expr="age")],
        where=None, partition_by=None, num_partition=2, is_primary=False,
    )  # fmt: skip
    rec = IndexRecord(definition=defn, state=ACTIVE, num_replica=num_replica)
    ctx.state = msgspec.structs.replace(
        ctx.state, indexes={"i1": rec}, index_topologies={"i1": [topology]}
    )


async def test_an_index_holder_is_refused_only_when_its_slices_have_nowhere_to_go() -> None:
    # n3 holds a replica copy of partition 1: it could go to n2, but n2 is down, and n1
    # holds the other copy: refused, naming the node and the slice.
    ctx = make_ctx(up={"n1": True, "n2": False, "n3": True}, services=("data", "index"))
    ctx.state = msgspec.structs.replace(ctx.state, keyspaces={}, data_topologies={})
    with_index(ctx, Topology(seq_num=1, assignment={0: "n2", 1: "n1"}, replicas={1: ["n3"]}), 1)
    assert eject.holdings(ctx.state, "n3")[-1] == "ks.by_age/1 (index slice)"
    c = FakeCoordinator(ctx)
    with pytest.raises(ShardexError) as e:
        await Rebalancer(c).start(StartRebalance(eject=["n3"]), ctx)
    err = e.value
    assert err.code is ErrorCode.BAD_REQUEST and err.details["nodes"] == ["n3"]
    assert err.details["slices"] == ["ks.by_age/1"] and "cannot move off" in err.message
    assert "every other up indexer holds a copy" in err.message and err.details["hint"]
    assert ctx.state.rebalance is None  # nothing started


async def fake_index_migrate(c: FakeCoordinator, move: Any, epoch: int, seen: list[int]) -> None:
    """An index move that succeeds; ``seen`` gets how many data topologies existed then."""
    seen.append(len(c.state.data_topologies["ks"]))
    state = c.state
    history, _topo = publish_index_move(state.index_topologies[move.index_id], move)
    moves = replace_index_move(state.rebalance.index_moves, move.migration_id, status=DONE)
    await c.ctx.commit(
        msgspec.structs.replace(
            state,
            index_topologies={**state.index_topologies, move.index_id: history},
            rebalance=msgspec.structs.replace(state.rebalance, index_moves=moves),
        )
    )


async def test_an_eject_moves_index_slices_off_first_then_the_data_then_removes() -> None:
    ctx = make_ctx(services=("data", "index"))
    with_index(ctx, Topology(seq_num=1, assignment={0: "n3", 1: "n1"}, replicas={1: ["n3"]}), 1)
    c = FakeCoordinator(ctx)
    r = Rebalancer(c)
    r.driver.migrate = lambda m, e, rate: fake_migrate(c, m, e, rate)  # type: ignore[method-assign]
    seen: list[int] = []
    r.index_driver.migrate = lambda m, e: fake_index_migrate(c, m, e, seen)  # type: ignore[method-assign]
    await r.start(StartRebalance(eject=["n3"]), ctx)
    await asyncio.gather(*c.tasks)
    record = ctx.state.rebalance
    assert record.state == DONE and record.message == "removed n3 from the cluster"
    assert {(m.partition, m.source, m.kind) for m in record.index_moves} == {
        (0, "n3", "move"),
        (1, "n3", "move"),
    }
    assert seen == [1, 1]  # both before the data side widened any chain
    latest = ctx.state.index_topologies["i1"][-1]
    assert "n3" not in latest.copy_nodes() and latest.chain(1) == ["n1", "n2"]
    assert eject.holdings(ctx.state, "n3") == []


async def test_an_eject_whose_index_move_fails_moves_no_data_and_removes_nothing() -> None:
    ctx = make_ctx(services=("data", "index"))
    with_index(ctx, Topology(seq_num=1, assignment={0: "n3", 1: "n1"}))
    c = FakeCoordinator(ctx)
    r = Rebalancer(c)

    async def failing(move: Any, epoch: int) -> None:
        moves = replace_index_move(
            c.state.rebalance.index_moves, move.migration_id, status="failed", error="boom"
        )
        rec = msgspec.structs.replace(c.state.rebalance, index_moves=moves)
        await ctx.commit(msgspec.structs.replace(c.state, rebalance=rec))

    r.index_driver.migrate = failing  # type: ignore[method-assign]
    await r.start(StartRebalance(eject=["n3"]), ctx)
    await asyncio.gather(*c.tasks)
    record = ctx.state.rebalance
    assert record.state == "failed" and "index slices not moved off: ks.by_age/0 on n3" in (
        record.message
    )
    assert record.moves and all(m.status == "cancelled" for m in record.moves)
    assert len(ctx.state.data_topologies["ks"]) == 1  # no chain widened, nothing moved
    assert "n3" in [m.name for m in ctx.membership.members]


def test_caught_up_needs_the_replica_state_branch_and_seqno() -> None:
    want = {0: (10, 7), 1: (10, 7), 2: (10, 7), 3: (0, 7)}
    copies = [
        CopySeqno(0, 10, 7, "replica"),
        CopySeqno(1, 12, 8, "replica"),  # another branch
        CopySeqno(2, 9, 7, "replica"),  # behind
        CopySeqno(3, 0, 7, "building"),  # not a replica copy yet
    ]
    assert eject.caught_up(want, copies) == {1: (10, 7), 2: (10, 7), 3: (0, 7)}


class FakePool:
    """Data nodes answering ``CopySeqnos``: actives at seqno 10; a replica copy appears, and
    then catches up, a few polls after the topology names it (``lag``)."""

    def __init__(self, coordinator: FakeCoordinator, lag: int = 3) -> None:
        self.c = coordinator
        self.lag = lag
        self.polls: dict[tuple[str, int], int] = {}

    async def request(
        self, address: str, msg: CopySeqnos, timeout: float, expect: type
    ) -> CopySeqnosReply:
        node = address.split(":")[0]
        topo = self.c.state.data_topologies[msg.keyspace][-1]
        copies = []
        for p in msg.partitions or []:
            if topo.assignment[p] == node:
                copies.append(CopySeqno(p, 10, 7, "active"))
            elif node in topo.replicas.get(p, ()):
                n = self.polls[(node, p)] = self.polls.get((node, p), 0) + 1
                if n >= self.lag:
                    copies.append(CopySeqno(p, 10 if n > self.lag else 4, 7, "replica"))
        return CopySeqnosReply(node=node, copies=copies)


class FakeCoordinator:
    """What the Rebalancer uses of the coordinator: the state, ``exclusive`` over a
    ``FakeCtx``, ``spawn``, the pool and the member list."""

    def __init__(self, ctx: fakes.FakeCtx) -> None:
        self.ctx = ctx
        self.membership = ctx.membership
        self.pool = FakePool(self)
        self.tasks: list[asyncio.Task[Any]] = []

    @property
    def state(self) -> StateContext:
        return self.ctx.state

    async def exclusive(self, epoch: int, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        return await fn(self.ctx)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    def register_op(self, *args: Any) -> None: ...

    def register_recovery(self, *args: Any) -> None: ...


async def fake_migrate(c: FakeCoordinator, move: MoveRecord, epoch: int, rate: int) -> None:
    """A migration that succeeds: the move published with its new topology."""
    state = c.state
    history, _topo = publish(state.data_topologies[move.keyspace], move)
    rec = with_move(state.rebalance, move.migration_id, status=DONE)
    await c.ctx.commit(
        msgspec.structs.replace(
            state, data_topologies={**state.data_topologies, move.keyspace: history}, rebalance=rec
        )
    )


async def run_eject(ctx: fakes.FakeCtx, names: list[str]) -> tuple[FakeCoordinator, Any]:
    c = FakeCoordinator(ctx)
    r = Rebalancer(c)
    r.driver.migrate = lambda m, e, rate: fake_migrate(c, m, e, rate)  # type: ignore[method-assign]
    reply = await r.start(StartRebalance(eject=names), ctx)
    await asyncio.gather(*c.tasks)
    return c, reply


async def test_an_eject_replaces_replicas_first_then_moves_actives_then_removes() -> None:
    ctx = make_ctx()
    c, reply = await run_eject(ctx, ["n3"])
    assert reply.record.kind == "eject" and reply.record.eject == ["n3"]
    record = ctx.state.rebalance
    assert record.state == DONE and record.message == "removed n3 from the cluster"
    assert [m.name for m in ctx.membership.members] == ["n1", "n2"]
    history = ctx.state.data_topologies["ks"]
    latest = history[-1]
    assert eject.holdings(ctx.state, "n3") == []
    for p in range(6):
        assert len(latest.chain(p)) == 2 and set(latest.chain(p)) == {"n1", "n2"}
    # Every topology committed: a chain never shorter than before the eject (two copies)
    # while copies are being built, and n3's replicas left only after the new ones caught up.
    for t in history:
        for p in range(6):
            assert len(t.chain(p)) >= 2, (t.seq_num, p, t.chain(p))
    widened = history[1]
    assert widened.replicas[1] == ["n3", "n1"] and widened.replicas[3] == ["n3", "n2"]
    narrowed = history[2]
    assert "n3" not in {n for r in narrowed.replicas.values() for n in r}
    for key, polls in c.pool.polls.items():
        assert polls > c.pool.lag, key  # polled until it reported seqno 10
    assert {(m.partition, m.target) for m in record.moves} == {(2, "n2"), (5, "n1")}


async def test_an_eject_whose_replicas_do_not_catch_up_removes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(eject, "CATCH_UP_POLL", 0.0)
    ctx = make_ctx()
    c = FakeCoordinator(ctx)
    c.pool.lag = 10**9  # the new copies never appear
    waits = {"ks": {1: ["n1"]}}
    with pytest.raises(ShardexError) as e:
        await eject.await_replicas(c, waits, timeout=0.05)
    assert e.value.code is ErrorCode.TIMEOUT and e.value.details["behind"] == ["ks/1 on n1"]

    monkeypatch.setattr(eject, "CATCH_UP_TIMEOUT", 0.05)
    _c, _reply = await run_eject_with_pool_lag(ctx, 10**9)
    record = ctx.state.rebalance
    assert record.state == "failed" and "did not catch up" in record.message
    assert all(m.status == "cancelled" for m in record.moves)
    assert [m.name for m in ctx.membership.members] == ["n1", "n2", "n3"]
    latest = ctx.state.data_topologies["ks"][-1]
    assert latest.replicas[1] == ["n3", "n1"]  # widened, never narrowed: nothing lost


async def run_eject_with_pool_lag(ctx: fakes.FakeCtx, lag: int) -> tuple[FakeCoordinator, Any]:
    c = FakeCoordinator(ctx)
    c.pool.lag = lag
    r = Rebalancer(c)
    reply = await r.start(StartRebalance(eject=["n3"]), ctx)
    await asyncio.gather(*c.tasks)
    return c, reply


async def test_an_eject_with_a_failed_move_keeps_the_member() -> None:
    ctx = make_ctx()
    c = FakeCoordinator(ctx)
    r = Rebalancer(c)

    async def failing(move: MoveRecord, epoch: int, rate: int) -> None:
        rec = with_move(c.state.rebalance, move.migration_id, status="failed", error="boom")
        await ctx.commit(msgspec.structs.replace(c.state, rebalance=rec))

    r.driver.migrate = failing  # type: ignore[method-assign]
    await r.start(StartRebalance(eject=["n3"]), ctx)
    await asyncio.gather(*c.tasks)
    record = ctx.state.rebalance
    assert record.state == "failed" and "n3 not removed" in record.message
    assert "n3" in [m.name for m in ctx.membership.members]


async def test_an_eject_balances_and_waits_for_the_replica_a_move_will_drop() -> None:
    t = msgspec.structs.replace(THREE, replicas={**THREE.replicas, 5: ["n1"], 3: ["n2"]})
    ctx = make_ctx(t)
    c, _reply = await run_eject(ctx, ["n3"])
    record = ctx.state.rebalance
    assert record.state == DONE
    assert {(m.partition, m.target) for m in record.moves} == {(2, "n2"), (5, "n1")}
    history = ctx.state.data_topologies["ks"]
    assert history[1].replicas[5] == ["n1", "n2"]  # n2 built before n1 turns active
    assert ("n2", 5) in c.pool.polls and c.pool.polls[("n2", 5)] > c.pool.lag
    latest = history[-1]
    assert sorted(len(latest.partitions_of(n)) for n in ("n1", "n2")) == [3, 3]
    for p in range(6):
        assert sorted(latest.chain(p)) == ["n1", "n2"]
