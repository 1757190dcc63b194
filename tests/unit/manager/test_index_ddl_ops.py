"""Index DDL ops against a fake coordinator context: every refusal of a bad CREATE with its
error code and message, placement, the create / build / drop / pipeline-hook flows, what a
failing indexer leaves behind, recovery of each in-flight state, and dedup."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import pytest

from shardex.api.index import AllocateSlices, DropSlices
from shardex.api.index_ddl import (
    BuildIndex,
    CreateIndex,
    DropIndex,
    IndexBuildProgress,
    IndexCreated,
    IndexDropped,
    MarkIndexActive,
    MarkIndexError,
)
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.index_ddl import IndexDDL
from shardex.manager.index_validate import place_partitions, slice_load, validate_create
from shardex.meta.index_definition import MAX_INDEX_PARTITIONS, IndexKey
from shardex.meta.index_state import (
    ACTIVE,
    BUILDING,
    DELETED,
    ERROR,
    INIT,
    READY,
    IndexRecord,
    creation_base,
)
from shardex.meta.slice_weight import UNIT
from shardex.meta.state import KeyspaceMeta, StateContext, stored_reply
from tests.unit.manager import coordinator_fakes as fakes

K = [IndexKey(expr="age")]


def indexers(up: dict[str, bool]) -> fakes.FakeMembership:
    """Indexers (also managers) ``up`` plus one data node, d1."""
    return fakes.FakeMembership(up, ("index", "manager"), others={"d1": ("data",)})


class FakeCtx(fakes.FakeCtx):
    """The master's context over a state holding keyspace ``ks``."""

    def __init__(
        self,
        up: dict[str, bool] | None = None,
        failing: frozenset[str] = frozenset(),
        request_id: str | None = "r1",
    ) -> None:
        meta = KeyspaceMeta(name="ks", num_partitions=8, uuid="u", created_cas=1)
        super().__init__(
            StateContext(cas=1, epoch=1, keyspaces={"ks": meta}),
            indexers(up or {"n1": True, "n2": True, "n3": True}),
            iter(f"{i:012x}" for i in range(1000)),
            failing,
            request_id,
        )


class FakeCoordinator:
    is_master = True


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    import shardex.manager.index_ddl as mod

    fakes.no_backoff(monkeypatch, mod)


async def run(op: Any, msg: Any, ctx: FakeCtx) -> Any:
    """As the coordinator does: the op's context carries the message's request id."""
    ctx.request_id = getattr(msg, "request_id", None)
    return await op(msg, ctx)


def ddl() -> IndexDDL:
    return IndexDDL(FakeCoordinator())


_rids = iter(range(10**6))


def create(**kw: Any) -> CreateIndex:
    kw.setdefault("request_id", f"c{next(_rids)}")
    kw.setdefault("keyspace", "ks")
    kw.setdefault("name", "ix")
    if not kw.get("is_primary"):
        kw.setdefault("keys", K)
    return CreateIndex(**kw)


# --- validation: every bad input, its code and message ------------------------------------

UP3 = ["n1", "n2", "n3"]

BAD = [
    # (request, code, words in the message, a details key)
    (create(keyspace="nope"), ErrorCode.KEYSPACE_NOT_FOUND, "keyspace 'nope' not found", "hint"),
    (create(name=""), ErrorCode.BAD_REQUEST, "non-empty string", "hint"),
    (create(name="9lives"), ErrorCode.BAD_REQUEST, "invalid index name", "hint"),
    (create(name="a" * 101), ErrorCode.BAD_REQUEST, "invalid index name", "hint"),
    (create(name="#primary"), ErrorCode.BAD_REQUEST, "invalid index name", "hint"),
    (create(keys=[]), ErrorCode.BAD_REQUEST, "at least one key", "index"),
    (create(keys=[IndexKey(expr="age +")]), ErrorCode.EXPRESSION_SYNTAX, "line 1", "column"),
    (create(keys=[IndexKey(expr="")]), ErrorCode.BAD_REQUEST, "non-empty expression", "index"),
    (
        create(keys=[IndexKey(expr="NOPE(a)")]),
        ErrorCode.EXPRESSION_SYNTAX,
        "unknown function",
        "hint",
    ),
    (create(keys=[IndexKey(expr="$p")]), ErrorCode.BAD_REQUEST, "parameter $p", "hint"),
    (create(where="age >"), ErrorCode.EXPRESSION_SYNTAX, "line 1", "token"),
    (create(partition_by=["a +"]), ErrorCode.EXPRESSION_SYNTAX, "line 1", "column"),
    (create(partition_by=[]), ErrorCode.BAD_REQUEST, "at least one expression", "index"),
    (create(num_partition=0), ErrorCode.BAD_REQUEST, "num_partition must be", "hint"),
    (
        create(num_partition=MAX_INDEX_PARTITIONS + 1, partition_by=["a"]),
        ErrorCode.BAD_REQUEST,
        f"1..{MAX_INDEX_PARTITIONS}",
        "max",
    ),
    (create(num_partition=True), ErrorCode.BAD_REQUEST, "num_partition must be", "hint"),
    (create(num_partition=4), ErrorCode.BAD_REQUEST, "has no PARTITION BY", "hint"),
    (create(nodes=["n9"]), ErrorCode.BAD_REQUEST, "node 'n9' is not an indexer", "indexers"),
    (create(nodes=["d1"]), ErrorCode.BAD_REQUEST, "node 'd1' is not an indexer", "hint"),
    (create(nodes=["n4"]), ErrorCode.BAD_REQUEST, "indexer 'n4' is down", "up_indexers"),
    (create(nodes=[]), ErrorCode.BAD_REQUEST, "non-empty list", "hint"),
    (create(nodes=["n1", "n1"]), ErrorCode.BAD_REQUEST, "a node twice", "nodes"),
    (create(nodes=["n1", "n2"]), ErrorCode.BAD_REQUEST, "every named node", "hint"),
    (create(defer_build=1), ErrorCode.BAD_REQUEST, "defer_build must be", "defer_build"),
    (create(name="old"), ErrorCode.INDEX_EXISTS, "index 'old' already exists", "state"),
    (create(is_primary=True), ErrorCode.INDEX_EXISTS, "already has a primary index", "name"),
    (
        create(is_primary=True, name="pk2", where="a = 1"),
        ErrorCode.BAD_REQUEST,
        "no WHERE",
        "name",
    ),
    (
        create(is_primary=True, name="pk2", keys=K),
        ErrorCode.BAD_REQUEST,
        "takes no keys",
        "name",
    ),
]


def state_with_existing() -> StateContext:
    ctx = FakeCtx()
    state = ctx.state
    for name, primary in (("old", False), ("pk", True)):
        defn = validate_create(
            create(name=name, is_primary=primary), state, [*UP3, "n4"], UP3
        ).definition
        rec = IndexRecord(definition=msgspec.structs.replace(defn, id=f"1.1.{name}"), state=READY)
        topo = Topology(seq_num=1, assignment={0: "n1"})
        state = msgspec.structs.replace(
            state,
            indexes={**state.indexes, rec.id: rec},
            index_topologies={**state.index_topologies, rec.id: [topo]},
        )
    return state


@pytest.mark.parametrize(("msg", "code", "words", "key"), BAD)
def test_bad_create_is_refused_before_anything_is_created(
    msg: CreateIndex, code: ErrorCode, words: str, key: str
) -> None:
    with pytest.raises(ShardexError) as err:
        validate_create(msg, state_with_existing(), [*UP3, "n4"], UP3)
    assert err.value.code is code
    assert words in err.value.message, err.value.message
    assert key in err.value.details, err.value.details


def test_no_indexer_up() -> None:
    with pytest.raises(ShardexError) as err:
        validate_create(create(), FakeCtx().state, ["n1"], [])
    assert err.value.code is ErrorCode.NODE_UNAVAILABLE
    assert err.value.details["reason"] == "no_indexer" and "hint" in err.value.details


def test_defaults_and_canonical_form() -> None:
    plan = validate_create(
        create(keys=[IndexKey(expr="lower( name )", desc=True)], partition_by=["META().id"]),
        FakeCtx().state,
        UP3,
        UP3,
    )
    assert plan.definition.num_partition == 8  # PARTITION BY without num_partition
    assert plan.definition.keys == [IndexKey(expr="LOWER(name)", desc=True)]
    assert sorted(Counter(plan.assignment.values()).values()) == [2, 3, 3]
    primary = validate_create(create(is_primary=True, name=None), FakeCtx().state, UP3, UP3)
    assert primary.definition.name == "#primary" and primary.definition.keys[0].expr == "META().id"


# --- placement ------------------------------------------------------------------------------


def test_placement_balances_by_load_and_existing_slices() -> None:
    got = place_partitions(4, ["b", "a"], Counter(), weight=1)
    assert got == {0: "a", 1: "b", 2: "a", 3: "b"}
    # a already carries the load of 3 slices: the new index fills b and c first
    load = Counter({"a": 3})
    got = place_partitions(4, ["a", "b", "c"], load, weight=1)
    assert Counter(got.values()) == Counter({"b": 2, "c": 2})
    got = place_partitions(7, ["a", "b", "c"], load, weight=1)
    assert Counter(got.values()) == Counter({"a": 1, "b": 3, "c": 3})
    # heavier slices: a's load is worth one and a half of them
    got = place_partitions(4, ["a", "b", "c"], load, weight=2)
    assert Counter(got.values()) == Counter({"b": 2, "c": 2})


def test_pinned_placement_uses_exactly_the_named_nodes() -> None:
    got = place_partitions(5, ["n3", "n1"], Counter({"n1": 10}), pinned=["n3", "n1"], weight=1)
    assert Counter(got.values()) == Counter({"n3": 3, "n1": 2})


def test_slice_load_skips_indexes_being_dropped() -> None:
    state = state_with_existing()
    assert slice_load(state) == Counter({"n1": 2 * UNIT})  # two unpartitioned indexes
    dropped = msgspec.structs.replace(state.indexes["1.1.old"], state=DELETED)
    state = msgspec.structs.replace(state, indexes={**state.indexes, "1.1.old": dropped})
    assert slice_load(state) == Counter({"n1": UNIT})


def _created(state: StateContext, msg: CreateIndex) -> StateContext:
    """``state`` with the index ``msg`` creates, placed as ``validate_create`` places it."""
    plan = validate_create(msg, state, UP3, UP3)
    rec = IndexRecord(
        definition=msgspec.structs.replace(plan.definition, id=f"1.1.{msg.name}"), state=ACTIVE
    )
    topo = Topology(seq_num=1, assignment=plan.assignment, replicas=plan.replicas)
    return msgspec.structs.replace(
        state,
        indexes={**state.indexes, rec.id: rec},
        index_topologies={**state.index_topologies, rec.id: [topo]},
    )


def test_placement_balances_unpartitioned_and_partitioned_indexes_by_weight() -> None:
    # Two unpartitioned indexes, then one partitioned 8 ways, over 3 indexers. Each index
    # carries the keyspace's key versions: counting slices put 3 of the 8 next to each
    # unpartitioned one (1.375, 1.25 and 0.375 of an index per node).
    state = FakeCtx().state
    state = _created(state, create(name="by_a"))
    state = _created(state, create(name="by_b"))
    state = _created(state, create(name="by_c", partition_by=["META().id"], num_partition=8))
    # Weighed here, not by ``slice_load``: a whole index on the unpartitioned ones' nodes.
    load = Counter({n: 0 for n in UP3})
    for index_id, (topo,) in state.index_topologies.items():
        parts = state.indexes[index_id].definition.num_partition
        for node in topo.assignment.values():
            load[node] += UNIT // parts
    assert max(load.values()) - min(load.values()) <= UNIT // 8, load
    # Each unpartitioned index went to a node of its own.
    homes = {state.index_topologies[f"1.1.by_{x}"][-1].assignment[0] for x in "ab"}
    assert len(homes) == 2


# --- CREATE ---------------------------------------------------------------------------------


async def test_create_runs_the_prepare_phase_in_order() -> None:
    ctx = FakeCtx()
    d = ddl()
    steps: list[int] = []
    d.step_hook = lambda step, _id: steps.append(step)
    reply = await run(d.create_index, create(partition_by=["META().id"], num_partition=3), ctx)
    assert steps == [1, 2, 8, 9, 10, 11, 10, 11, 17]
    assert [c.indexes[reply.index.id].state for c in ctx.commits] == [INIT, READY, BUILDING]
    assert reply.index.state == BUILDING and reply.topology.nodes() == UP3
    assert creation_base(reply.index.id) == (1, 1)  # built on epoch 1 cas 1
    allocs = [(n, m) for n, m in ctx.pool.sent if isinstance(m, AllocateSlices)]
    assert [(n, m.partitions) for n, m in allocs] == [("n1", [0]), ("n2", [1]), ("n3", [2])]
    # The reply is recorded with the last commit: a retried request id gets it back.
    assert stored_reply(ctx.state, reply.index.request_id) == reply
    # A retry whose stored reply was evicted finds the index by its request id.
    ctx.state = msgspec.structs.replace(ctx.state, applied_requests={})
    retry = create(partition_by=["META().id"], num_partition=3, request_id=reply.index.request_id)
    again = await run(d.create_index, retry, ctx)
    assert again.index.id == reply.index.id and len(ctx.commits) == 3


async def test_deferred_create_stops_at_ready() -> None:
    ctx = FakeCtx()
    reply = await ddl().create_index(create(defer_build=True, nodes=["n2"]), ctx)
    assert reply.index.state == READY and reply.topology.assignment == {0: "n2"}
    assert [c.indexes[reply.index.id].state for c in ctx.commits] == [INIT, READY]


async def test_failed_allocation_removes_the_index_and_fails_cleanly() -> None:
    ctx = FakeCtx(failing=frozenset({"n2"}))
    with pytest.raises(ShardexError) as err:
        await ddl().create_index(create(partition_by=["META().id"], num_partition=3), ctx)
    e = err.value
    assert e.code is ErrorCode.NODE_UNAVAILABLE and e.details["reason"] == "allocation_failed"
    assert "n2" in e.message and "nothing is left behind" in e.message and "hint" in e.details
    states = [next(iter(c.indexes.values())).state if c.indexes else None for c in ctx.commits]
    assert states == [INIT, DELETED, None]  # never READY
    assert not ctx.state.indexes and not ctx.state.index_topologies
    # n1 had allocated: it is told to drop; n3 was never asked to allocate.
    drops = sorted(n for n, m in ctx.pool.sent if isinstance(m, DropSlices))
    assert drops == ["n1", "n2", "n2", "n3"]
    assert not ctx.state.applied_requests  # a retry runs the CREATE again


async def test_a_down_indexer_is_not_retried() -> None:
    ctx = FakeCtx()
    plan_up = {"n1": True, "n2": True, "n3": True}
    ctx.membership = indexers(plan_up)
    d = ddl()

    def down_after_placement(step: int, _id: str) -> None:
        if step == 8:
            ctx.membership.up["n1"] = False

    d.step_hook = down_after_placement
    with pytest.raises(ShardexError) as err:
        await run(d.create_index, create(partition_by=["META().id"], num_partition=3), ctx)
    assert "n1 is down" in err.value.message
    assert not [m for _, m in ctx.pool.sent if isinstance(m, AllocateSlices)]


# --- BUILD, DROP, pipeline hooks ------------------------------------------------------------


async def test_build_moves_ready_and_error_to_building() -> None:
    ctx = FakeCtx()
    d = ddl()
    a = (await run(d.create_index, create(name="a", defer_build=True), ctx)).index
    b = (await run(d.create_index, create(name="b"), ctx)).index
    reply = await run(d.build_index, BuildIndex(keyspace="ks", names=["a", "b", "a"]), ctx)
    assert reply.started == ["a"] and [r.state for r in reply.indexes] == [BUILDING, BUILDING]
    n = len(ctx.commits)
    assert (await run(d.build_index, BuildIndex(keyspace="ks", names=["a"]), ctx)).started == []
    assert len(ctx.commits) == n  # nothing to do, nothing committed
    await run(d.mark_error, MarkIndexError(index_id=b.id, error="disk full"), ctx)
    assert ctx.state.indexes[b.id].state == ERROR
    reply = await run(d.build_index, BuildIndex(keyspace="ks", names=["b"]), ctx)
    assert reply.started == ["b"] and ctx.state.indexes[b.id].error == ""
    for names, code in ((["zz"], ErrorCode.INDEX_NOT_FOUND), ([], ErrorCode.BAD_REQUEST)):
        with pytest.raises(ShardexError) as err:
            await run(d.build_index, BuildIndex(keyspace="ks", names=names), ctx)
        assert err.value.code is code
    with pytest.raises(ShardexError) as err:
        await run(d.build_index, BuildIndex(keyspace="nope", names=["a"]), ctx)
    assert err.value.code is ErrorCode.KEYSPACE_NOT_FOUND
    assert a.id in ctx.state.indexes


async def test_pipeline_hooks_validate_state() -> None:
    ctx = FakeCtx()
    d = ddl()
    rec = (await run(d.create_index, create(defer_build=True), ctx)).index
    progress = IndexBuildProgress(index_id=rec.id, progress=0.25, items_count=5)
    with pytest.raises(ShardexError) as err:
        await run(d.build_progress, progress, ctx)  # READY, not BUILDING
    assert err.value.code is ErrorCode.BAD_REQUEST and err.value.details["state"] == READY
    await run(d.build_index, BuildIndex(keyspace="ks", names=["ix"]), ctx)
    upd = await run(d.build_progress, progress, ctx)
    assert (upd.index.progress, upd.index.items_count) == (0.25, 5)
    with pytest.raises(ShardexError):
        await run(d.build_progress, IndexBuildProgress(index_id=rec.id, progress=2.0), ctx)
    ts = {3: (10, 99)}
    upd = await run(
        d.mark_active, MarkIndexActive(index_id=rec.id, build_ts=ts, items_count=7), ctx
    )
    assert upd.index.state == ACTIVE and upd.index.stability_ts == ts and upd.index.progress == 1
    n = len(ctx.commits)
    await run(d.mark_active, MarkIndexActive(index_id=rec.id, build_ts=ts), ctx)  # idempotent
    assert len(ctx.commits) == n
    # A rebuild after a rollback: ACTIVE stays ACTIVE with the new build TS.
    rebuilt = {3: (4, 123)}
    upd = await run(d.mark_active, MarkIndexActive(index_id=rec.id, build_ts=rebuilt), ctx)
    assert upd.index.state == ACTIVE and upd.index.build_ts == rebuilt
    assert len(ctx.commits) == n + 1
    await run(d.drop_index, DropIndex(keyspace="ks", name="ix"), ctx)
    with pytest.raises(ShardexError) as err:
        await run(d.mark_active, MarkIndexActive(index_id=rec.id, build_ts=ts), ctx)
    assert err.value.code in (ErrorCode.BAD_REQUEST, ErrorCode.INDEX_NOT_FOUND)
    with pytest.raises(ShardexError) as err:
        await run(d.mark_active, MarkIndexActive(index_id="1.1.none", build_ts=ts), ctx)
    assert err.value.code is ErrorCode.INDEX_NOT_FOUND


async def test_drop_names_the_indexers_that_could_not_be_told() -> None:
    ctx = FakeCtx()
    d = ddl()
    rec = (
        await run(d.create_index, create(partition_by=["META().id"], num_partition=3), ctx)
    ).index
    ctx.membership.up["n3"] = False
    drop = DropIndex(keyspace="ks", name="ix", request_id="drop-1")
    reply = await run(d.drop_index, drop, ctx)
    assert reply == IndexDropped(index_id=rec.id, keyspace="ks", name="ix", pending_nodes=["n3"])
    assert not ctx.state.indexes and stored_reply(ctx.state, "drop-1") == reply
    assert [next(iter(c.indexes.values())).state for c in ctx.commits[-2:-1]] == [DELETED]
    for msg, code in (
        (DropIndex(keyspace="ks", name="ix"), ErrorCode.INDEX_NOT_FOUND),
        (DropIndex(keyspace="nope", name="ix"), ErrorCode.KEYSPACE_NOT_FOUND),
        (DropIndex(keyspace="ks", is_primary=True), ErrorCode.INDEX_NOT_FOUND),
    ):
        with pytest.raises(ShardexError) as err:
            await run(d.drop_index, msg, ctx)
        assert err.value.code is code


async def test_drop_primary() -> None:
    ctx = FakeCtx()
    d = ddl()
    await run(d.create_index, create(is_primary=True, name=None), ctx)
    await run(d.create_index, create(name="sec"), ctx)
    with pytest.raises(ShardexError) as err:
        await run(d.drop_index, DropIndex(keyspace="ks", name="sec", is_primary=True), ctx)
    assert err.value.code is ErrorCode.BAD_REQUEST
    reply = await run(d.drop_index, DropIndex(keyspace="ks", is_primary=True), ctx)
    assert reply.name == "#primary"
    assert [r.name for r in ctx.state.indexes.values()] == ["sec"]


# --- recovery -------------------------------------------------------------------------------


def in_flight(ctx: FakeCtx, state: str, **kw: Any) -> IndexRecord:
    """An index left in ``state`` by a previous master (built as that op would)."""
    plan = validate_create(create(partition_by=["META().id"], num_partition=2), ctx.state, UP3, UP3)
    rec = IndexRecord(
        definition=msgspec.structs.replace(plan.definition, id="1.1.x"),
        state=state,
        request_id="create-1",
        **kw,
    )
    topo = Topology(seq_num=1, assignment=plan.assignment)
    ctx.state = msgspec.structs.replace(
        ctx.state, indexes={rec.id: rec}, index_topologies={rec.id: [topo]}
    )
    return rec


async def test_recovery_finishes_init_and_answers_the_retry() -> None:
    ctx = FakeCtx(request_id=None)
    in_flight(ctx, INIT)
    await ddl().recover(ctx)
    assert ctx.state.indexes["1.1.x"].state == BUILDING
    assert sum(isinstance(m, AllocateSlices) for _, m in ctx.pool.sent) == 2
    reply = stored_reply(ctx.state, "create-1")
    assert isinstance(reply, IndexCreated) and reply.index.state == BUILDING


async def test_recovery_removes_init_it_cannot_allocate() -> None:
    ctx = FakeCtx(request_id=None)
    ctx.membership.up["n2"] = False
    in_flight(ctx, INIT)
    await ddl().recover(ctx)
    assert not ctx.state.indexes and "create-1" not in ctx.state.applied_requests


async def test_recovery_starts_the_build_of_ready_and_keeps_deferred() -> None:
    ctx = FakeCtx(request_id=None)
    in_flight(ctx, READY)
    await ddl().recover(ctx)
    assert ctx.state.indexes["1.1.x"].state == BUILDING
    assert not ctx.pool.sent  # nothing to allocate again
    ctx = FakeCtx(request_id=None)
    in_flight(ctx, READY, defer_build=True)
    await ddl().recover(ctx)
    assert ctx.state.indexes["1.1.x"].state == READY and not ctx.commits


async def test_recovery_finishes_a_drop_and_answers_the_retry() -> None:
    ctx = FakeCtx(request_id=None)
    in_flight(ctx, DELETED, drop_request_id="drop-1")
    await ddl().recover(ctx)
    assert not ctx.state.indexes
    reply = stored_reply(ctx.state, "drop-1")
    assert isinstance(reply, IndexDropped) and reply.index_id == "1.1.x"
    assert sorted(n for n, m in ctx.pool.sent if isinstance(m, DropSlices)) == ["n1", "n2"]


async def test_recovery_leaves_settled_states_alone() -> None:
    for state in (BUILDING, ACTIVE, ERROR):
        ctx = FakeCtx(request_id=None)
        in_flight(ctx, state)
        await ddl().recover(ctx)
        assert ctx.state.indexes["1.1.x"].state == state and not ctx.commits


def test_creation_base() -> None:
    assert creation_base("3.17.abc") == (3, 17)
    assert creation_base("3.17.a.b") == (3, 17)
    for other in ("abc", "x.1.a", "1.2", "1.-2.a"):
        assert creation_base(other) is None
