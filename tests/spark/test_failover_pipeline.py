"""The index pipeline across failovers: a node holding active copies is killed with
``kill -9`` under a writer, automatic failover promotes its replicas on new branches (new
partition uuids), the node restarts, is recovered and rebalanced back in; the index follows
(the promoted partitions' history continues where the replicas were) and ends equal to the
oracle at the keyspace's high seqnos."""

from __future__ import annotations

import contextlib
import os
import random
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cluster_helpers import LocalCluster, wait_for
from data_helpers import FAST_FAILOVER, Writers, chains_full, running_cluster
from pipeline_helpers import Writer, check_oracle, mutate, running_pipeline, wait_stable

from shardex.client import Client, connect_local
from shardex.runtime.pidfile import pid_alive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "fo"
NAME = "by_name"
FAST = FAST_FAILOVER


@dataclass
class Env:
    path: Path
    cluster: LocalCluster
    client: Client


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("failover-pipeline")
    path = root / "cluster"
    with (
        running_cluster(path, nodes=3, extra=FAST) as cluster,
        connect_local(path, as_node=True) as client,
    ):
        client.create_keyspace(KEYSPACE, num_partitions=8, num_replicas=2)
        mutate(client, KEYSPACE, random.Random(5), 300)
        with running_pipeline(spark, path, root / "checkpoints", poll=0.3):
            client.create_index(
                KEYSPACE,
                NAME,
                ["name", "age"],
                where="type = 'user'",
                partition_by=["city"],
                num_partition=3,
            )
            client.wait_for_index(KEYSPACE, NAME, timeout=240)
            yield Env(path, cluster, client)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_index_follows_failovers_and_recoveries(env: Env) -> None:
    """Two cycles (node3, then node2): after each, the index equals the oracle."""
    for victim in (3, 2):
        failover_cycle(env, victim)


@pytest.mark.slow
@pytest.mark.timeout(5400)
def test_index_equals_the_oracle_after_each_of_twenty_failover_cycles(env: Env) -> None:
    """Twenty cycles alternating between node3 and node2 under the random writer and three
    writers at durability majority: after each, the index equals the oracle and every key of
    the majority writers holds its last acknowledged value or a later ambiguous one. (Builds
    retried after a rollback restart the copies an earlier attempt finished.)"""
    for cycle in range(20):
        failover_cycle(env, 3 if cycle % 2 == 0 else 2, majority_writers=True)


def failover_cycle(env: Env, victim: int, *, majority_writers: bool = False) -> None:
    """Kill -9 ``victim`` under the random writer (and, with ``majority_writers``, three
    writers at durability majority, checked once they stop), wait for its failover, restart,
    recover and rebalance it; then the index must equal the oracle at a stable TS."""
    client = env.client
    name = f"node{victim}"
    before = {p: e.uuid for p, e in client.high_seqnos(KEYSPACE).items()}
    owned = set(next(k for k in client.list_keyspaces() if k.name == KEYSPACE).partitions_of(name))
    assert owned, f"{name} holds no active copy to fail over"
    majority = Writers(env.cluster, KEYSPACE, writers=3) if majority_writers else None
    with (
        connect_local(env.path, name="writer", as_node=True) as wclient,
        Writer(wclient, KEYSPACE, victim) as w,
        majority or contextlib.nullcontext(),
    ):
        wait_for(lambda: w.done > 200, 60, what="writes before the kill")
        pid = env.cluster.pid(victim)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, what=f"{name} gone")
        wait_for(lambda: name in client.failed_over(), 30, what=f"{name} failed over")
        done = w.done
        wait_for(lambda: w.done > done + 200, 60, what="writes after the failover")
        env.cluster.start()
        client.recover(name, "delta")
        client.rebalance()
        wait_for(lambda: chains_full(client, KEYSPACE), 60, what="chains restored")
        done = w.done
        wait_for(lambda: w.done > done + 200, 60, what="writes after the rebalance")
    if majority is not None:
        assert majority.acks > 0
        majority.check(client)  # every acknowledged majority write survived the cycle
    after = {p: e.uuid for p, e in client.high_seqnos(KEYSPACE).items()}
    assert {p for p in after if after[p] != before[p]} >= owned  # promoted on new branches
    ts = wait_stable(client, KEYSPACE, [NAME], timeout=360)
    entries = check_oracle(client, KEYSPACE, NAME, ts)
    assert entries > 0
    print(
        f"\nfailover of {name} ({len(owned)} partitions promoted): {w.done} mutations, "
        f"{entries} index entries equal to the oracle at {ts!r}"
    )
