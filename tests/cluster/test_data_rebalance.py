"""Online partition migration on a real cluster: 2 nodes, a keyspace with documents, a third
node added with ``shardex cluster add-node``, then ``rebalance`` under a concurrent write load
(durable upserts and deletes from several client threads, every ack recorded) while a change
stream consumer follows a moving partition. Afterwards nothing acknowledged is lost or
doubled, every partition's change stream is gap-free and holds each acked mutation once, the
follower saw every mutation once in order, and the topology history holds every topology.
Then a migration whose target is killed (-9) mid-copy leaves the partition at its source,
serving, and the restarted target's partial copy is gone."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster, run_cli, wait_for
from data_helpers import NO_AUTO_FAILOVER, docids_in, read_partition, running_cluster

from shardex.api.data import Upsert
from shardex.api.migration import LocalPartitions, LocalPartitionsReply
from shardex.client import Change, Client, MutationResult, connect_local
from shardex.core.topology import rebalance_moves
from shardex.errors import ErrorCode, ShardexError
from shardex.net import TcpTransport
from shardex.net import connect as rpc_connect
from shardex.net.messages import Message
from shardex.runtime.pidfile import pid_alive

pytestmark = pytest.mark.cluster

KS = "moving"
NP = 16
PRELOAD = 3000
WRITERS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("rebalance")
    with running_cluster(path, nodes=2, extra=NO_AUTO_FAILOVER) as c:
        yield c


def raw_request(cluster: LocalCluster, node: int, msg: Message) -> Message:
    async def go() -> Message:
        conn = await rpc_connect(TcpTransport(), cluster.address(node), cluster.secret(), name="t")
        try:
            return await conn.request(msg, 10.0)
        finally:
            await conn.close()

    return asyncio.run(go())


def history(client: Client, keyspace: str) -> list[Any]:
    state = client.rpc.run(client.rpc.router.refresh())
    return state.data_topologies[keyspace]


class Follower(threading.Thread):
    """Follows one partition's change stream live, reopening from its last (seqno, uuid)
    whenever the stream ends with NOT_MY_PARTITION or a closed connection (a migration)."""

    def __init__(self, cluster: LocalCluster, partition: int) -> None:
        super().__init__(daemon=True)
        self.client = connect_local(cluster.path, name="follower")
        self.partition = partition
        self.seqnos: list[int] = []
        self.reopens: list[str] = []
        self.until: int | None = None  # stop once this seqno is seen
        self.error: BaseException | None = None

    def run(self) -> None:
        ks = self.client.keyspace(KS)
        pos, uuid = 0, 0
        try:
            while self.until is None or pos < self.until:
                try:
                    with ks.stream(self.partition, pos, uuid or None, follow=True) as stream:
                        while self.until is None or pos < self.until:
                            item = stream.next(timeout=0.2)
                            if item is None:
                                if stream.done:
                                    break
                                continue
                            if isinstance(item, Change):
                                self.seqnos.append(item.seqno)
                            pos, uuid = stream.position
                except ShardexError as e:
                    if e.code not in (ErrorCode.NOT_MY_PARTITION, ErrorCode.CONNECTION_CLOSED):
                        raise
                    self.reopens.append(f"{e.code.value}: {e.details.get('state')}")
                    time.sleep(0.05)
        except BaseException as e:
            self.error = e
        finally:
            self.client.close()


def test_rebalance_2_to_3_under_write_load(cluster: LocalCluster) -> None:
    admin = connect_local(cluster.path, name="admin")
    admin.create_keyspace(KS, NP)
    ks = admin.keyspace(KS)
    preload = ks.upsert_many((f"pre{i}", {"i": i, "pad": "p" * 300}) for i in range(PRELOAD))
    assert all(isinstance(r, MutationResult) for r in preload)
    before = history(admin, KS)
    assert [t.seq_num for t in before] == [1]
    run_cli("cluster", "add-node", "--dir", str(cluster.path))
    expected_moves = rebalance_moves(before[-1].assignment, ["node1", "node2", "node3"])
    followed = min(expected_moves)
    follower = Follower(cluster, followed)
    follower.start()

    acked: list[tuple[str, str, MutationResult, dict[str, Any] | None]] = []
    errors: list[tuple[str, ShardexError]] = []
    slowest = [0.0]  # client-observed: the worst write latency (a hand-over's pause + retries)
    lock = threading.Lock()
    stop = threading.Event()
    clients = [connect_local(cluster.path, name=f"w{k}", request_timeout=10) for k in (0, 1)]

    def writer(t: int) -> None:
        wks = clients[t % 2].keyspace(KS)
        live: list[str] = []
        i = 0
        while not stop.is_set():
            i += 1
            t0 = time.monotonic()
            try:
                if i % 5 == 0 and live:
                    docid = live.pop(0)
                    r = wks.delete(docid)
                    with lock:
                        acked.append((docid, "delete", r, None))
                else:
                    docid = f"w{t}-{i % 300}"
                    doc = {"t": t, "i": i}
                    r = wks.upsert(docid, doc)
                    with lock:
                        acked.append((docid, "upsert", r, doc))
                    if docid not in live:
                        live.append(docid)
            except ShardexError as e:
                with lock:
                    errors.append((docid, e))
            slowest[0] = max(slowest[0], time.monotonic() - t0)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(WRITERS)]
    for th in threads:
        th.start()
    try:
        time.sleep(0.5)
        started = time.monotonic()
        result = admin.rebalance()
        took = time.monotonic() - started
        time.sleep(0.5)  # writes go on at the new owners
    finally:
        stop.set()
        for th in threads:
            th.join(30)
    for c in clients:
        c.close()

    # Balanced over 3 nodes, one topology per move appended to the history.
    assert result.state == "done" and len(result.moved) == len(expected_moves) > 0
    assert {m.partition: m.target for m in result.moved} == expected_moves
    after = history(admin, KS)
    # one topology per move, and those that steer the replica chains (added, then trimmed)
    assert [t.seq_num for t in after] == list(range(1, len(after) + 1))
    assert after[0] == before[0]
    counts = [len(after[-1].partitions_of(n)) for n in ("node1", "node2", "node3")]
    assert max(counts) - min(counts) <= 1, counts
    moved_in = [t.seq_num for t in after[1:] if t.assignment != after[t.seq_num - 2].assignment]
    assert sorted(m.topology_seq for m in result.moved) == moved_in
    pauses = sorted(m.pause_ms for m in result.moved)
    copy_mb = sum(m.bytes for m in result.moved) / 1e6
    print(
        f"\nrebalance: {len(result.moved)} moves in {took:.2f}s, {copy_mb:.2f} MB, "
        f"{result.docs} docs; copy {copy_mb / sum(m.copy_seconds for m in result.moved):.1f}"
        f" MB/s; pause ms {pauses}; acked writes {len(acked)}, slowest "
        f"{slowest[0] * 1000:.0f} ms; follower reopened {follower.reopens}"
    )
    assert not errors, errors[:5]  # clients rode out every hand-over by retrying
    assert len(acked) > 200

    # Every acknowledged write is there: the last ack per docid is the document's state.
    last: dict[str, tuple[str, MutationResult, dict[str, Any] | None]] = {}
    for docid, op, r, doc in acked:
        if docid not in last or last[docid][1].seqno < r.seqno:
            last[docid] = (op, r, doc)
    for docid, (op, r, doc) in last.items():
        if op == "upsert":
            v = ks.get_versioned(docid)
            assert (v.doc, v.seqno, v.cas) == (doc, r.seqno, r.cas), docid
        else:
            with pytest.raises(ShardexError) as info:
                ks.get(docid)
            assert info.value.code == ErrorCode.DOC_NOT_FOUND
    for i in (0, PRELOAD // 2, PRELOAD - 1):
        assert ks.get(f"pre{i}")["i"] == i

    # Every partition's stream from 0: gap-free seqnos, one history (uuid), each ack once.
    ts = admin.high_seqnos(KS)
    by_partition: dict[int, dict[int, Change]] = {}
    for p in range(NP):
        markers, changes = read_partition(ks, p)
        seqnos = [c.seqno for c in changes]
        assert seqnos == list(range(1, ts[p].seqno + 1)), f"partition {p}"
        assert {m.uuid for m in markers} == {ts[p].uuid}
        by_partition[p] = {c.seqno: c for c in changes}
    for docid, op, r, _doc in acked + [
        (f"pre{i}", "upsert", r, None) for i, r in enumerate(preload)
    ]:
        ch = by_partition[r.partition][r.seqno]
        assert (ch.docid, ch.op, ch.cas) == (docid, op, r.cas)
        assert r.uuid == ts[r.partition].uuid

    # The follower crossed the migration of its partition and saw each mutation once.
    follower.until = ts[followed].seqno
    follower.join(20)
    assert follower.error is None, follower.error
    assert follower.seqnos == list(range(1, ts[followed].seqno + 1))
    assert follower.reopens, "the followed partition's stream never ended at the old owner"

    # A late writer with a stale topology: NOT_MY_PARTITION naming the new owner.
    moved_p = followed
    docid = docids_in(moved_p, NP, 1, "late")[0]
    source = before[-1].assignment[moved_p]
    with pytest.raises(ShardexError) as info:
        raw_request(cluster, int(source[4:]), Upsert(keyspace=KS, docid=docid, doc=b"{}"))
    assert info.value.code == ErrorCode.NOT_MY_PARTITION
    assert info.value.details["owner_hint"] == "node3"
    admin.close()


def local(cluster: LocalCluster, node: int) -> LocalPartitionsReply:
    reply = raw_request(cluster, node, LocalPartitions(keyspace=KS))
    assert isinstance(reply, LocalPartitionsReply)
    return reply


def test_target_killed_mid_copy_leaves_partition_at_source(cluster: LocalCluster) -> None:
    admin = connect_local(cluster.path, name="admin2")
    topo = history(admin, KS)[-1]
    p = min(topo.partitions_of("node1"))
    ks = admin.keyspace(KS)
    big = docids_in(p, NP, 600, "big")
    ks.upsert_many((d, {"pad": "b" * 4000}) for d in big)  # ~2.4 MB in partition p
    # 1 MB/s: the copy takes a few seconds, long enough to kill the target in the middle.
    admin.move_partition(KS, p, "node3", rate_limit=1_000_000, wait=False)
    wait_for(
        lambda: (s := admin.rebalance_status()) and s.moves[0].phase == "copying",
        10,
        0.02,
        "copy started",
    )
    time.sleep(0.6)
    assert admin.rebalance_status().moves[0].phase == "copying"
    incoming = local(cluster, 3).incoming
    assert [m.partition for m in incoming] == [p]  # the target holds a partial copy
    pid = cluster.pid(3)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 5, what="node3 gone")
    status, _ = wait_for(
        lambda: (s := admin.rebalance_status()) and s.state != "running" and s,
        20,
        0.1,
        "move over",
    )
    assert status.moves[0].status == "failed", status
    # The partition never left node1 and serves reads and writes there (its chain may have
    # got a replica first, when node3 held its replica: that one stays).
    assert history(admin, KS)[-1].assignment == topo.assignment
    assert history(admin, KS)[-1].assignment[p] == "node1"
    r = ks.upsert(big[0], {"after": "kill"})
    assert r.partition == p and ks.get(big[0]) == {"after": "kill"}
    assert any(x.partition == p and x.state == "active" for x in local(cluster, 1).partitions)

    # node3 back: its reconcile drops the partial copy (marker and any pending partition).
    cluster.start()

    def clean() -> bool:
        reply = local(cluster, 3)
        return not reply.incoming and all(x.partition != p for x in reply.partitions)

    wait_for(clean, 20, 0.2, "partial copy dropped")
    ingest = Path(cluster.path) / "node3" / "data" / "data-ingest"
    assert not ingest.exists() or not any(ingest.iterdir())
    # And a retried move now succeeds.
    result = admin.move_partition(KS, p, "node3")
    assert result.state == "done" and history(admin, KS)[-1].assignment[p] == "node3"
    assert ks.get(big[0]) == {"after": "kill"} and ks.get(big[-1]) == {"pad": "b" * 4000}
    admin.close()
