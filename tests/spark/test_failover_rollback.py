"""A failed-over node returning with writes the cluster never acknowledged at majority: they
are rolled back (delta recovery) or dropped (full recovery), and none of them is visible
anywhere afterwards: not in a document read on any copy, not in the change stream from seqno
0, not in the index (a request_plus scan equals the oracle built from the acknowledged
writes, and every slice equals the documents at its stability TS).

How the unreplicated writes are made: the replica of a partition is paused (SIGSTOP), writes
to that partition are acknowledged by its active at ``persist_active`` (on the active's disk,
no copy waited for, so the old active certainly holds them when it returns), then the active
is killed (kill -9) and the replica resumed: it holds at most the one ``ReplicaApply`` that was
in flight when it paused. Automatic failover promotes it; what it does not hold is the set of
writes only the old active has (a suffix of them, in seqno order). The old active restarts,
is recovered and rebalanced back in while the pipeline runs; one cycle with delta recovery
(it keeps its copies, rolled back to the branch point) and one with full recovery."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
from cluster_helpers import LocalCluster, wait_for
from data_helpers import FAST_FAILOVER, chains_full, kill9, read_partition, running_cluster
from pipeline_helpers import check_oracle, running_pipeline, wait_stable

from shardex.api.data import Get, GetReply
from shardex.client import Client, KeyspaceDescription, connect_local
from shardex.errors import ErrorCode, ShardexError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "rbk"
NAME = "by_name"
NP = 16
NAMES = ("ann", "bob", "cy", "dee", "eve")
Doc = dict[str, Any]


@dataclass
class Env:
    path: Path
    cluster: LocalCluster
    client: Client
    oracle: dict[str, Doc] = field(default_factory=dict)  # acknowledged state of every docid
    lost: set[str] = field(default_factory=set)  # docids only a lost write ever created

    def write(self, n: int, prefix: str) -> None:
        """``n`` new documents at durability majority (acknowledged: in the oracle)."""
        ks = self.client.keyspace(KEYSPACE)
        for i in range(n):
            doc = {"name": NAMES[i % len(NAMES)], "v": i}
            ks.upsert(f"{prefix}{i}", doc, durability="majority")
            self.oracle[f"{prefix}{i}"] = doc


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("failover-rollback")
    path = root / "cluster"
    with (
        running_cluster(path, nodes=3, extra=FAST_FAILOVER) as cluster,
        connect_local(path, request_timeout=30, as_node=True) as client,
    ):
        client.create_keyspace(KEYSPACE, num_partitions=NP, num_replicas=1)
        e = Env(path, cluster, client)
        e.write(200, "d")
        with running_pipeline(spark, path, root / "checkpoints", poll=0.3):
            client.create_index(
                KEYSPACE, NAME, ["name", "v"], partition_by=["META().id"], num_partition=2
            )
            client.wait_for_index(KEYSPACE, NAME, timeout=240)
            yield e


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_unacknowledged_writes_of_a_returning_node_are_rolled_back(env: Env) -> None:
    for kind in ("delta", "full"):
        rollback_cycle(env, kind)


def describe(client: Client) -> KeyspaceDescription:
    return next(k for k in client.list_keyspaces() if k.name == KEYSPACE)


def rollback_cycle(env: Env, kind: str) -> None:
    client = env.client
    ks = client.keyspace(KEYSPACE)
    desc = describe(client)
    # Neither copy on node1: it founded the cluster and answers the test's client.
    p = next((q for q in range(NP) if "node1" not in (desc.assignment[q], *desc.replicas[q])), None)
    assert p is not None, f"every partition has a copy on node1: {desc.replicas}"
    active, replica = desc.assignment[p], desc.replicas[p][0]
    in_p = sorted(d for d in env.oracle if ks.partition_of(d) == p)
    assert len(in_p) >= 3, f"partition {p} holds too few documents: {in_p}"
    new = [d for d in (f"lost-{kind}-{i}" for i in range(5000)) if ks.partition_of(d) == p][:5]
    # New documents, updates of acknowledged ones and a delete (None), in one seqno order.
    order = [new[0], new[1], in_p[0], new[2], in_p[1], new[3], in_p[2], new[4]]
    ops: list[tuple[str, Doc | None]] = [
        (d, None if d == in_p[2] else {"name": "zed", "v": -1 - i, "lost": kind})
        for i, d in enumerate(order)
    ]
    wait_stable(client, KEYSPACE, [NAME], timeout=360)  # the index is level before the kill
    rpid = env.cluster.pid(int(replica.removeprefix("node")))
    assert rpid is not None
    os.kill(rpid, signal.SIGSTOP)
    try:
        for docid, doc in ops:
            if doc is None:
                ks.delete(docid, durability="persist_active")
            else:
                ks.upsert(docid, doc, durability="persist_active")
        kill9(env.cluster, int(active.removeprefix("node")))
    finally:
        os.kill(rpid, signal.SIGCONT)
    wait_for(lambda: active in client.failed_over(), 30, what=f"{active} failed over")
    reached = [_holds(ks, docid, doc) for docid, doc in ops]
    kept = reached.count(True)
    assert reached == [True] * kept + [False] * (len(ops) - kept), reached
    assert kept < len(ops), "the paused replica cannot have received every write"
    lost = ops[kept:]
    for docid, doc in ops[:kept]:  # the promoted copy holds these: they are history now
        if doc is None:
            env.oracle.pop(docid)
        else:
            env.oracle[docid] = doc
    env.lost |= {d for d, _ in lost if d not in env.oracle}
    # The old active returns with the lost writes on its disk.
    env.cluster.start()
    client.recover(active, kind)
    client.rebalance()
    wait_for(lambda: chains_full(client, KEYSPACE), 60, what="chains restored")
    env.write(20, f"after-{kind}-")
    after = describe(client)
    wait_for(lambda: copies_equal_oracle(client, after, env), 120, what="every copy = oracle")
    _markers, changes = read_partition(ks, p)
    assert [c.seqno for c in changes] == sorted({c.seqno for c in changes})
    lost_bodies = [doc for _, doc in lost if doc is not None]
    seen = [c for c in changes if c.body is not None and msgspec.json.decode(c.body) in lost_bodies]
    assert not seen, f"lost writes in the change stream of partition {p}: {seen}"
    state: dict[str, Doc] = {}
    for c in changes:
        if c.deleted:
            state.pop(c.docid, None)
        else:
            state[c.docid] = msgspec.json.decode(c.body)
    assert state == {d: v for d, v in env.oracle.items() if ks.partition_of(d) == p}
    ts = wait_stable(client, KEYSPACE, [NAME], timeout=360)
    entries = check_oracle(client, KEYSPACE, NAME, ts)
    rows = client.scan(KEYSPACE, NAME, consistency="request_plus", timeout=120)
    got = sorted((tuple(r["key"]), r["docid"]) for r in rows)
    assert got == sorted(((d["name"], d["v"]), docid) for docid, d in env.oracle.items())
    print(
        f"\n{kind} recovery of {active}: {len(lost)} of {len(ops)} writes only it held were "
        f"rolled back; {entries} index entries equal to the oracle at {ts!r}"
    )


def _holds(ks: Any, docid: str, doc: Doc | None) -> bool:
    """Whether the keyspace (its active) shows the write ``docid`` := ``doc`` (None: a
    delete); retried while the promoted copy is not reachable yet."""

    def read() -> tuple[Doc | None] | None:
        try:
            return (ks.get(docid),)
        except ShardexError as exc:
            if exc.code is ErrorCode.DOC_NOT_FOUND:
                return (None,)
            return None  # the route to the new active settling: ask again

    got, _ = wait_for(read, 30, what=f"a read of {docid}")
    return bool(got[0] == doc)


def copies_equal_oracle(client: Client, desc: KeyspaceDescription, env: Env) -> bool:
    """Every copy of every partition answers each docid as the oracle says; a copy still
    being built may miss documents (False: poll again), but a lost write is never read."""
    ks = client.keyspace(KEYSPACE)
    for docid in sorted(set(env.oracle) | env.lost):
        p = ks.partition_of(docid)
        for node in (desc.assignment[p], *desc.replicas[p]):
            msg = Get(keyspace=KEYSPACE, docid=docid, replica=node != desc.assignment[p])
            try:
                got = client.rpc.run(client.rpc.router.to_node(node, msg, GetReply))
            except ShardexError as exc:
                if exc.code is not ErrorCode.DOC_NOT_FOUND:
                    return False
                if docid in env.oracle:
                    return False
                continue
            body = msgspec.json.decode(got.body)
            assert "lost" not in body or body == env.oracle.get(docid), (
                f"{docid} on {node}: a write the cluster never kept: {body}"
            )
            if body != env.oracle.get(docid):
                return False
    return True
