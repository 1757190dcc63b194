"""Failover planning (a pure function of the state and the replicas' answers) and the failover
and recovery ops against a fake coordinator context whose data nodes answer ``CopySeqnos``."""

from __future__ import annotations

from itertools import count
from typing import Any

import msgspec
import pytest

from shardex.api.failover import REASON_DATA_LOSS, REASON_REBALANCE, Failover, Recover
from shardex.api.replication import CopySeqno, CopySeqnos, CopySeqnosReply, PromoteReplica
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.failover import failover, plan_failover, recover
from shardex.meta.rebalance_state import (
    DONE,
    FAILED,
    RUNNING,
    UNRESOLVED,
    MoveRecord,
    RebalanceRecord,
)
from shardex.meta.state import KeyspaceMeta, StateContext, stored_reply
from shardex.net.messages import Message
from tests.unit.manager import coordinator_fakes as fakes

# Partitions 0-3 of "ks": active n1 for 0 and 1, n2 for 2, n3 for 3; two replicas each.
TOPO = Topology(
    seq_num=4,
    assignment={0: "n1", 1: "n1", 2: "n2", 3: "n3"},
    replicas={0: ["n2", "n3"], 1: ["n3", "n2"], 2: ["n1", "n3"], 3: ["n2"]},
)


def state_with(*topologies: tuple[str, Topology], **fields: Any) -> StateContext:
    return StateContext(
        cas=10,
        keyspaces={
            n: KeyspaceMeta(name=n, num_partitions=len(t.assignment), uuid=f"u-{n}", created_cas=1)
            for n, t in topologies
        },
        data_topologies={n: [t] for n, t in topologies},
        **fields,
    )


def copy(p: int, high: int, state: str = "replica") -> CopySeqno:
    return CopySeqno(partition=p, high_seqno=high, uuid=7, state=state)


# --- plan_failover -------------------------------------------------------------------------


def test_plan_promotes_the_highest_seqno_and_drops_the_node_from_every_chain() -> None:
    copies = {"ks": {"n2": [copy(0, 5), copy(1, 9)], "n3": [copy(0, 8), copy(1, 9)]}}
    topologies, promoted, lost = plan_failover(state_with(("ks", TOPO)), "n1", copies)
    assert promoted == {"ks": {0: "n3", 1: "n3"}}  # 0: 8 > 5; 1: tie -> chain order (n3 first)
    assert lost == {}
    new = topologies["ks"]
    assert new.seq_num == 5
    assert new.assignment == {0: "n3", 1: "n3", 2: "n2", 3: "n3"}
    # the promoted node leaves the replicas, the failed one leaves every chain
    assert new.replicas == {0: ["n2"], 1: ["n2"], 2: ["n3"], 3: ["n2"]}


def test_plan_tie_goes_to_chain_order() -> None:
    copies = {"ks": {"n2": [copy(0, 9), copy(1, 9)], "n3": [copy(0, 9), copy(1, 9)]}}
    _t, promoted, _l = plan_failover(state_with(("ks", TOPO)), "n1", copies)
    assert promoted == {"ks": {0: "n2", 1: "n3"}}


def test_plan_skips_copies_not_in_replica_state_and_unreached_nodes() -> None:
    # n3 did not answer; n2's copy of 1 is still being built
    copies = {"ks": {"n2": [copy(0, 3), copy(1, 100, state="pending")]}}
    topologies, promoted, lost = plan_failover(state_with(("ks", TOPO)), "n1", copies)
    assert promoted == {"ks": {0: "n2"}}
    assert lost == {"ks": [1]}
    new = topologies["ks"]
    assert new.assignment[1] == "n1"  # lost: stays on the failed node
    assert new.replicas[1] == ["n3", "n2"]  # its replicas are kept for a later failover


def test_plan_without_replicas_loses_every_active_partition() -> None:
    plain = Topology(seq_num=1, assignment={0: "n1", 1: "n2", 2: "n1"})
    topologies, promoted, lost = plan_failover(state_with(("a", plain)), "n1", {})
    assert promoted == {} and lost == {"a": [0, 2]}
    assert topologies["a"].assignment == plain.assignment and topologies["a"].seq_num == 2


def test_plan_leaves_keyspaces_without_the_node_alone() -> None:
    other = Topology(seq_num=3, assignment={0: "n2"}, replicas={0: ["n3"]})
    topologies, promoted, lost = plan_failover(state_with(("ks", other)), "n1", {})
    assert topologies == {} and promoted == {} and lost == {}


def test_plan_where_the_node_is_only_a_replica() -> None:
    topologies, promoted, _l = plan_failover(state_with(("ks", TOPO)), "n2", {})
    # n2 is active for 2: no copies reported -> lost; a replica of 0, 1, 3: removed
    assert promoted == {}
    new = topologies["ks"]
    assert new.replicas[0] == ["n3"] and new.replicas[1] == ["n3"] and 3 not in new.replicas


# --- the ops --------------------------------------------------------------------------------


class CopiesPool(fakes.FakePool):
    """Data nodes answer ``CopySeqnos`` from ``copies`` (node -> keyspace -> copies)."""

    def __init__(self, copies: dict[str, dict[str, list[CopySeqno]]], failing: set[str]) -> None:
        super().__init__(failing)
        self.copies = copies

    async def request(self, address: str, msg: Message, timeout: float) -> Any:
        await super().request(address, msg, timeout)
        node = address.split(":")[0]
        if isinstance(msg, CopySeqnos):
            held = self.copies.get(node, {}).get(msg.keyspace, [])
            wanted = set(msg.partitions or [c.partition for c in held])
            return CopySeqnosReply(node=node, copies=[c for c in held if c.partition in wanted])
        return None


def make_ctx(
    state: StateContext,
    up: dict[str, bool],
    copies: dict[str, dict[str, list[CopySeqno]]] | None = None,
    failing: frozenset[str] = frozenset(),
) -> Any:
    membership = fakes.FakeMembership(up, ("data", "manager"))
    ctx = fakes.FakeCtx(state, membership, (f"id{i}" for i in count(1)), failing)
    ctx.pool = CopiesPool(copies or {}, set(failing))
    ctx.epoch = 3
    return ctx


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    import shardex.manager.keyspaces as mod

    fakes.no_backoff(monkeypatch, mod)


UP3 = {"n1": False, "n2": True, "n3": True}


async def test_failover_commits_topologies_and_failed_over_then_promotes() -> None:
    copies = {"n2": {"ks": [copy(0, 5), copy(1, 2)]}, "n3": {"ks": [copy(0, 8), copy(1, 9)]}}
    ctx = make_ctx(state_with(("ks", TOPO)), UP3, copies)
    reply = await failover(Failover(node="n1"), ctx)
    assert reply.promoted == {"ks": {0: "n3", 1: "n3"}} and reply.lost == {}
    assert len(ctx.commits) == 1  # one commit: topologies and failed_over together
    state = ctx.state
    assert reply.cas == state.cas == 11 and state.failed_over == {"n1": 11}
    assert state.data_topologies["ks"][-1].assignment[0] == "n3"
    assert [t.seq_num for t in state.data_topologies["ks"]] == [4, 5]
    promotes = [(n, m) for n, m in ctx.pool.sent if isinstance(m, PromoteReplica)]
    assert sorted((n, m.partition, m.seq_num, m.epoch) for n, m in promotes) == [
        ("n3", 0, 5, 3),
        ("n3", 1, 5, 3),
    ]
    asked = {
        (n, m.keyspace, tuple(m.partitions or ()))
        for n, m in ctx.pool.sent
        if isinstance(m, CopySeqnos)
    }
    assert asked == {("n2", "ks", (0, 1)), ("n3", "ks", (0, 1))}
    assert stored_reply(state, "r1") == msgspec.structs.replace(reply, pending={})


async def test_failover_is_idempotent_for_a_failed_over_node() -> None:
    ctx = make_ctx(state_with(("ks", TOPO), failed_over={"n1": 7}), UP3)
    reply = await failover(Failover(node="n1"), ctx)
    assert reply.cas == 7 and ctx.commits == []


async def test_failover_refuses_to_lose_data_unless_allowed() -> None:
    copies = {"n3": {"ks": [copy(0, 8)]}}  # n2 down: partition 1's only candidate is n3: none
    up = {"n1": False, "n2": False, "n3": True}
    ctx = make_ctx(state_with(("ks", TOPO)), up, copies)
    with pytest.raises(ShardexError) as e:
        await failover(Failover(node="n1"), ctx)
    assert e.value.code is ErrorCode.BAD_REQUEST
    assert e.value.details["reason"] == REASON_DATA_LOSS
    assert e.value.details["lost"] == {"ks": [1]}
    assert "ks: [1]" in e.value.message
    assert ctx.commits == []
    reply = await failover(Failover(node="n1", allow_data_loss=True), ctx)
    assert reply.promoted == {"ks": {0: "n3"}} and reply.lost == {"ks": [1]}
    assert ctx.state.data_topologies["ks"][-1].assignment[1] == "n1"
    assert ctx.state.failed_over == {"n1": ctx.state.cas}


async def test_failover_reports_promoted_nodes_it_could_not_tell() -> None:
    copies = {"n2": {"ks": [copy(0, 5), copy(1, 2)]}, "n3": {"ks": [copy(0, 8), copy(1, 9)]}}
    ctx = make_ctx(state_with(("ks", TOPO)), UP3, copies)
    real = ctx.pool.request

    async def promote_fails(address: str, msg: Message, timeout: float) -> Any:
        if isinstance(msg, PromoteReplica):
            raise ShardexError("gone", code=ErrorCode.NODE_UNAVAILABLE)
        return await real(address, msg, timeout)

    ctx.pool.request = promote_fails
    reply = await failover(Failover(node="n1"), ctx)
    assert set(reply.pending) == {"n3"} and ctx.state.failed_over == {"n1": 11}


@pytest.mark.parametrize(
    ("node", "up", "code", "text"),
    [
        ("zz", UP3, ErrorCode.NOT_A_CLUSTER_MEMBER, "not a member"),
        ("n1", {"n1": True}, ErrorCode.BAD_REQUEST, "last data node"),
    ],
)
async def test_failover_validates(
    node: str, up: dict[str, bool], code: ErrorCode, text: str
) -> None:
    ctx = make_ctx(state_with(("ks", Topology(seq_num=1, assignment={0: "n1"}))), up)
    with pytest.raises(ShardexError) as e:
        await failover(Failover(node=node), ctx)
    assert e.value.code is code and text in e.value.message
    assert ctx.commits == []


async def test_failover_of_a_node_without_the_data_service_is_refused() -> None:
    membership = fakes.FakeMembership({"n2": True}, ("data",), others={"m1": ("manager",)})
    ctx: Any = fakes.FakeCtx(StateContext(), membership, iter(()))
    with pytest.raises(ShardexError, match="data service"):
        await failover(Failover(node="m1"), ctx)


def move(status: str, source: str, target: str, p: int = 0) -> MoveRecord:
    return MoveRecord(
        migration_id=f"m{p}",
        keyspace="ks",
        keyspace_uuid="u-ks",
        partition=p,
        source=source,
        target=target,
        base_seq=4,
        status=status,
    )


def rebalance(state: str, *moves: MoveRecord) -> RebalanceRecord:
    return RebalanceRecord(
        id="rb", kind="rebalance", started_at=0.0, state=state, moves=list(moves)
    )


async def test_failover_waits_for_a_running_rebalance() -> None:
    ctx = make_ctx(state_with(("ks", TOPO), rebalance=rebalance(RUNNING)), UP3)
    with pytest.raises(ShardexError) as e:
        await failover(Failover(node="n1"), ctx)
    assert e.value.details["reason"] == REASON_REBALANCE and ctx.commits == []


@pytest.mark.parametrize(
    "unsettled",
    [move(UNRESOLVED, "n2", "n1", 2), move(UNRESOLVED, "n1", "n2", 0)],
    ids=["node-is-target", "node-is-up-source"],
)
async def test_failover_waits_for_a_move_that_settles_by_itself(unsettled: MoveRecord) -> None:
    up = {"n1": True, "n2": True, "n3": True}
    ctx = make_ctx(state_with(("ks", TOPO), rebalance=rebalance(FAILED, unsettled)), up)
    with pytest.raises(ShardexError) as e:
        await failover(Failover(node="n1"), ctx)
    assert e.value.details["reason"] == REASON_REBALANCE and ctx.commits == []


async def test_failover_ends_a_move_whose_dead_source_it_fails_over() -> None:
    record = rebalance(FAILED, move(UNRESOLVED, "n1", "n2", 0), move(DONE, "n3", "n2", 3))
    copies = {"n2": {"ks": [copy(0, 5), copy(1, 2)]}, "n3": {"ks": [copy(0, 8), copy(1, 9)]}}
    ctx = make_ctx(state_with(("ks", TOPO), rebalance=record), UP3, copies)
    await failover(Failover(node="n1"), ctx)
    moves = {m.migration_id: m for m in ctx.state.rebalance.moves}
    assert moves["m0"].status == FAILED and "failed over" in moves["m0"].error
    assert moves["m3"].status == DONE


async def test_recover_removes_the_node_from_failed_over() -> None:
    ctx = make_ctx(
        state_with(("ks", TOPO), failed_over={"n1": 7, "n3": 9}),
        {"n1": True, "n2": True, "n3": False},
    )
    reply = await recover(Recover(node="n1", kind="full"), ctx)
    assert reply.kind == "full" and reply.cas == ctx.state.cas == 11
    assert ctx.state.failed_over == {"n3": 9}
    with pytest.raises(ShardexError, match="not failed over"):
        await recover(Recover(node="n1"), ctx)
    with pytest.raises(ShardexError) as e:
        await recover(Recover(node="n3"), ctx)  # down: must be started first
    assert e.value.code is ErrorCode.NODE_UNAVAILABLE
    with pytest.raises(ShardexError, match="unknown recovery kind"):
        await recover(Recover(node="n3", kind="partial"), ctx)
