"""A failover with no write after it: the promoted partitions are on new branches (new
uuids) at the seqnos the index already applied, so there is no change to read, only the
branch to follow. A request_plus scan then asks for the new uuids at those seqnos; the
pipeline must carry the index onto them without waiting for a write."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from data_helpers import NO_AUTO_FAILOVER, running_cluster
from pipeline_helpers import running_pipeline

from shardex.client import Client, connect_local

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "fw"
NAME = "by_n"
DOCS = 40
WAIT = 90.0  # request_plus on a loaded 2-core box: a few micro-batches at most


@dataclass
class Env:
    path: Path
    client: Client


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("failover-idle")
    path = root / "cluster"
    with (
        running_cluster(path, nodes=3, extra=NO_AUTO_FAILOVER),
        connect_local(path, as_node=True) as client,
    ):
        client.create_keyspace(KEYSPACE, num_partitions=8, num_replicas=1)
        client.keyspace(KEYSPACE).upsert_many((f"d{i}", {"n": i}) for i in range(DOCS))
        # The stall watchdog off: its restart (a new client, a fresh topology) would hide a
        # stream that does not see the new branch by itself within the scan's wait.
        with running_pipeline(spark, path, root / "checkpoints", poll=0.3, stall_after=0):
            client.create_index(KEYSPACE, NAME, ["n"], partition_by=["META().id"], num_partition=3)
            client.wait_for_index(KEYSPACE, NAME, timeout=240)
            yield Env(path, client)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_request_plus_after_a_failover_without_writes(env: Env) -> None:
    """node3 is failed over while it runs (as a starved node that missed its heartbeats
    is): its copies still say active on the old branch. The stream must see the promoted
    copies' new uuids and the slices take them, with no change to apply."""
    c = env.client
    got = [r["docid"] for r in c.scan(KEYSPACE, NAME, consistency="request_plus", timeout=WAIT)]
    assert sorted(got) == sorted(f"d{i}" for i in range(DOCS))
    before = c.high_seqnos(KEYSPACE)
    victim = "node3"
    owned = set(next(k for k in c.list_keyspaces() if k.name == KEYSPACE).partitions_of(victim))
    assert owned, f"{victim} holds no active copy to fail over"
    c.failover(victim)
    after = c.high_seqnos(KEYSPACE)
    moved = {p for p in after if after[p].uuid != before[p].uuid}
    assert moved == owned
    assert all(after[p].seqno == before[p].seqno for p in after)  # no write since
    got = [r["docid"] for r in c.scan(KEYSPACE, NAME, consistency="request_plus", timeout=WAIT)]
    assert sorted(got) == sorted(f"d{i}" for i in range(DOCS))
