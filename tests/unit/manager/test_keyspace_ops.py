"""Keyspace DDL ops against a fake coordinator context: validation, placement over the up data
nodes, the committed state, and what a failure to reach a data node leaves behind."""

from __future__ import annotations

from itertools import count
from typing import Any

import msgspec
import pytest

from shardex.api.data import DropKeyspaceData, OpenPartitions
from shardex.api.keyspaces import CreateKeyspace, DropKeyspace, ListKeyspaces
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.keyspaces import create_keyspace, drop_keyspace, list_keyspaces
from shardex.meta.state import StateContext, stored_reply
from tests.unit.manager import coordinator_fakes as fakes


def make_ctx(up: dict[str, bool], failing: frozenset[str] = frozenset()) -> fakes.FakeCtx:
    """A context over an empty state; every node a data node and a manager."""
    membership = fakes.FakeMembership(up, ("data", "manager"))
    return fakes.FakeCtx(StateContext(), membership, (f"id{i}" for i in count(1)), failing)


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    import shardex.manager.keyspaces as mod

    fakes.no_backoff(monkeypatch, mod)


async def test_create_places_over_up_data_nodes_and_opens_them() -> None:
    ctx: Any = make_ctx({"n1": True, "n2": True, "n3": False})
    reply = await create_keyspace(CreateKeyspace(name="users", num_partitions=6), ctx)
    assert reply.meta.name == "users" and reply.meta.created_cas == 1
    assert reply.meta.uuid == "id1"  # from ctx.new_id(): seeded under the simulator
    assert reply.topology.seq_num == 1
    assert reply.topology.partitions_of("n1") == [0, 2, 4]
    assert reply.topology.partitions_of("n2") == [1, 3, 5]
    assert ctx.state.cas == 1 and ctx.state.keyspaces["users"] == reply.meta
    assert ctx.state.data_topologies["users"] == [reply.topology]  # history starts at 1
    assert stored_reply(ctx.state, "r1") == reply  # a retried request id gets the same answer
    opened = {n: m for n, m in ctx.pool.sent if isinstance(m, OpenPartitions)}
    assert set(opened) == {"n1", "n2"}  # n3 is down: nothing placed there
    assert opened["n1"].partitions == [0, 2, 4] and opened["n1"].uuid == reply.meta.uuid


async def test_create_validates_before_committing() -> None:
    ctx: Any = make_ctx({"n1": True})
    for name, n in (("9lives", 4), ("has space", 4), ("x" * 101, 4), ("ok", 0), ("ok", 2000)):
        with pytest.raises(ShardexError) as info:
            await create_keyspace(CreateKeyspace(name=name, num_partitions=n), ctx)
        assert info.value.code == ErrorCode.BAD_REQUEST
    await create_keyspace(CreateKeyspace(name="Ok_name-2", num_partitions=1), ctx)
    with pytest.raises(ShardexError) as info:
        await create_keyspace(CreateKeyspace(name="Ok_name-2", num_partitions=1), ctx)
    assert info.value.code == ErrorCode.KEYSPACE_EXISTS
    assert ctx.state.cas == 1  # only the one good create committed
    down: Any = make_ctx({"n1": False})
    with pytest.raises(ShardexError) as info:
        await create_keyspace(CreateKeyspace(name="k"), down)
    assert info.value.code == ErrorCode.NODE_UNAVAILABLE and down.state.cas == 0


async def test_create_with_an_unreachable_owner_fails_and_says_the_keyspace_exists() -> None:
    ctx: Any = make_ctx({"n1": True, "n2": True}, failing=frozenset({"n2"}))
    with pytest.raises(ShardexError) as info:
        await create_keyspace(CreateKeyspace(name="users", num_partitions=4), ctx)
    err = info.value
    assert err.code == ErrorCode.NODE_UNAVAILABLE
    assert "was created" in err.message and "n2" in err.message
    assert err.details["state"] == "created" and err.details["partitions"] == [1, 3]
    assert "users" in ctx.state.keyspaces  # the state keeps it: n2 reconciles when back
    tries = [n for n, m in ctx.pool.sent if n == "n2"]
    assert len(tries) == 3  # retried before giving up


async def test_max_ttl_is_checked_committed_and_sent_to_the_owners() -> None:
    ctx: Any = make_ctx({"n1": True, "n2": True})
    for bad in (-1, 2**31, True):
        with pytest.raises(ShardexError) as info:
            await create_keyspace(CreateKeyspace(name="s", num_partitions=2, max_ttl=bad), ctx)
        assert info.value.code == ErrorCode.BAD_REQUEST and "max_ttl" in info.value.message
    assert ctx.state.cas == 0
    reply = await create_keyspace(CreateKeyspace(name="s", num_partitions=2, max_ttl=60), ctx)
    assert reply.meta.max_ttl == 60 and ctx.state.keyspaces["s"].max_ttl == 60
    opened = [m for _, m in ctx.pool.sent if isinstance(m, OpenPartitions)]
    assert opened and all(m.max_ttl == 60 for m in opened)


async def test_drop_and_list() -> None:
    ctx: Any = make_ctx({"n1": True, "n2": True}, failing=frozenset({"n2"}))
    ctx.pool.failing.clear()
    await create_keyspace(CreateKeyspace(name="a", num_partitions=2), ctx)
    await create_keyspace(CreateKeyspace(name="b", num_partitions=2), ctx)
    listed = await list_keyspaces(ListKeyspaces(), ctx)
    assert [k.name for k in listed.keyspaces] == ["a", "b"]
    assert listed.topologies["a"].seq_num == 1
    ctx.pool.failing.add("n2")
    dropped = await drop_keyspace(DropKeyspace(name="a"), ctx)
    assert dropped.pending_nodes == ["n2"]  # it drops its copy when it reconciles
    assert "a" not in ctx.state.keyspaces and "a" not in ctx.state.data_topologies
    assert any(isinstance(m, DropKeyspaceData) and n == "n1" for n, m in ctx.pool.sent)
    with pytest.raises(ShardexError) as info:
        await drop_keyspace(DropKeyspace(name="a"), ctx)
    assert info.value.code == ErrorCode.KEYSPACE_NOT_FOUND


async def test_drop_keyspace_removes_its_indexes() -> None:
    """A keyspace re-created under the same name must not inherit the old index records."""
    from shardex.core.topology import Topology
    from shardex.meta.index_definition import IndexDefinition, IndexKey
    from shardex.meta.index_state import IndexRecord

    ctx: Any = make_ctx({"n1": True})
    await create_keyspace(CreateKeyspace(name="a", num_partitions=2), ctx)
    await create_keyspace(CreateKeyspace(name="b", num_partitions=2), ctx)

    def record(index_id: str, keyspace: str) -> IndexRecord:
        defn = IndexDefinition(
            id=index_id, name=index_id, keyspace=keyspace, keys=[IndexKey(expr="x")],
            where=None, partition_by=None, num_partition=1, is_primary=False,
        )  # fmt: skip
        return IndexRecord(definition=defn, state="ACTIVE")

    ctx.state = msgspec.structs.replace(
        ctx.state,
        indexes={"ia": record("ia", "a"), "ib": record("ib", "b")},
        index_topologies={
            "ia": [Topology(seq_num=1, assignment={0: "n1"})],
            "ib": [Topology(seq_num=1, assignment={0: "n1"})],
        },
    )
    await drop_keyspace(DropKeyspace(name="a"), ctx)
    assert list(ctx.state.indexes) == ["ib"] and list(ctx.state.index_topologies) == ["ib"]


def with_groups(ctx: Any, groups: dict[str, str]) -> None:
    members = ctx.membership.members
    ctx.membership.members = [
        msgspec.structs.replace(m, group=groups.get(m.name, "")) for m in members
    ]


async def test_create_with_one_replica_places_chains_of_two_on_distinct_nodes() -> None:
    ctx: Any = make_ctx({"n1": True, "n2": True, "n3": True})
    reply = await create_keyspace(
        CreateKeyspace(name="users", num_partitions=6, num_replicas=1), ctx
    )
    topo = reply.topology
    assert reply.meta.num_replicas == 1 and reply.warnings == []
    assert ctx.state.data_topologies["users"] == [topo]
    for p in range(6):
        chain = topo.chain(p)
        assert len(chain) == 2 and len(set(chain)) == 2
    opened = {n: m for n, m in ctx.pool.sent if isinstance(m, OpenPartitions)}
    for node in ("n1", "n2", "n3"):
        assert opened[node].partitions == topo.partitions_of(node)
        assert opened[node].replicas == topo.replicas_of(node) != []


async def test_default_replicas_follow_the_number_of_data_nodes_up() -> None:
    three: Any = make_ctx({"n1": True, "n2": True, "n3": True})
    reply = await create_keyspace(CreateKeyspace(name="k", num_partitions=4), three)
    assert reply.meta.num_replicas == 1 and all(len(reply.topology.chain(p)) == 2 for p in range(4))
    one: Any = make_ctx({"n1": True, "n2": False})
    reply = await create_keyspace(CreateKeyspace(name="k", num_partitions=4), one)
    assert reply.meta.num_replicas == 0 and reply.topology.replicas == {}
    assert reply.warnings == []
    opened = [m for _, m in one.pool.sent if isinstance(m, OpenPartitions)]
    assert [m.replicas for m in opened] == [[]]


async def test_num_replicas_is_validated_before_anything_is_committed() -> None:
    ctx: Any = make_ctx({"n1": True, "n2": True})
    for bad in (-1, 4, 10):
        with pytest.raises(ShardexError) as info:
            await create_keyspace(CreateKeyspace(name="k", num_replicas=bad), ctx)
        assert info.value.code == ErrorCode.BAD_REQUEST
        assert str(bad) in info.value.message and "0 to 3" in info.value.message
    assert ctx.state.cas == 0 and ctx.pool.sent == []


async def test_too_few_nodes_for_the_replicas_is_a_warning_in_the_reply() -> None:
    ctx: Any = make_ctx({"n1": True, "n2": True})
    reply = await create_keyspace(CreateKeyspace(name="k", num_partitions=4, num_replicas=3), ctx)
    assert reply.meta.num_replicas == 3  # configured; a rebalance restores it with more nodes
    assert all(len(reply.topology.chain(p)) == 2 for p in range(4))
    assert len(reply.warnings) == 1 and "not enough data nodes" in reply.warnings[0]


async def test_chains_spread_over_the_members_server_groups() -> None:
    ctx: Any = make_ctx({"n1": True, "n2": True, "n3": True, "n4": True})
    groups = {"n1": "a", "n2": "a", "n3": "b", "n4": "b"}
    with_groups(ctx, groups)
    reply = await create_keyspace(CreateKeyspace(name="k", num_partitions=8, num_replicas=1), ctx)
    for p in range(8):
        assert {groups[n] for n in reply.topology.chain(p)} == {"a", "b"}


async def test_failed_over_nodes_get_no_copies() -> None:
    ctx: Any = make_ctx({"n1": True, "n2": True, "n3": True})
    ctx.state = msgspec.structs.replace(ctx.state, failed_over={"n3": 0})
    reply = await create_keyspace(CreateKeyspace(name="k", num_partitions=4, num_replicas=1), ctx)
    assert {n for p in range(4) for n in reply.topology.chain(p)} == {"n1", "n2"}
    assert {n for n, m in ctx.pool.sent if isinstance(m, OpenPartitions)} == {"n1", "n2"}


async def test_an_unreachable_replica_node_fails_the_create_and_names_its_copies() -> None:
    ctx: Any = make_ctx({"n1": True, "n2": True, "n3": True}, failing=frozenset({"n3"}))
    with pytest.raises(ShardexError) as info:
        await create_keyspace(CreateKeyspace(name="k", num_partitions=6, num_replicas=1), ctx)
    topo = ctx.state.data_topologies["k"][-1]
    assert info.value.details["partitions"] == topo.partitions_of("n3")
    assert info.value.details["replicas"] == topo.replicas_of("n3")
