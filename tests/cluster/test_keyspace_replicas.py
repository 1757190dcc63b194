"""Changing a keyspace's replica count on a real cluster: ``shardex keyspace set --replicas``
widens every chain at once and the new copies are built from the data already there (every
replica copy ends level with its active, holding every document); majority writes then wait
for the new copies; lowering the count narrows the chains and the nodes drop the copies."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cluster_helpers import LocalCluster, run_cli, wait_for
from data_helpers import running_cluster

from shardex.api.data import Get, GetReply
from shardex.api.migration import LocalPartitions, LocalPartitionsReply
from shardex.api.records import STATE_REPLICA
from shardex.client import connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.partitioning import partition_of
from shardex.net import TcpTransport
from shardex.net import connect as rpc_connect
from shardex.net.messages import Message

pytestmark = pytest.mark.cluster

KS = "grow"
NP = 8
DOCS = 200


def request(cluster: LocalCluster, node: str, msg: Message) -> Message:
    async def go() -> Message:
        address = cluster.address(int(node.removeprefix("node")))
        conn = await rpc_connect(TcpTransport(), address, cluster.secret(), name="t")
        try:
            return await conn.request(msg, 10.0)
        finally:
            await conn.close()

    return asyncio.run(go())


def copies_on(cluster: LocalCluster, node: str) -> dict[int, tuple[str, int]]:
    reply = request(cluster, node, LocalPartitions(keyspace=KS))
    assert isinstance(reply, LocalPartitionsReply)
    return {i.partition: (i.state, i.high_seqno) for i in reply.partitions}


def test_raising_and_lowering_the_replica_count(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "c") as cluster, connect_local(cluster.path) as admin:
        admin.create_keyspace(KS, NP, num_replicas=0)
        ks = admin.keyspace(KS)
        for i in range(DOCS):
            ks.upsert(f"d{i}", {"i": i})
        with pytest.raises(ShardexError) as err:
            admin.set_keyspace_replicas(KS, 4)
        assert err.value.code is ErrorCode.BAD_REQUEST

        done = run_cli("keyspace", "set", KS, "--replicas", "1", "--dir", str(cluster.path))
        assert "1 replica(s) per partition" in done.stdout
        desc = next(k for k in admin.list_keyspaces() if k.name == KS)
        assert desc.num_replicas == 1 and desc.min_replicas == 1
        for p in range(NP):
            assert len(desc.replicas[p]) == 1 and desc.replicas[p][0] != desc.assignment[p]
        highs = {
            p: copies_on(cluster, desc.assignment[p])[p][1] for p in range(NP)
        }  # nothing writes now: the actives' high seqnos are final

        def level() -> bool:
            for p in range(NP):
                held = copies_on(cluster, desc.replicas[p][0]).get(p)
                if held != (STATE_REPLICA, highs[p]):
                    return False
            return True

        wait_for(level, 60, what="every new replica copy level with its active")
        for i in range(DOCS):  # built from the data that was there before
            d = f"d{i}"
            node = desc.replicas[partition_of(d, NP)][0]
            got = request(cluster, node, Get(keyspace=KS, docid=d, replica=True))
            assert isinstance(got, GetReply) and b'"i":' + str(i).encode() in got.body
        # majority writes count the new chains: acknowledged means on the replica too
        result = ks.upsert("after", {"i": -1}, durability="majority")
        node = desc.replicas[partition_of("after", NP)][0]
        got = request(cluster, node, Get(keyspace=KS, docid="after", replica=True))
        assert isinstance(got, GetReply) and got.seqno == result.seqno

        admin.set_keyspace_replicas(KS, 0)
        desc = next(k for k in admin.list_keyspaces() if k.name == KS)
        assert desc.num_replicas == 0 and not any(desc.replicas.values())

        def dropped() -> bool:
            return all(
                state != STATE_REPLICA
                for n in ("node1", "node2", "node3")
                for state, _high in copies_on(cluster, n).values()
            )

        wait_for(dropped, 30, what="every replica copy dropped")
        assert ks.get("d7") == {"i": 7}
