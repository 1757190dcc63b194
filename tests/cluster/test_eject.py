"""Graceful eject on a real cluster: node1 and node2 (all services) and node3 (data only,
added with ``cluster add-node``), a keyspace with one replica per partition over the three,
writers at durability ``majority`` while ``rebalance(eject=["node3"])`` runs. No write fails
but with a retryable error, every acknowledged write is readable afterwards, node3 holds no
copy and is no longer a member, every chain is one active and one replica on node1/node2,
and no topology of the history ever had a chain shorter than two copies."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster, run_cli, wait_for
from data_helpers import running_cluster

from shardex.api.membership import MembersReply, MembersRequest
from shardex.api.migration import LocalPartitions, LocalPartitionsReply
from shardex.client import MutationResult, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.net import TcpTransport
from shardex.net import connect as rpc_connect
from shardex.net.messages import Message

pytestmark = pytest.mark.cluster

KS = "ejected"
NP = 16
WRITERS = 4
# What a writer may see while partitions change hands: all retryable (a hand-over's freeze
# refusals are retried inside the client; these are what outlives its retry budget).
RETRYABLE = {
    ErrorCode.NODE_UNAVAILABLE,
    ErrorCode.CONNECTION_CLOSED,
    ErrorCode.TIMEOUT,
    ErrorCode.SYNC_WRITE_IN_PROGRESS,
}


def raw_request(cluster: LocalCluster, node: int, msg: Message) -> Message:
    async def go() -> Message:
        conn = await rpc_connect(TcpTransport(), cluster.address(node), cluster.secret(), name="t")
        try:
            return await conn.request(msg, 10.0)
        finally:
            await conn.close()

    return asyncio.run(go())


def test_eject_a_data_node_under_majority_writes(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "eject", nodes=2) as cluster:
        run_cli("cluster", "add-node", "--dir", str(cluster.path), "--services", "data")
        # The CLI refuses two manager nodes at once (voters change one at a time), saying why.
        refused = run_cli(
            "rebalance",
            "--eject",
            "node1",
            "--eject",
            "node2",
            "--dir",
            str(cluster.path),
            check=False,
        )
        assert refused.returncode != 0
        assert "one manager at a time" in " ".join((refused.stdout + refused.stderr).split())
        admin = connect_local(cluster.path, name="admin")
        desc = admin.create_keyspace(KS, NP, num_replicas=1)
        assert set(desc.assignment.values()) == {"node1", "node2", "node3"}
        ks = admin.keyspace(KS)
        for i in range(200):
            ks.upsert(f"pre{i}", {"i": i, "pad": "p" * 200}, durability="majority")

        acked: list[tuple[str, MutationResult, dict[str, Any]]] = []
        errors: list[tuple[str, ShardexError]] = []
        lock = threading.Lock()
        stop = threading.Event()
        clients = [connect_local(cluster.path, name=f"w{k}", request_timeout=10) for k in (0, 1)]

        def writer(t: int) -> None:
            wks = clients[t % 2].keyspace(KS)
            i = 0
            while not stop.is_set():
                i += 1
                docid, doc = f"w{t}-{i % 200}", {"t": t, "i": i}
                try:
                    r = wks.upsert(docid, doc, durability="majority")
                except ShardexError as e:
                    with lock:
                        errors.append((docid, e))
                    continue
                with lock:
                    acked.append((docid, r, doc))

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(WRITERS)]
        for th in threads:
            th.start()
        try:
            wait_for(lambda: len(acked) >= 50, 30, what="writers under way")
            result = admin.rebalance(eject=["node3"])
            floor = len(acked) + 50
            wait_for(lambda: len(acked) >= floor, 30, what="writes going on without node3")
        finally:
            stop.set()
            for th in threads:
                th.join(30)
            for c in clients:
                c.close()

        print(
            f"\neject: {len(result.moved)} moves in {result.duration:.2f}s, pause ms "
            f"{sorted(m.pause_ms for m in result.moved)}; acked {len(acked)}, retryable "
            f"errors {len(errors)}"
        )
        assert result.state == "done" and result.kind == "eject", result
        assert result.message == "removed node3 from the cluster"
        assert {m.source for m in result.moved} == {"node3"} and len(result.moved) == 5
        bad = [(d, e.code) for d, e in errors if e.code not in RETRYABLE]
        assert not bad, bad[:5]
        assert len(acked) > 100

        # Every acknowledged write: the last ack per docid is the document's state.
        last: dict[str, tuple[MutationResult, dict[str, Any]]] = {}
        for docid, r, doc in acked:
            if docid not in last or last[docid][0].seqno < r.seqno:
                last[docid] = (r, doc)
        for docid, (r, doc) in last.items():
            v = ks.get_versioned(docid)
            assert (v.doc, v.seqno, v.cas) == (doc, r.seqno, r.cas), docid
        assert all(ks.get(f"pre{i}")["i"] == i for i in range(0, 200, 7))

        # The chains: one active and one replica, on node1 and node2; and never, in any
        # topology the eject published, a chain shorter than two copies.
        state = admin.rpc.run(admin.rpc.router.refresh())
        history = state.data_topologies[KS]
        latest = history[-1]
        for p in range(NP):
            assert sorted(latest.chain(p)) == ["node1", "node2"], (p, latest.chain(p))
        assert len(latest.partitions_of("node1")) == len(latest.partitions_of("node2"))
        for t in history:
            assert all(len(t.chain(p)) >= 2 for p in range(NP)), t

        # node3 is no member in either manager's view, and holds no copy.
        for node in (1, 2):
            view = raw_request(cluster, node, MembersRequest())
            assert isinstance(view, MembersReply)
            assert [m.name for m in view.members] == ["node1", "node2"]

        def node3_empty() -> bool:
            reply = raw_request(cluster, 3, LocalPartitions(keyspace=KS))
            assert isinstance(reply, LocalPartitionsReply)
            return not reply.partitions

        wait_for(node3_empty, 15, what="node3 dropped its copies")
        # Ejecting it again: it is not a member any more.
        with pytest.raises(ShardexError) as info:
            admin.rebalance(eject=["node3"])
        assert info.value.code is ErrorCode.BAD_REQUEST and "not a cluster member" in str(
            info.value
        )
        admin.close()
