"""Durability over the wire: kill -9 a data node under a concurrent write load and restart it
with ``shardex cluster start``; every acknowledged write is there exactly once with its seqno,
and a change-stream consumer sees every mutation exactly once, in order, across a restart of
the partition's owner."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from cluster_helpers import LocalCluster, wait_for
from data_helpers import NO_AUTO_FAILOVER, docids_in, read_partition, running_cluster

from shardex.client import Change, MutationResult, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.runtime.pidfile import pid_alive

pytestmark = pytest.mark.cluster

NP = 16
WRITERS = 4  # threads, over two clients


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("data-crash"), extra=NO_AUTO_FAILOVER) as c:
        yield c


def kill9(cluster: LocalCluster, node: int) -> None:
    pid = cluster.pid(node)
    assert pid is not None and pid_alive(pid)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 5, what=f"node{node} gone")


def test_kill9_under_write_load_keeps_every_acknowledged_write(cluster: LocalCluster) -> None:
    with connect_local(cluster.path) as admin:
        desc = admin.create_keyspace("crash", NP)
        before = admin.high_seqnos("crash")
    victim_parts = set(desc.partitions_of("node2"))
    acked: dict[str, MutationResult] = {}
    unknown: dict[str, ErrorCode] = {}  # failed writes: applied or not, both are fine
    lock = threading.Lock()
    stop = threading.Event()
    clients = [connect_local(cluster.path, name=f"writer{k}", request_timeout=5) for k in (0, 1)]

    def writer(t: int) -> None:
        ks = clients[t % 2].keyspace("crash")
        i = 0
        while not stop.is_set():
            docid = f"w{t}-{i}"
            i += 1
            try:
                r = ks.insert(docid, {"t": t, "i": i})
            except ShardexError as e:
                with lock:
                    unknown[docid] = e.code
                continue
            with lock:
                acked[docid] = r

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(WRITERS)]
    try:
        for th in threads:
            th.start()
        time.sleep(1.0)
        with lock:
            acked_before_kill = len(acked)
        kill9(cluster, 2)
        time.sleep(1.0)  # writes to node2's partitions fail now; the others go on
        cluster.start()  # `shardex cluster start --dir`: restarts node2 only
        time.sleep(1.0)
        stop.set()
        for th in threads:
            th.join(30)
    finally:
        stop.set()
        for c in clients:
            c.close()
    assert acked_before_kill > 50
    assert any(r.partition in victim_parts for r in acked.values())
    assert set(unknown.values()) <= {
        ErrorCode.NODE_UNAVAILABLE,
        ErrorCode.CONNECTION_CLOSED,
        ErrorCode.TIMEOUT,
    }, unknown

    with connect_local(cluster.path) as c:
        ks = c.keyspace("crash")
        after = c.high_seqnos("crash")
        seen: dict[str, tuple[int, int, int]] = {}  # docid -> (partition, seqno, cas)
        for p in range(NP):
            # kill -9 of the process, durable writes: the same history branch, no rollback
            assert after[p].uuid == before[p].uuid
            _, changes = read_partition(ks, p)
            seqnos = [ch.seqno for ch in changes]
            assert seqnos == list(range(1, after[p].seqno + 1)), f"partition {p}: gap or repeat"
            for ch in changes:
                assert ch.docid not in seen, f"{ch.docid} is in the streams twice"
                seen[ch.docid] = (p, ch.seqno, ch.cas)
        missing = sorted(d for d in acked if d not in seen)
        assert not missing, f"{len(missing)} acknowledged writes lost: {missing[:5]}"
        for d, r in acked.items():
            assert seen[d] == (r.partition, r.seqno, r.cas), d
        stray = sorted(d for d in seen if d not in acked and d not in unknown)
        assert not stray, f"never written: {stray[:5]}"
        # The documents themselves: all on the killed node's partitions, a sample elsewhere.
        others = [d for d, r in acked.items() if r.partition not in victim_parts]
        check = [d for d, r in acked.items() if r.partition in victim_parts] + others[::10]
        for docid in check:
            r = acked[docid]
            v = ks.get_versioned(docid)
            t, _, i = docid[1:].partition("-")
            assert (v.seqno, v.cas) == (r.seqno, r.cas)
            assert v.doc == {"t": int(t), "i": int(i) + 1}
        assert c.keyspace_stats("crash").total_docs == len(seen)  # inserts only


def test_stream_consumer_across_owner_restart(cluster: LocalCluster) -> None:
    with connect_local(cluster.path) as admin:
        desc = admin.create_keyspace("cdc", 4)
    owner = 3
    p = desc.partitions_of(f"node{owner}")[0]
    ids = docids_in(p, 4, 240, "cdc")
    seen: list[tuple[int, str]] = []
    errors: list[ErrorCode] = []
    stop = threading.Event()

    def consume() -> None:
        pos: tuple[int, int | None] = (0, None)
        with connect_local(cluster.path, name="consumer", request_timeout=5) as c:
            ks = c.keyspace("cdc")
            while not stop.is_set():
                try:
                    with ks.stream(p, pos[0], pos[1], follow=True) as stream:
                        while not stop.is_set():
                            item = stream.next(timeout=0.2)
                            if isinstance(item, Change):
                                seen.append((item.seqno, item.docid))
                            pos = stream.position
                except ShardexError as e:  # the owner died: resume where we were
                    errors.append(e.code)
                    time.sleep(0.1)

    consumer = threading.Thread(target=consume)
    consumer.start()
    acked: list[tuple[int, str]] = []
    try:
        with connect_local(cluster.path, name="cdc-writer") as c:
            ks = c.keyspace("cdc")
            for d in ids[:120]:
                acked.append((ks.upsert(d, {"d": d}).seqno, d))
            kill9(cluster, owner)
            cluster.start()
            for d in ids[120:]:
                acked.append((ks.upsert(d, {"d": d}).seqno, d))
        wait_for(lambda: len(seen) >= len(acked), 20, what="consumer caught up")
    finally:
        stop.set()
        consumer.join(30)
    assert [s for s, _ in acked] == list(range(1, len(ids) + 1))
    assert seen == acked  # every mutation exactly once, in seqno order
    assert ErrorCode.ROLLBACK not in errors  # same branch after a process crash
    assert errors and set(errors) <= {
        ErrorCode.CONNECTION_CLOSED,
        ErrorCode.NODE_UNAVAILABLE,
        ErrorCode.TIMEOUT,
    }, errors


def test_a_majority_write_fails_after_its_own_durability_timeout(cluster: LocalCluster) -> None:
    """A replica paused (SIGSTOP) well under the failure timeout: a majority write to a
    partition it holds a replica of waits the ``durability_timeout`` the writer gave, not the
    node's default, and is ambiguous naming it."""
    with connect_local(cluster.path, name="dtimeout", request_timeout=30) as c:
        desc = c.create_keyspace("dtimeout", NP, num_replicas=1)
        p = next(q for q, n in desc.assignment.items() if desc.replicas[q] == ["node3"])
        d = docids_in(p, NP, 1, "dt")[0]
        ks = c.keyspace("dtimeout")
        wait_for(lambda: _written(ks, d, 1), 30, what="a majority write with the replica up")
        pid = cluster.pid(3)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(ShardexError) as err:
                ks.upsert(d, {"v": 2}, durability="majority", durability_timeout=1.0)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert err.value.code is ErrorCode.DURABILITY_AMBIGUOUS, err.value
        assert err.value.details["durability_timeout"] == 1.0
        assert "within 1 s" in err.value.message
        # the replica back: majority writes are acknowledged again
        wait_for(lambda: _written(ks, d, 3), 30, what="a majority write after the pause")


def test_sql_dml_waits_its_own_durability_timeout(cluster: LocalCluster) -> None:
    """``query(..., durability_timeout=)``: each document an SQL statement writes at a
    majority level waits that long for its copies, not the node's default; with the
    replica paused the statement is ambiguous naming it. A bad value is refused unsent."""
    with connect_local(cluster.path, name="sqltimeout", request_timeout=30) as c:
        desc = c.create_keyspace("sqltimeout", NP, num_replicas=1)
        p = next(q for q, n in desc.assignment.items() if desc.replicas[q] == ["node3"])
        d = docids_in(p, NP, 1, "st")[0]
        ks = c.keyspace("sqltimeout")
        wait_for(lambda: _written(ks, d, 1), 30, what="a majority write with the replica up")
        upsert = f'UPSERT INTO sqltimeout (KEY, VALUE) VALUES ("{d}", {{"v": 2}})'
        # the statement's node has the state and its connections before the pause
        list(c.query(upsert, durability="majority", durability_timeout=30))
        pid = cluster.pid(3)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(ShardexError) as err:
                list(c.query(upsert, durability="majority", durability_timeout=1.0))
        finally:
            os.kill(pid, signal.SIGCONT)
        assert err.value.code is ErrorCode.DURABILITY_AMBIGUOUS, err.value
        assert err.value.details["durability_timeout"] == 1.0
        for bad in (0, -1.5, float("nan"), "2"):
            with pytest.raises(ShardexError) as refused:
                c.query(upsert, durability="majority", durability_timeout=bad)
            assert refused.value.code is ErrorCode.BAD_REQUEST
            assert refused.value.details["durability_timeout"] == repr(bad)


def _written(ks, docid: str, v: int) -> bool:
    try:
        ks.upsert(docid, {"v": v}, durability="majority")
    except ShardexError as exc:
        if exc.code in (ErrorCode.DURABILITY_IMPOSSIBLE, ErrorCode.DURABILITY_AMBIGUOUS):
            return False
        raise
    return True
