"""Index DDL under the simulator: 3 real Nodes (manager + index services), crashes at every
step of the DDL flow's prepare phase, replica crash and rejoin, partitions, the rack failure.

Every scenario ends with ``check_coordinator`` (replicas converge to one state and CAS) and
``check_index_ddl`` (never an index READY or later without all its slices on any node's
state; nothing left in INIT or DELETED; acknowledged CREATEs present; no orphan slices).
How the harness crashes the master at each step is in ``index_ddl_harness.py``.

Seeds: a few per test by default; ``SHARDEX_SIM_SEEDS=200`` runs that many, and
``SHARDEX_SIM_SEED=n`` replays one (``shardex.sim.many_seeds``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from index_ddl_harness import IndexCluster
from manager_cluster import FT, HOSTS, wait_until

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.index_ddl import (
    CreateIndex,
    DropIndex,
    IndexBuildProgress,
    IndexCreated,
    IndexDropped,
    IndexUpdated,
    MarkIndexActive,
)
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_definition import IndexKey
from shardex.meta.index_state import ACTIVE, BUILDING, INIT, READY
from shardex.meta.state import StateContext
from shardex.sim import (
    ClusterNode,
    FaultConfig,
    Simulation,
    assert_deterministic,
    many_seeds,
    run_simulation,
)

KEYS = [IndexKey(expr="age")]


def index_kwargs(placement: str, master: str) -> dict[str, Any]:
    """``replicas``: 2 partitions pinned to the two replicas (the dead master hosts none,
    so recovery can finish the index). ``spread``: 3 partitions over all nodes (the dead
    master hosts one, so a recovery that must allocate cannot, and removes the index)."""
    kw: dict[str, Any] = {"keys": KEYS, "partition_by": ["META().id"]}
    if placement == "replicas":
        kw.update(num_partition=2, nodes=[h for h in HOSTS if h != master])
    else:
        kw.update(num_partition=3)
    return kw


def expect_same_index(step: int, placement: str) -> bool | None:
    """Whether the index the client ends up with is the one the crashed master created
    (recovery finished it) rather than a new one (the retry created it again). None: no
    index was created before the crash."""
    if step <= 2:
        return None
    if step <= 4:  # INIT only on the dead master: the new master never saw it
        return False
    if placement == "replicas":
        return True
    # spread: the dead master hosts a slice. Until READY is on a replica the new master must
    # (re)allocate, which it cannot, so it removes the index and the retry creates another.
    return step >= 14


def step_scenario(step: int, placement: str) -> Any:
    async def main(sim: Simulation) -> dict[str, Any]:
        c = IndexCluster(sim)
        await c.start()
        master = c.master()
        assert master is not None
        entry = sim.rng.choice(HOSTS)  # the client's node: the master or a forwarding replica
        c.target = step
        loop = asyncio.get_running_loop()
        task = loop.create_task(
            c.create("ix", "req-ix", hosts=(entry, *HOSTS), **index_kwargs(placement, master))
        )
        await asyncio.wait(
            [loop.create_task(c.fired.wait()), task],
            timeout=30.0,
            return_when=asyncio.FIRST_COMPLETED,
        )
        assert c.fired.is_set(), f"step {step} never happened"
        assert c.victim == master
        await c.crash(master)
        reply = await task  # the client retries with the same request id: success
        assert reply.index.name == "ix" and reply.index.state == BUILDING
        same = expect_same_index(step, placement)
        if same is not None:
            assert (reply.index.id == c.first_id) is same, (reply.index.id, c.first_id)
        await c.restart(master)
        await wait_until(c.settled, 30)
        final = c.check(created={"ix": reply.index.id})
        assert [r.name for r in final.indexes.values()] == ["ix"]
        assert final.indexes[reply.index.id].state == BUILDING
        return {"id": reply.index.id, "cas": final.cas}

    return main


STEPS = list(range(1, 18))


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("seed", many_seeds(2))
def test_master_crash_after_each_step(step: int, seed: int) -> None:
    placement = "replicas" if seed % 2 == 0 else "spread"
    run_simulation(step_scenario(step, placement), seed)


@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("seed", many_seeds(20))
def test_master_crash_after_each_step_many_seeds(step: int, seed: int) -> None:
    faults = FaultConfig(latency_mean=0.003, latency_max=0.05)
    for placement in ("replicas", "spread"):
        run_simulation(step_scenario(step, placement), seed, faults)


def test_same_seed_replays_exactly() -> None:
    assert_deterministic(step_scenario(9, "spread"), 5)


# --- the other ops, over the wire ---------------------------------------------------------


async def read_indexes(c: IndexCluster, host: str, fresh: bool = False) -> StateContext:
    reply = await c.client.request(
        f"{host}:7000",
        StateRequest(sections=["indexes", "index_topologies"], fresh=fresh),
        10.0,
        expect=StateReply,
    )
    return reply.state


async def expect_error(coro: Any, code: ErrorCode) -> ShardexError:
    with pytest.raises(ShardexError) as err:
        await coro
    assert err.value.code is code, err.value
    return err.value


@pytest.mark.parametrize("seed", many_seeds(2))
def test_create_build_pipeline_hooks_drop(seed: int) -> None:
    async def main(sim: Simulation) -> None:
        c = IndexCluster(sim)
        await c.start()
        created = await c.create("deferred", "r1", keys=KEYS, defer_build=True)
        assert created.index.state == READY and created.topology.seq_num == 1
        index_id = created.index.id
        cas = c.coord("n1").state.cas
        again = await c.create("deferred", "r1", keys=KEYS, defer_build=True)
        assert again.index.id == index_id and c.coord("n1").state.cas == cas  # deduplicated
        await expect_error(c.create("deferred", "r2", keys=KEYS), ErrorCode.INDEX_EXISTS)
        await expect_error(
            c.request(CreateIndex(keyspace="nope", name="x", keys=KEYS), IndexCreated),
            ErrorCode.KEYSPACE_NOT_FOUND,
        )
        bad = await expect_error(
            c.create("pinned", "r3", keys=KEYS, nodes=["n9"]), ErrorCode.BAD_REQUEST
        )
        assert bad.details["node"] == "n9" and "hint" in bad.details
        # Every node lists the same record (its own replica).
        for h in HOSTS:
            assert (await read_indexes(c, h)).indexes[index_id].state == READY
        built = await c.build("deferred", request_id="r4")
        assert built.started == ["deferred"] and built.indexes[0].state == BUILDING
        assert (await c.build("deferred", request_id="r5")).started == []  # no-op
        await expect_error(c.build("nope", request_id="r6"), ErrorCode.INDEX_NOT_FOUND)
        # The pipeline's hooks.
        progress = IndexBuildProgress(index_id=index_id, progress=0.5, items_count=10)
        upd = await c.request(progress, IndexUpdated)
        assert upd.index.progress == 0.5 and upd.index.items_count == 10
        ts = {0: (42, 7)}
        active = MarkIndexActive(index_id=index_id, build_ts=ts, items_count=20)
        upd = await c.request(active, IndexUpdated)
        assert upd.index.state == ACTIVE and upd.index.build_ts == ts
        assert (await c.request(active, IndexUpdated)).index.state == ACTIVE  # idempotent
        await expect_error(c.request(progress, IndexUpdated), ErrorCode.BAD_REQUEST)
        primary = await c.request(
            CreateIndex(keyspace="ks", is_primary=True, request_id="r7"), IndexCreated
        )
        assert primary.index.name == "#primary" and primary.index.state == BUILDING
        dropped = await c.drop("deferred", "r8")
        assert dropped.index_id == index_id and dropped.pending_nodes == []
        await expect_error(c.drop("deferred", "r9"), ErrorCode.INDEX_NOT_FOUND)
        again_dropped = await c.drop("deferred", "r8")  # a retry gets the stored reply
        assert again_dropped.index_id == index_id
        await wait_until(c.settled, 10)
        final = c.check(created={"#primary": primary.index.id})
        assert [r.name for r in final.indexes.values()] == ["#primary"]

    run_simulation(main, seed)


@pytest.mark.parametrize("target", [103, 105, 107])
@pytest.mark.parametrize("seed", many_seeds(2))
def test_master_crash_during_drop(target: int, seed: int) -> None:
    """DELETED persisted on the master only (103), the DROP sent straight to the master
    without a request id (nobody retries it): the new master never saw the drop, and the old
    master's indexer must keep its slice when it returns (it checks drops against the
    committed state, not its own replica). On one or both replicas (105, 107): recovery
    finishes the drop and records the reply, which the client's retry gets."""

    async def main(sim: Simulation) -> None:
        c = IndexCluster(sim)
        await c.start()
        created = await c.create("ix", "r1", keys=KEYS, partition_by=["META().id"], num_partition=3)
        await wait_until(c.settled, 10)
        master = c.master()
        assert master is not None
        c.target = target
        loop = asyncio.get_running_loop()
        if target == 103:
            once = DropIndex(keyspace="ks", name="ix")
            task = loop.create_task(c.request(once, IndexDropped, hosts=(master,), attempts=1))
        else:
            task = loop.create_task(c.drop("ix", "drop-1"))
        await asyncio.wait(
            [loop.create_task(c.fired.wait()), task], return_when=asyncio.FIRST_COMPLETED
        )
        assert c.fired.is_set() and c.victim == master
        await c.crash(master)
        if target == 103:
            await expect_error(task, ErrorCode.CONNECTION_CLOSED)
            # Fail over first: a master back within the failure timeout is re-elected and
            # rightly continues from its own newest state (the drop would then complete).
            await wait_until(lambda: c.master() not in (None, master), FT + 10)
            await c.restart(master)
            await wait_until(c.settled, 30)  # the index is still there, every slice too
            c.check(created={"ix": created.index.id})
            task = loop.create_task(c.drop("ix", "drop-2"))
        dropped = await task
        assert dropped.index_id == created.index.id
        if target != 103:
            await c.restart(master)
        await wait_until(c.settled, 30)
        final = c.check()
        assert not final.indexes and not any(c.all_slices().values())

    run_simulation(main, seed)


# --- replicas, partitions, the rack --------------------------------------------------------


@pytest.mark.parametrize("seed", many_seeds(2))
def test_replica_crash_and_rejoin(seed: int) -> None:
    async def main(sim: Simulation) -> None:
        c = IndexCluster(sim)
        await c.start()
        a = await c.create("a", "ra", keys=KEYS, partition_by=["META().id"], num_partition=3)
        await wait_until(c.settled, 10)
        await c.crash("n3", power_off=sim.rng.random() < 0.5)
        await wait_until(lambda: "n3" not in c.coord("n1")._group.up_voters(), FT + 3)
        b = await c.create("b", "rb", keys=KEYS, partition_by=["META().id"], num_partition=4)
        assert sorted(b.topology.nodes()) == ["n1", "n2"]  # placed on the up indexers
        dropped = await c.drop("a", "rd")
        assert dropped.pending_nodes == ["n3"]  # it drops its slice when it returns
        assert (a.index.id, 2) in c.disk_slices("n3")
        await c.restart("n3")
        await wait_until(c.settled, 15)  # resynced, and its slice of "a" is gone
        c.check(created={"b": b.index.id})
        # A replica dies once it holds INIT: its slice cannot be allocated, the CREATE
        # fails cleanly, and a retry once it is known down succeeds elsewhere.
        loop = asyncio.get_running_loop()
        c.on_persist = lambda host, phase: (
            loop.call_soon(c.sim.network.crash, "n3") if (host, phase) == ("n3", INIT) else None
        )
        err = await expect_error(
            c.create("c", "rc", keys=KEYS, partition_by=["META().id"], num_partition=3),
            ErrorCode.NODE_UNAVAILABLE,
        )
        assert err.details["reason"] == "allocation_failed"
        await c.crash("n3")
        assert "c" not in {r.name for r in c.coord("n1").state.indexes.values()}
        await wait_until(lambda: "n3" not in c.coord("n1")._group.up_voters(), FT + 3)
        cc = await c.create("c", "rc2", keys=KEYS, partition_by=["META().id"], num_partition=3)
        await c.restart("n3")
        await wait_until(c.settled, 15)
        c.check(created={"b": b.index.id, "c": cc.index.id})

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", many_seeds(3))
def test_partition_replica_then_heal(seed: int) -> None:
    """Seed note 1: a replica cut off before replication completes. The commit goes on with
    the majority; the allocation on the cut-off indexer succeeds if the cut heals in time
    (frames are held, then delivered) or fails cleanly; after the heal the master keeps
    replicating and the replica converges."""

    async def main(sim: Simulation) -> None:
        c = IndexCluster(sim)
        await c.start()
        loop = asyncio.get_running_loop()
        sim.cluster.partition(["n3"])
        heal_after = sim.rng.uniform(0.5, 9.0)
        loop.call_later(heal_after, sim.cluster.heal)
        created: dict[str, str] = {}
        try:
            r = await c.create(
                "ix",
                "r1",
                hosts=("n1", "n2"),
                keys=KEYS,
                partition_by=["META().id"],
                num_partition=3,
            )
            created["ix"] = r.index.id
        except ShardexError as exc:
            assert exc.details.get("reason") == "allocation_failed", exc
        await asyncio.sleep(max(0.0, heal_after - loop.time() + 0.1))
        await wait_until(c.settled, 20)
        final = c.check(created=created)
        assert len(final.indexes) == len(created)

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", many_seeds(3))
def test_partition_master_then_heal(seed: int) -> None:
    """The master is cut off while it persists INIT: its commit fails (only it holds the
    state), the majority elects a new master, the client's retry with the same request id
    creates the index there; after the heal the old master's divergent INIT is replaced and
    any slice its indexer made from it is dropped."""

    async def main(sim: Simulation) -> None:
        c = IndexCluster(sim)
        await c.start()
        master = c.master()
        assert master == "n1"
        cut: list[int] = []

        def isolate_at_init(host: str, step: int, index_id: str) -> None:
            if step == 3 and not cut:  # the master has persisted INIT, nothing sent yet
                cut.append(step)
                sim.cluster.partition(["n1"])

        c._op_step = isolate_at_init  # type: ignore[method-assign]
        r = await c.create(
            "ix",
            "r1",
            hosts=("n2", "n3"),
            keys=KEYS,
            partition_by=["META().id"],
            num_partition=3,
        )
        assert r.index.state == BUILDING
        assert sorted(r.topology.nodes()) == ["n2", "n3"]
        assert c.coord("n2").is_master or c.coord("n3").is_master
        sim.cluster.heal()
        await wait_until(c.settled, 20)
        c.check(created={"ix": r.index.id})

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", many_seeds(2))
def test_rack_failure(seed: int) -> None:
    """Seed note 2. n3 is cut off; n1 (master) and n2 commit INIT and start allocating; then
    the "rack" n1 + n2 dies. n3 alone is a minority: requests fail with a clear no_master
    error instead of running on a state that lacks the index. n2 returns: the new master
    continues from the newest state and finishes or removes the index; n1 returns and
    resynchronises."""

    async def main(sim: Simulation) -> None:
        c = IndexCluster(sim)
        await c.start()
        sim.cluster.partition(["n3"])
        await wait_until(lambda: "n3" not in c.coord("n1")._group.up_voters(), FT + 3)
        c.target = 9
        loop = asyncio.get_running_loop()
        task = loop.create_task(
            c.create(
                "ix",
                "r1",
                hosts=("n1",),
                attempts=1,
                keys=KEYS,
                partition_by=["META().id"],
                num_partition=2,
            )
        )
        await c.fired.wait()
        await c.crash("n1")
        await c.crash("n2")
        with pytest.raises(ShardexError):
            await task  # the client's node died: the request fails
        sim.cluster.heal()
        err = await expect_error(
            c.create("other", "r2", hosts=("n3",), attempts=1, keys=KEYS),
            ErrorCode.NODE_UNAVAILABLE,
        )
        assert err.details["reason"] == "no_master"
        await c.restart("n2")
        await wait_until(lambda: c.master() is not None, FT + 10)
        await c.restart("n1")
        await wait_until(c.settled, 20)
        final = c.check()
        assert all(r.state == BUILDING for r in final.indexes.values())

    run_simulation(main, seed)


def test_real_engine_in_the_simulator() -> None:
    """The same crash scenario with RocksDB ``IndexerEngine``s (tmpfs when there is one):
    the service, the engine and the DDL together."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    root = Path(tempfile.mkdtemp(prefix="shardex-idx-sim-", dir=base))
    try:

        def engine(node: ClusterNode) -> Any:
            from shardex.index.engine import IndexerEngine

            return IndexerEngine(root / node.host, sync=False)

        async def main(sim: Simulation) -> None:
            c = IndexCluster(sim, engine=engine)
            await c.start()
            master = c.master()
            assert master is not None
            c.target = 11
            loop = asyncio.get_running_loop()
            task = loop.create_task(c.create("ix", "r1", **index_kwargs("spread", master)))
            await c.fired.wait()
            await c.crash(master)
            reply = await task
            await c.restart(master)
            await wait_until(c.settled, 30)
            c.check(created={"ix": reply.index.id})
            assert os.listdir(root / master)

        run_simulation(main, 7)
    finally:
        shutil.rmtree(root, ignore_errors=True)
