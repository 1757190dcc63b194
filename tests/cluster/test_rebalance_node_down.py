"""Rebalance with a node down, in real node processes: 3 data nodes, a keyspace with one
replica under writers at durability majority; one node is killed with ``kill -9`` and failed
over, which leaves every chain it was part of one copy short (majority writes there are
refused as impossible). ``rebalance`` while it is still down rebuilds every partition's chain
as two copies on the two live nodes, majority writes are acknowledged again, and no
acknowledged write is lost: every key reads its last acknowledged value on both copies."""

from __future__ import annotations

import msgspec
import pytest
from cluster_helpers import LocalCluster, wait_for
from data_helpers import FAST_FAILOVER, Writers, chains_full, kill9, running_cluster

from shardex.api.data import Get, GetReply
from shardex.client import Client, KeyspaceDescription, connect_local
from shardex.runtime.pidfile import pid_alive

pytestmark = pytest.mark.cluster

KS = "down"
NP = 16
VICTIM = 3  # node1 founded the cluster and answers the admin client


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("rebalance-down"), extra=FAST_FAILOVER) as c:
        yield c


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rebalance_with_a_node_down_restores_chains_on_the_live_nodes(
    cluster: LocalCluster,
) -> None:
    victim = f"node{VICTIM}"
    live = {"node1", "node2"}
    with connect_local(cluster.path, name="admin", request_timeout=30) as admin:
        desc = admin.create_keyspace(KS, NP, num_replicas=1)
        assert desc.num_replicas == 1 and desc.min_replicas == 1
        held = {p for p in range(NP) if victim in (desc.assignment[p], *desc.replicas[p])}
        assert held, f"{victim} holds no copy of {KS}"
        with Writers(cluster, KS) as writers:
            wait_for(lambda: writers.acks > 100, 30, what="writers under way")
            kill9(cluster, VICTIM)
            wait_for(lambda: victim in admin.failed_over(), 30, what=f"{victim} failed over")
            short = next(k for k in admin.list_keyspaces() if k.name == KS)
            assert short.min_replicas == 0  # the chains the victim was in lost a copy
            writers.check(admin)
            result = admin.rebalance()
            assert result.state == "done", result.message
            wait_for(lambda: chains_full(admin, KS), 60, what="chains restored")
            pid = cluster.pid(VICTIM)
            assert pid is not None and not pid_alive(pid)  # it ran with the node down
            assert victim in admin.failed_over()
            after = next(k for k in admin.list_keyspaces() if k.name == KS)
            for p in range(NP):
                copies = [after.assignment[p], *after.replicas[p]]
                assert sorted(copies) == sorted(live), f"partition {p}: {copies}"
            # With the chains whole again, majority writes are acknowledged again.
            floor = writers.acks + 100
            wait_for(lambda: writers.acks > floor, 60, what="majority writes after rebalance")
        writers.check(admin)
        wait_for(lambda: copies_agree(admin, after, writers), 30, what="copies agree")
        print(
            f"\nrebalance with {victim} down: {len(held)} chains rebuilt on {sorted(live)}, "
            f"{writers.acks} majority writes acknowledged, errors {writers.errors}"
        )


def copies_agree(client: Client, desc: KeyspaceDescription, writers: Writers) -> bool:
    """Every key with an acknowledged write reads the same value from its active and from
    its replica copy."""
    ks = client.keyspace(KS)
    with writers.lock:
        keys = [k for k, h in writers.keys.items() if h.acked]
    for key in keys:
        p = ks.partition_of(key)
        values = []
        for node in (desc.assignment[p], *desc.replicas[p]):
            msg = Get(keyspace=KS, docid=key, replica=node != desc.assignment[p])
            got = client.rpc.run(client.rpc.router.to_node(node, msg, GetReply))
            values.append(msgspec.json.decode(got.body))
        if any(v != values[0] for v in values):
            return False
    return True
