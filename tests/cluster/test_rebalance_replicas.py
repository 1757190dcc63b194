"""A rebalance onto a joined node moves replicas as well as actives, in real node
processes: 3 data nodes, a keyspace with one replica per partition, writers at durability
``majority``; a 4th node joins (``cluster add-node``) and ``rebalance`` runs under the
writes. Afterwards the 4th node holds actives and replicas (each node within one of the
others for both), every chain is two copies on distinct nodes, its replica copies hold
the acknowledged writes, no acknowledged write is lost, no majority write was refused as
DURABILITY_IMPOSSIBLE meanwhile, and no topology the rebalance published ever had a chain
shorter than two copies (new replicas join, catch up, then the old ones leave)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import msgspec
import pytest
from cluster_helpers import run_cli, wait_for
from data_helpers import Writers, running_cluster

from shardex.api.data import Get, GetReply
from shardex.client import Client, connect_local
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError

pytestmark = pytest.mark.cluster

KS = "spread"
NP = 16
NODES = ["node1", "node2", "node3", "node4"]


@pytest.mark.timeout(600)
def test_a_joined_node_gets_actives_and_replicas_under_majority_writes(tmp_path: Path) -> None:
    with (
        running_cluster(tmp_path / "spread", nodes=3) as cluster,
        connect_local(cluster.path, name="admin", request_timeout=30) as admin,
    ):
        desc = admin.create_keyspace(KS, NP, num_replicas=1)
        assert desc.num_replicas == 1
        before = latest(admin)
        with Writers(cluster, KS) as writers:
            wait_for(lambda: writers.acks > 100, 60, what="writers under way")
            run_cli("cluster", "add-node", "--dir", str(cluster.path), "--services", "data")
            result = admin.rebalance()
            floor = writers.acks + 100
            wait_for(lambda: writers.acks > floor, 60, what="majority writes after rebalance")
        assert result.state == "done", result.message
        assert "replica cop(ies) built" in result.message, result.message
        impossible = writers.errors.get(ErrorCode.DURABILITY_IMPOSSIBLE.value, 0)
        print(
            f"\nrebalance onto node4: {len(result.moved)} active moves in "
            f"{result.duration:.2f}s; {writers.acks} majority writes acknowledged, "
            f"errors {writers.errors}"
        )
        assert impossible == 0, writers.errors
        writers.check(admin)

        state = admin.rpc.run(admin.rpc.router.refresh())
        history = state.data_topologies[KS]
        after = history[-1]
        actives = Counter(after.assignment.values())
        replicas = Counter(n for r in after.replicas.values() for n in r)
        assert actives["node4"] > 0 and replicas["node4"] > 0, (actives, replicas)
        for load in (actives, replicas):
            assert max(load[n] for n in NODES) - min(load[n] for n in NODES) <= 1, load
        for p in range(NP):
            chain = after.chain(p)
            assert len(chain) == 2 and len(set(chain)) == 2, (p, chain)
        # never a chain shorter than two copies, in any topology since the one before
        for t in history:
            if t.seq_num >= before.seq_num:
                assert all(len(t.chain(p)) >= 2 for p in range(NP)), t
        # no active moved onto a node that held a replica of its partition
        for m in result.moved:
            assert m.target not in before.chain(m.partition), m
        wait_for(
            lambda: replicas_hold_acked(admin, after, writers), 30, what="node4's replicas hold"
        )


def latest(client: Client) -> Topology:
    state = client.rpc.run(client.rpc.router.refresh())
    return state.data_topologies[KS][-1]


def replicas_hold_acked(client: Client, topo: Topology, writers: Writers) -> bool:
    """Every key with an acknowledged write whose partition node4 holds a replica of reads,
    from that replica copy, its last acknowledged value or a later one."""
    ks = client.keyspace(KS)
    with writers.lock:
        acked = {k: h.acked for k, h in writers.keys.items() if h.acked}
    for key, v in acked.items():
        p = ks.partition_of(key)
        if "node4" not in topo.replicas.get(p, []):
            continue
        msg = Get(keyspace=KS, docid=key, replica=True)
        try:
            got = client.rpc.run(client.rpc.router.to_node("node4", msg, GetReply))
        except ShardexError:
            return False
        if msgspec.json.decode(got.body)["v"] < v:
            return False
    return True
