"""Index rebalance end to end: a 3-node cluster and the Spark pipeline (in this process, on
the shared SparkSession) maintain two partitioned indexes while a writer keeps mutating;
a 4th node joins and ``shardex rebalance`` moves data partitions and index partitions to it
online. Afterwards the oracle holds at a published stability TS, request_plus scans see
every acknowledged write, and ``list_indexes`` shows the new placement."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cluster_helpers import run_cli
from data_helpers import running_cluster
from pipeline_helpers import Writer, check_oracle, documents_at, mutate, wait_stable

from shardex.client import Client, connect_local
from shardex.index.oracle import expected_entries
from shardex.manager.index_state import find_index
from shardex.pipeline.driver import PipelineDriver
from shardex.pipeline.indexers import index_state

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "ixreb"
NAMES = ["by_age", "by_city"]
WAIT = 180.0


@dataclass
class Env:
    path: Path
    client: Client


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("ixreb")
    path = root / "cluster"
    with running_cluster(path, nodes=3), connect_local(path) as client:
        client.create_keyspace(KEYSPACE, num_partitions=8)
        mutate(client, KEYSPACE, random.Random(3), 300)
        # by_age: partitioned by docid; by_city: by a key that moves between slices.
        client.create_index(
            KEYSPACE, "by_age", ["age", "name"], partition_by=["META().id"], num_partition=4
        )
        client.create_index(
            KEYSPACE, "by_city", ["city", "age"], partition_by=["city"], num_partition=3
        )
        with connect_local(path) as driver_client:
            driver = PipelineDriver(
                spark, driver_client, {"cluster_dir": str(path)}, root / "ckpt", poll=0.2
            )
            thread = threading.Thread(target=driver.run, name="pipeline-driver", daemon=True)
            thread.start()
            try:
                for name in NAMES:
                    client.wait_for_index(KEYSPACE, name, timeout=240)
                yield Env(path, client)
            finally:
                driver.stop()
                thread.join(timeout=60)


def _scan(client: Client, name: str) -> list[tuple[list, str]]:
    got = client.scan(KEYSPACE, name, consistency="request_plus", timeout=WAIT)
    return [(r["key"], r["docid"]) for r in got]


def _expected(client: Client, name: str) -> list[tuple[list, str]]:
    from shardex.core.keycodec import decode_entry

    rec = find_index(index_state(client).indexes, KEYSPACE, name)
    assert rec is not None
    docs = documents_at(client, KEYSPACE, client.high_seqnos(KEYSPACE))
    entries = sorted(e for _, e in expected_entries(rec.definition, docs))
    return [tuple(decode_entry(e, rec.definition.desc)) for e in entries]  # type: ignore[misc]


@pytest.mark.timeout(900)
def test_rebalance_moves_index_partitions_online(env: Env) -> None:
    c = env.client
    before = {i["name"]: i for i in c.list_indexes(KEYSPACE)}
    assert all(set(i["nodes"]) <= {"node1", "node2", "node3"} for i in before.values())
    run_cli("cluster", "add-node", "--dir", str(env.path))
    with Writer(c, KEYSPACE, seed=5, pause=0.05) as writer:
        proc = run_cli("rebalance", "--dir", str(env.path), "--json", timeout=600)
        result = json.loads(proc.stdout)
    assert writer.done > 0
    index_moves = [m for m in result["moves"] if m["index"]]
    assert result["state"] == "done", result["message"]
    assert index_moves and all(m["status"] == "done" for m in index_moves)
    assert {m["target"] for m in index_moves} == {"node4"}
    assert any(not m["index"] for m in result["moves"])  # data partitions moved too

    # The new placement, one topology per move, slices balanced over the four indexers.
    after = {i["name"]: i for i in c.list_indexes(KEYSPACE, fresh=True)}
    load: dict[str, int] = {}
    for name, item in after.items():
        moved = [m for m in index_moves if m["index"] == name]
        assert item["topology_seq"] == before[name]["topology_seq"] + len(moved)
        for m in moved:
            assert item["partitions"][m["partition"]] == "node4"
        for node in item["partitions"].values():
            load[node] = load.get(node, 0) + 1
    assert set(load) == {"node1", "node2", "node3", "node4"}
    assert max(load.values()) - min(load.values()) <= 1

    # The oracle at a published stability TS (the slices read from the new owners).
    ts = wait_stable(c, KEYSPACE, NAMES)
    for name in NAMES:
        check_oracle(c, KEYSPACE, name, ts)
    # request_plus sees every acknowledged write, also writes made after the moves.
    mutate(c, KEYSPACE, random.Random(11), 120)
    for name in NAMES:
        assert _scan(c, name) == _expected(c, name)
