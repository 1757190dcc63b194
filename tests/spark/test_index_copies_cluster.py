"""Index copies restored and drained on a real cluster with the Spark pipeline: node1 and
node2 (every service) and two index-only nodes, node3 and node4. An index with
``num_replica`` 1 keeps two copies of each of its 4 partitions over the four indexers.

1. node4 is killed with SIGKILL; writes go on until its copies have left the index topology
   (the timekeeper drops a copy that missed a published round); ``rebalance`` then adds one
   copy of every partition that lost one, on the live indexers, from the surviving copy.
2. ``rebalance --eject node3`` moves node3's copies (primaries and replicas) to the indexers
   that hold no copy of the partition, then removes node3 from the cluster.

After each step every partition has two copies on distinct live nodes, every copy (not only
the one scans happen to read) holds exactly the oracle's entries at a published stability
TS, and request_plus scans equal the oracle. Slow: a 4-node cluster, an initial build and
index moves on a loaded 2-core box."""

from __future__ import annotations

import os
import random
import signal
from typing import TYPE_CHECKING, Any

import pytest
from cluster_helpers import run_cli, wait_for
from data_helpers import running_cluster
from pipeline_helpers import documents_at, mutate, running_pipeline, slice_entries, wait_stable

from shardex.client import Client, connect_local
from shardex.core.keycodec import decode_entry
from shardex.core.topology import Topology
from shardex.index.oracle import check_index, expected_entries
from shardex.meta.index_state import IndexRecord, find_index, latest_index_topology
from shardex.pipeline.indexers import index_state
from shardex.runtime.pidfile import pid_alive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "copies"
INDEX = "by_age"
PARTS = 4
WAIT = 240.0


def _index(client: Client) -> tuple[IndexRecord, Topology]:
    state = index_state(client)
    rec = find_index(state.indexes, KEYSPACE, INDEX)
    assert rec is not None
    topo = latest_index_topology(state.index_topologies, rec.id)
    assert topo is not None
    return rec, topo


def _check_every_copy(client: Client) -> Topology:
    """Writes stopped: wait for the index to publish the keyspace's high seqnos, then check
    each rank of copies (every primary, then every replica) against the oracle there, and
    a request_plus scan too. Returns the topology checked."""
    ts = wait_stable(client, KEYSPACE, [INDEX], timeout=WAIT)
    rec, topo = _index(client)
    docs = documents_at(client, KEYSPACE, ts)
    for rank in range(2):
        by_slice = {
            p: slice_entries(client, rec.id, p, topo.chain(p)[rank], ts) for p in range(PARTS)
        }
        check_index(rec.definition, by_slice, docs, context=f"copy rank {rank} at {ts!r}")
    got = client.scan(KEYSPACE, INDEX, consistency="request_plus", timeout=WAIT)
    entries = sorted(e for _, e in expected_entries(rec.definition, docs))
    want = [decode_entry(e, rec.definition.desc) for e in entries]
    assert [(r["key"], r["docid"]) for r in got] == [tuple(w) for w in want]
    return topo


def _two_copies_on(topo: Topology, nodes: set[str]) -> None:
    for p in range(PARTS):
        chain = topo.chain(p)
        assert len(chain) == 2 and len(set(chain)) == 2 and set(chain) <= nodes, (p, chain)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_rebalance_rebuilds_lost_index_copies_and_eject_moves_them_off(
    spark: SparkSession, tmp_path: Any
) -> None:
    path = tmp_path / "cluster"
    rng = random.Random(11)
    with running_cluster(path, nodes=2) as cluster, connect_local(path, as_node=True) as client:
        for _ in (3, 4):
            run_cli("cluster", "add-node", "--dir", str(path), "--services", "index")
        client.create_keyspace(KEYSPACE, num_partitions=8, num_replicas=0)
        mutate(client, KEYSPACE, rng, 400)
        ix = client.execute_ddl(
            f"CREATE INDEX {INDEX} ON {KEYSPACE}(age, name) PARTITION BY HASH(META().id) "
            f'WITH {{"num_partition": {PARTS}, "num_replica": 1}}'
        )
        assert isinstance(ix, dict) and ix["nodes"] == ["node1", "node2", "node3", "node4"]
        with running_pipeline(spark, path, tmp_path / "ckpt", poll=0.3):
            client.wait_for_index(KEYSPACE, INDEX, timeout=WAIT)
            before = _check_every_copy(client)
            _two_copies_on(before, {"node1", "node2", "node3", "node4"})
            lost = before.copies_of("node4")
            assert lost

            # 1. node4 dies for good: its copies leave the topology, a rebalance rebuilds them.
            pid = cluster.pid(4)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not pid_alive(pid), 10, 0.05, "node4 to die")

            def copies_dropped() -> bool:
                mutate(client, KEYSPACE, rng, 10)  # rounds publish without node4
                return "node4" not in _index(client)[1].copy_nodes()

            wait_for(copies_dropped, WAIT, 0.5, "node4's copies to leave the topology")

            def node4_down() -> bool:  # else the rebalance may still pick it as a target
                states = {m.name: m.state for m in client.cluster_status().members}
                return states["node4"] == "down"

            wait_for(node4_down, 60, 0.2, "node4 marked down")
            short = _index(client)[1]
            assert sorted(p for p in range(PARTS) if len(short.chain(p)) == 1) == lost
            result = client.rebalance()
            adds = [m for m in result.moves if m.index == INDEX]
            assert result.state == "done", result
            assert sorted(m.partition for m in adds) == lost
            assert all(m.kind == "add" and m.status == "done" for m in adds), adds
            assert all(m.source in short.chain(m.partition) for m in adds)
            mutate(client, KEYSPACE, rng, 100)
            restored = _check_every_copy(client)
            _two_copies_on(restored, {"node1", "node2", "node3"})
            for p in range(PARTS):  # the surviving copies stayed where they were
                assert set(short.chain(p)) <= set(restored.chain(p))

            # 2. Eject node3, an index holder: its copies move first, then it leaves.
            held = restored.copies_of("node3")
            assert held
            result = client.rebalance(eject=["node3"])
            assert result.state == "done" and result.kind == "eject", result
            assert result.message == "removed node3 from the cluster"
            moved = [m for m in result.moves if m.index == INDEX]
            assert sorted(m.partition for m in moved) == held
            assert all(m.kind == "move" and m.source == "node3" for m in moved), moved
            mutate(client, KEYSPACE, rng, 100)
            drained = _check_every_copy(client)
            _two_copies_on(drained, {"node1", "node2"})
            members = {m.name for m in client.cluster_status().members}
            assert "node3" not in members
