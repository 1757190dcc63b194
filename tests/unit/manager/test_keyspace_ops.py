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
