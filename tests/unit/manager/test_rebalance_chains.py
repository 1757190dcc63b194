"""A rebalance restores replica chains: ``restore_chains`` against a fake coordinator
context (chains cut short by a failover, replicas on nodes down or failed over)."""

from __future__ import annotations

from itertools import count
from typing import Any

import msgspec

from shardex.core.topology import Topology
from shardex.manager.rebalance import restore_chains
from shardex.meta.state import KeyspaceMeta, StateContext
from tests.unit.manager import coordinator_fakes as fakes


def make_ctx(up: dict[str, bool], keyspaces: dict[str, tuple[int, Topology]]) -> Any:
    state = StateContext(
        keyspaces={
            k: KeyspaceMeta(name=k, num_partitions=4, uuid=f"u-{k}", created_cas=1, num_replicas=r)
            for k, (r, _) in keyspaces.items()
        },
        data_topologies={k: [t] for k, (_, t) in keyspaces.items()},
    )
    membership = fakes.FakeMembership(up, ("data", "manager"))
    return fakes.FakeCtx(state, membership, (f"id{i}" for i in count(1)), request_id=None)


def topo(assignment: dict[int, str], replicas: dict[int, list[str]]) -> Topology:
    return Topology(seq_num=1, assignment=assignment, replicas=replicas)


async def test_short_chains_are_filled_one_commit_per_keyspace() -> None:
    # after n3 failed over: its actives promoted, chains of one copy
    short = topo({0: "n1", 1: "n2", 2: "n1", 3: "n2"}, {0: ["n2"], 1: [], 2: [], 3: ["n1"]})
    full = topo({0: "n1", 1: "n2"}, {0: ["n2"], 1: ["n1"]})
    bare = topo({0: "n1", 1: "n2"}, {})  # num_replicas 0: nothing to do
    ctx = make_ctx({"n1": True, "n2": True}, {"a": (1, short), "b": (1, full), "c": (0, bare)})
    assert await restore_chains(ctx) == ["a"]
    assert len(ctx.commits) == 1
    history = ctx.state.data_topologies["a"]
    assert [t.seq_num for t in history] == [1, 2]  # appended to the history
    assert history[1].replicas == {0: ["n2"], 1: ["n1"], 2: ["n2"], 3: ["n1"]}
    assert ctx.state.data_topologies["b"] == [full] and ctx.state.data_topologies["c"] == [bare]
    assert await restore_chains(ctx) == [] and len(ctx.commits) == 1  # idempotent


async def test_replicas_on_failed_over_or_down_nodes_are_replaced() -> None:
    t = topo(
        {0: "n1", 1: "n2", 2: "n1", 3: "n2"},
        {0: ["n3"], 1: ["n4"], 2: ["n2"], 3: ["n1"]},
    )
    ctx = make_ctx({"n1": True, "n2": True, "n3": True, "n4": False}, {"a": (1, t)})
    ctx.state = msgspec.structs.replace(ctx.state, failed_over={"n3": 0})
    assert await restore_chains(ctx) == ["a"]
    latest = ctx.state.data_topologies["a"][-1]
    assert latest.assignment == t.assignment
    for p in range(4):
        chain = latest.chain(p)
        assert len(chain) == 2 and set(chain) <= {"n1", "n2"}


async def test_a_rebalance_with_no_active_to_move_restores_the_chains_at_once() -> None:
    from shardex.api.rebalance import StartRebalance
    from shardex.manager.rebalance import Rebalancer

    # n3 failed over and still running: the actives are balanced over n1, n2 already
    short = topo({0: "n1", 1: "n2", 2: "n1", 3: "n2"}, {0: [], 1: ["n3"], 2: ["n2"], 3: []})
    ctx = make_ctx({"n1": True, "n2": True, "n3": True}, {"a": (1, short)})
    ctx.state = msgspec.structs.replace(ctx.state, failed_over={"n3": 0})
    reply = await Rebalancer(object()).start(StartRebalance(), ctx)
    assert reply.record is not None and reply.record.moves == []
    latest = ctx.state.data_topologies["a"][-1]
    assert latest.seq_num == 2 and latest.assignment == short.assignment
    assert latest.replicas == {0: ["n2"], 1: ["n1"], 2: ["n2"], 3: ["n1"]}
    assert ctx.state.rebalance == reply.record  # the record (with the reply) committed last
