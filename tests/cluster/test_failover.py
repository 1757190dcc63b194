"""Failover in real node processes: kill -9 of a node holding active copies under writers at
durability majority; automatic failover promotes replicas, writes go on, the node restarts,
is recovered and rebalanced back in; no acknowledged write is ever lost.

A key's value carries its writer's counter ``v``: after every cycle each key must read its
last acknowledged ``v``, or a later one whose write was ambiguous (it may have taken effect).
A lower one is a lost acknowledged write. ``SHARDEX_FAILOVER_CYCLES`` (default 2; the slow
variant runs 20) sets how many kill/failover/recover/rebalance cycles run."""

from __future__ import annotations

import os
import signal
import time

import msgspec
import pytest
from cluster_helpers import LocalCluster, wait_for
from data_helpers import (
    FAST_FAILOVER,
    Writers,
    chains_full,
    kill9,
    read_partition,
    running_cluster,
)

from shardex.api.data import Get, GetReply
from shardex.client import connect_local
from shardex.errors import ErrorCode, ShardexError

pytestmark = pytest.mark.cluster

KS = "ha"
NP = 16
WRITERS = 3
KEYS_PER_WRITER = 20
FAST = FAST_FAILOVER


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("failover"), extra=FAST) as c:
        yield c


def test_kill9_failover_recover_rebalance_loses_no_majority_write(cluster: LocalCluster) -> None:
    failover_cycles(cluster, int(os.environ.get("SHARDEX_FAILOVER_CYCLES", "2")))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_twenty_failover_cycles_lose_no_majority_write(cluster: LocalCluster) -> None:
    failover_cycles(cluster, 20)


def failover_cycles(cluster: LocalCluster, cycles: int) -> None:
    """``cycles`` of kill -9, automatic failover, restart, delta recovery and rebalance
    under the writers, every acknowledged write checked after each step."""
    with connect_local(cluster.path, name="admin", request_timeout=30) as admin:
        if any(k.name == KS for k in admin.list_keyspaces()):
            admin.drop_keyspace(KS)  # another test of the module made it
        desc = admin.create_keyspace(KS, NP, num_replicas=2)
        assert desc.num_replicas == 2 and desc.min_replicas == 2
        with Writers(cluster, KS, WRITERS, KEYS_PER_WRITER) as writers:
            wait_for(lambda: writers.acks > 100, 30, what="writers under way")
            for cycle in range(cycles):
                victim = 2 + cycle % 2  # node2, node3: node1 founded the cluster
                name = f"node{victim}"
                floor = writers.acks + 100
                killed = time.monotonic()
                kill9(cluster, victim)
                wait_for(lambda n=name: n in admin.failed_over(), 30, what=f"{name} failed over")
                took = time.monotonic() - killed
                # writes go on at majority: 3 copies configured, 2 left in every chain
                wait_for(lambda f=floor: writers.acks > f, 30, what="writes after failover")
                writers.check(admin)
                cluster.start()  # restarts the killed node
                admin.recover(name, "delta")
                admin.rebalance()
                wait_for(lambda: chains_full(admin, KS), 30, what="chains restored")
                writers.check(admin)
                print(f"cycle {cycle}: {name} failed over {took:.1f}s after kill -9")
        writers.check(admin)
        assert writers.acks > 0


def test_durability_none_loses_exactly_the_unreplicated_tail(cluster: LocalCluster) -> None:
    """Writes at durability none are acknowledged by the active alone: those that had not
    been sent to its replica when the active died are lost at failover, and only those (a
    suffix of the history). The replica is paused (SIGSTOP) for well under the failure
    timeout so the tail cannot reach it."""
    with connect_local(cluster.path, name="tail", request_timeout=30) as admin:
        desc = admin.create_keyspace("tail", 4, num_replicas=1)
        p = next(q for q, n in desc.assignment.items() if n != "node1")
        active, replica = desc.assignment[p], desc.replicas[p][0]
        docs = [
            d for d in (f"t{i}" for i in range(5000)) if admin.keyspace("tail").partition_of(d) == p
        ]
        ks = admin.keyspace("tail")
        kept, tail = docs[:20], docs[20:40]
        for d in kept:
            ks.upsert(d, {"d": d}, durability="majority")  # on both copies when acknowledged
        rpid = cluster.pid(int(replica.removeprefix("node")))
        assert rpid is not None
        os.kill(rpid, signal.SIGSTOP)
        try:
            for d in tail:
                ks.upsert(d, {"d": d}, durability="none")  # acknowledged by the active alone
            kill9(cluster, int(active.removeprefix("node")))
        finally:
            os.kill(rpid, signal.SIGCONT)
        wait_for(lambda: active in admin.failed_over(), 30, what=f"{active} failed over")
        lost = [d for d in tail if _absent(ks, d)]
        assert all(ks.get(d) == {"d": d} for d in kept)
        # The tail is what never left the active: the writes after the one ReplicaApply in
        # flight when the replica paused (that one sits in the paused replica's socket and is
        # applied when it resumes). In seqno order, so the lost writes are a suffix.
        assert lost, "the paused replica cannot have acknowledged every write"
        assert lost == tail[len(tail) - len(lost) :], f"lost writes not a suffix: {lost}"
        print(f"durability none: {len(lost)} of {len(tail)} acknowledged writes lost")
        # The failed-over node comes back holding the lost writes: a delta recovery keeps
        # its copies, yet none of those writes may reappear anywhere.
        cluster.start()
        admin.recover(active, "delta")
        admin.rebalance()
        wait_for(lambda: chains_full(admin, "tail"), 30, what="chains restored")
        for d in lost:
            with pytest.raises(ShardexError) as err:
                ks.get(d, replica="any")  # every copy answers: none has it
            assert err.value.code is ErrorCode.DOC_NOT_FOUND
        _markers, changes = read_partition(ks, p)
        assert not {c.docid for c in changes} & set(lost)


def _absent(ks, docid: str) -> bool:
    try:
        ks.get(docid)
    except ShardexError as exc:
        if exc.code is ErrorCode.DOC_NOT_FOUND:
            return True
        raise
    return False


def test_sql_dml_takes_a_durability(cluster: LocalCluster) -> None:
    """``client.query(..., durability=)`` applies to every document a statement writes: at
    majority, each is on a replica copy when the statement returns."""
    with connect_local(cluster.path, name="sql", request_timeout=30) as admin:
        desc = admin.create_keyspace("sqld", 4, num_replicas=1)
        ks = admin.keyspace("sqld")
        keys = [f"k{i}" for i in range(12)]
        values = ", ".join(f'VALUES ("{k}", {{"n": {i}}})' for i, k in enumerate(keys))
        rows = admin.query(f"UPSERT INTO sqld (KEY, VALUE) {values}", durability="majority")
        list(rows)
        assert rows.metrics is not None and rows.metrics.mutation_count == len(keys)
        for i, k in enumerate(keys):
            replica = desc.replicas[ks.partition_of(k)][0]
            msg = Get(keyspace="sqld", docid=k, replica=True)
            got = admin.rpc.run(admin.rpc.router.to_node(replica, msg, GetReply))
            assert msgspec.json.decode(got.body) == {"n": i}
        use_keys = ", ".join(f'"{k}"' for k in keys)
        updated = admin.query(
            f"UPDATE sqld USE KEYS [{use_keys}] SET n = n + 100", durability="persist_majority"
        )
        list(updated)
        assert updated.metrics is not None and updated.metrics.mutation_count == len(keys)
        with pytest.raises(ShardexError) as err:
            admin.query(f"DELETE FROM sqld USE KEYS [{use_keys}]", durability="eventually")
        assert err.value.code is ErrorCode.BAD_REQUEST
        assert "durability" in str(err.value)
