"""CREATE INDEX with ``num_replica``: validation, replica placement, allocation to every copy."""

from __future__ import annotations

from collections import Counter

import pytest

from shardex.api.index import AllocateSlices, DropSlices
from shardex.api.index_ddl import CreateIndex, DropIndex, DropIndexCopies
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.index_copies import drop_index_copies, without_copies
from shardex.manager.index_validate import place_replicas, slice_load, validate_create
from shardex.meta.index_definition import MAX_INDEX_REPLICAS, IndexKey, check_num_replica
from shardex.meta.slice_weight import UNIT
from tests.unit.manager import coordinator_fakes as fakes
from tests.unit.manager.test_index_ddl_ops import UP3, FakeCtx, ddl, run

K = [IndexKey(expr="age")]


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    import shardex.manager.index_ddl as mod

    fakes.no_backoff(monkeypatch, mod)


def create(**kw: object) -> CreateIndex:
    kw.setdefault("keyspace", "ks")
    kw.setdefault("name", "ix")
    kw.setdefault("keys", K)
    return CreateIndex(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1, MAX_INDEX_REPLICAS + 1, True, "1", 1.5, None])
def test_num_replica_out_of_range_is_refused(value: object) -> None:
    with pytest.raises(ShardexError) as err:
        validate_create(create(num_replica=value), FakeCtx().state, UP3, UP3)
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert "num_replica must be an integer in 0..3" in err.value.message
    assert err.value.details["num_replica"] == repr(value) and "hint" in err.value.details


def test_check_num_replica_accepts_integral_floats() -> None:
    assert check_num_replica(2.0) == 2 and check_num_replica(0) == 0


def test_more_copies_than_indexers_is_refused() -> None:
    with pytest.raises(ShardexError) as err:
        validate_create(create(num_replica=3), FakeCtx().state, UP3, UP3)
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert "needs 4 indexers" in err.value.message and "only 3 are up" in err.value.message
    # Pinned: the named nodes are the candidates.
    with pytest.raises(ShardexError) as err:
        validate_create(create(num_replica=1, nodes=["n2"]), FakeCtx().state, UP3, UP3)
    assert "only 1 are named in nodes" in err.value.message


def copies_per_partition(assignment: dict[int, str], replicas: dict[int, list[str]]) -> None:
    for p, node in assignment.items():
        chain = [node, *replicas[p]]
        assert len(set(chain)) == len(chain), (p, chain)


def test_replicas_on_distinct_nodes_and_balanced() -> None:
    plan = validate_create(
        create(partition_by=["META().id"], num_partition=8, num_replica=2),
        FakeCtx().state,
        UP3,
        UP3,
    )
    assert plan.num_replica == 2
    assert all(len(plan.replicas[p]) == 2 for p in range(8))
    copies_per_partition(plan.assignment, plan.replicas)
    load = Counter(plan.assignment.values())
    load.update(n for ns in plan.replicas.values() for n in ns)
    assert sorted(load.values()) == [8, 8, 8]  # every node holds a copy of every partition


def test_replica_placement_leans_on_lightly_loaded_nodes() -> None:
    # one partition on a; b already hosts many slices: the replica goes to c
    got = place_replicas({0: "a"}, 1, ["a", "b", "c"], Counter({"b": 5}), weight=1)
    assert got == {0: ["c"]}
    # 4 partitions over 4 nodes, one replica each: every node ends with 2 slices
    assignment = {0: "a", 1: "b", 2: "c", 3: "d"}
    got = place_replicas(assignment, 1, "abcd", Counter(), weight=1)
    copies_per_partition(assignment, got)
    load = Counter(assignment.values())
    load.update(n for ns in got.values() for n in ns)
    assert set(load.values()) == {2}
    assert place_replicas(assignment, 0, "abcd", Counter(), weight=1) == {}


def test_pinned_nodes_each_get_a_slice_with_replicas() -> None:
    # one partition, two named nodes: the primary on one, its replica on the other
    plan = validate_create(create(num_replica=1, nodes=["n1", "n3"]), FakeCtx().state, UP3, UP3)
    assert {plan.assignment[0], *plan.replicas[0]} == {"n1", "n3"}


def test_topology_copies() -> None:
    topo = Topology(seq_num=1, assignment={0: "n1", 1: "n2"}, replicas={0: ["n2"], 1: ["n3"]})
    assert topo.copies_of("n2") == [0, 1] and topo.copies_of("n3") == [1]
    assert topo.copy_nodes() == ["n1", "n2", "n3"] and topo.nodes() == ["n1", "n2"]


@pytest.mark.parametrize(
    ("n", "r", "nodes"), [(1, 1, 2), (3, 1, 3), (8, 2, 3), (5, 3, 4), (7, 1, 5)]
)
def test_copies_distinct_and_even_for_one_index(n: int, r: int, nodes: int) -> None:
    names = [f"n{i}" for i in range(nodes)]
    assignment = {p: names[p % nodes] for p in range(n)}
    got = place_replicas(assignment, r, names, Counter(), weight=1)
    copies_per_partition(assignment, got)
    assert all(len(got[p]) == r for p in range(n))
    load = Counter({x: 0 for x in names})
    load.update(assignment.values())
    load.update(x for ns in got.values() for x in ns)
    assert max(load.values()) - min(load.values()) <= 1, load


async def test_create_allocates_every_copy_and_drop_reaches_them() -> None:
    ctx = FakeCtx()
    d = ddl()
    msg = create(partition_by=["META().id"], num_partition=3, num_replica=1, request_id="c-r")
    reply = await run(d.create_index, msg, ctx)
    topo = reply.topology
    assert reply.index.num_replica == 1 and len(topo.replicas) == 3
    copies_per_partition(topo.assignment, topo.replicas)
    allocs = {n: m.partitions for n, m in ctx.pool.sent if isinstance(m, AllocateSlices)}
    assert allocs == {n: topo.copies_of(n) for n in UP3}
    assert sorted(p for ps in allocs.values() for p in ps) == [0, 0, 1, 1, 2, 2]
    # two copies per node, each a third of the index
    assert slice_load(ctx.state) == Counter({n: 2 * (UNIT // 3) for n in UP3})
    await run(d.drop_index, DropIndex(keyspace="ks", name="ix", request_id="d-r"), ctx)
    dropped = sorted(n for n, m in ctx.pool.sent if isinstance(m, DropSlices))
    assert dropped == UP3


def test_without_copies_drops_replicas_and_promotes_for_a_primary() -> None:
    topo = Topology(seq_num=4, assignment={0: "n1", 1: "n2"}, replicas={0: ["n2"], 1: ["n3"]})
    nxt, dropped = without_copies(topo, [(0, "n1"), (1, "n3"), (1, "n9"), (7, "n1")])
    assert dropped == [(0, "n1"), (1, "n3")]
    assert nxt == Topology(seq_num=5, assignment={0: "n2", 1: "n2"}, replicas={})
    same, none = without_copies(topo, [(0, "n3")])
    assert same is topo and none == []
    with pytest.raises(ShardexError) as err:
        without_copies(nxt, [(0, "n2")])
    assert err.value.code is ErrorCode.BAD_REQUEST and "last one" in err.value.message


async def test_drop_index_copies_commits_a_new_topology_once() -> None:
    ctx = FakeCtx()
    d = ddl()
    msg = create(partition_by=["META().id"], num_partition=3, num_replica=1, request_id="c-x")
    created = await run(d.create_index, msg, ctx)
    topo, index_id = created.topology, created.index.id
    victim = topo.replicas[0][0]
    lost = [(p, victim) for p in topo.copies_of(victim)]
    commits = len(ctx.commits)
    reply = await run(drop_index_copies, DropIndexCopies(index_id=index_id, copies=lost), ctx)
    assert sorted(reply.dropped) == sorted(lost) and len(ctx.commits) == commits + 1
    history = ctx.state.index_topologies[index_id]
    assert history[-1] == reply.topology and reply.topology.seq_num == topo.seq_num + 1
    assert victim not in reply.topology.copy_nodes()
    again = await run(drop_index_copies, DropIndexCopies(index_id=index_id, copies=lost), ctx)
    assert again.dropped == [] and len(ctx.commits) == commits + 1  # idempotent
    with pytest.raises(ShardexError) as err:
        await run(drop_index_copies, DropIndexCopies(index_id="nope", copies=lost), ctx)
    assert err.value.code is ErrorCode.INDEX_NOT_FOUND
