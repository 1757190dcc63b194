"""A rebalance after a node joins moves replicas as well as actives, against a fake
coordinator (the eject tests' fakes): the new node ends with its share of both, and no
committed topology ever leaves a chain shorter than configured: new replica copies join
their chains, are waited for until caught up, and only then do the old ones leave."""

from __future__ import annotations

import asyncio
from collections import Counter
from itertools import count

import pytest

from shardex.api.rebalance import StartRebalance
from shardex.core.topology import Topology
from shardex.manager import eject
from shardex.manager.rebalance import Rebalancer
from shardex.meta.rebalance_state import DONE
from shardex.meta.replica_placement import chain_assignment
from shardex.meta.state import KeyspaceMeta, StateContext
from tests.unit.manager import coordinator_fakes as fakes
from tests.unit.manager.test_eject import FakeCoordinator, Membership, fake_migrate

NP = 12


def make_ctx(nodes: list[str], joined: list[str]) -> fakes.FakeCtx:
    placed = chain_assignment(NP, nodes, 1, {})
    topology = Topology(seq_num=1, assignment=placed.assignment, replicas=placed.replicas)
    state = StateContext(
        keyspaces={
            "ks": KeyspaceMeta(
                name="ks", num_partitions=NP, uuid="u-ks", created_cas=1, num_replicas=1
            )
        },
        data_topologies={"ks": [topology]},
    )
    membership = Membership(dict.fromkeys([*nodes, *joined], True), ("data",))
    ctx = fakes.FakeCtx(state, membership, (f"id{i}" for i in count(1)), request_id=None)
    ctx.epoch = 1  # type: ignore[attr-defined]  # the master's term (the Rebalancer's tasks)
    return ctx


async def run_rebalance(ctx: fakes.FakeCtx, lag: int = 3) -> FakeCoordinator:
    c = FakeCoordinator(ctx)
    c.pool.lag = lag
    r = Rebalancer(c)
    r.driver.migrate = lambda m, e, rate: fake_migrate(c, m, e, rate)  # type: ignore[method-assign]
    reply = await r.start(StartRebalance(), ctx)
    assert reply.record is not None and reply.record.state == "running"
    await asyncio.gather(*c.tasks)
    return c


async def test_a_joined_node_gets_actives_and_replicas_and_no_chain_is_ever_short() -> None:
    ctx = make_ctx(["n1", "n2", "n3"], ["n4"])
    c = await run_rebalance(ctx)
    assert ctx.state.rebalance.state == DONE
    assert ctx.state.rebalance.message.startswith("3 replica cop(ies) built")
    history = ctx.state.data_topologies["ks"]
    latest = history[-1]
    actives = Counter(latest.assignment.values())
    replicas = Counter(n for r in latest.replicas.values() for n in r)
    nodes = ["n1", "n2", "n3", "n4"]
    assert max(actives[n] for n in nodes) - min(actives[n] for n in nodes) <= 1
    assert max(replicas[n] for n in nodes) - min(replicas[n] for n in nodes) <= 1
    assert actives["n4"] == 3 and replicas["n4"] == 3
    for p in range(NP):
        assert len(set(latest.chain(p))) == 2
    for t in history:  # every committed topology: two copies per chain at least
        for p in range(NP):
            assert len(t.chain(p)) >= 2, (t.seq_num, p, t.chain(p))
    # the replicas n4 got were polled until caught up before any old replica left
    new = {p for p in range(NP) if "n4" in latest.replicas.get(p, [])}
    for p in new:
        assert c.pool.polls[("n4", p)] > c.pool.lag, p
    # no move of an active onto a node holding a replica of its partition
    for m in ctx.state.rebalance.moves:
        base = history[0]
        assert m.target not in base.chain(m.partition)


async def test_replicas_that_do_not_catch_up_stop_the_rebalance_before_anything_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(eject, "CATCH_UP_TIMEOUT", 0.05)
    monkeypatch.setattr(eject, "CATCH_UP_POLL", 0.0)
    ctx = make_ctx(["n1", "n2", "n3"], ["n4"])
    before = ctx.state.data_topologies["ks"][0]
    await run_rebalance(ctx, lag=10**9)
    record = ctx.state.rebalance
    assert record.state == "failed" and "did not catch up" in record.message
    assert all(m.status == "cancelled" for m in record.moves)
    latest = ctx.state.data_topologies["ks"][-1]
    assert latest.assignment == before.assignment  # no active moved
    for p in range(NP):  # widened only: every old replica still there
        assert set(before.replicas[p]) <= set(latest.replicas[p])


async def test_a_balanced_cluster_changes_nothing() -> None:
    ctx = make_ctx(["n1", "n2", "n3"], [])
    c = FakeCoordinator(ctx)
    reply = await Rebalancer(c).start(StartRebalance(), ctx)
    assert reply.record is not None and reply.record.state == DONE and not c.tasks
    assert len(ctx.state.data_topologies["ks"]) == 1
