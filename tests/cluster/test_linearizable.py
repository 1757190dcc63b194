"""Per-document linearizability under kill -9 and automatic failover, in real processes.

Client threads use documents as registers (read, upsert at durability majority, and
compare-and-set: a read's CAS token handed to ``replace``) while a nemesis kills a node
holding active copies, waits for the automatic failover, restarts the node, recovers it and
rebalances. Every call is recorded (invoke, then ok / fail / info) in a
``shardex.testing.history.History`` and checked with ``shardex.testing.linearizability``;
a violation prints the operations that could not be placed and dumps the history."""

from __future__ import annotations

import itertools
import random
import threading
import time
from pathlib import Path

import pytest
from cluster_helpers import LocalCluster, wait_for
from data_helpers import FAST_FAILOVER, chains_full, kill9, running_cluster

from shardex.client import connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.testing.history import CAS_MISMATCH, History
from shardex.testing.linearizability import check

pytestmark = pytest.mark.cluster

KS = "lin"
KEYS = [f"r{i}" for i in range(8)]
THREADS = 5
FAST = FAST_FAILOVER
# A write refused with one of these took no effect.
REFUSED = {
    ErrorCode.DURABILITY_IMPOSSIBLE,
    ErrorCode.NOT_MY_PARTITION,
    ErrorCode.NODE_FAILED_OVER,
}


class Workload:
    def __init__(self, cluster: LocalCluster, history: History) -> None:
        self.history = history
        self.stop = threading.Event()
        self.values = itertools.count(1)
        self.lock = threading.Lock()
        self.ops = 0
        self.clients = [
            connect_local(cluster.path, name=f"lin{t}", request_timeout=10) for t in range(THREADS)
        ]
        self.threads = [threading.Thread(target=self._run, args=(t,)) for t in range(THREADS)]

    def __enter__(self) -> Workload:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        for c in self.clients:
            c.close()

    def _unique(self) -> int:
        with self.lock:
            return next(self.values)

    def _run(self, t: int) -> None:
        ks = self.clients[t].keyspace(KS)
        rng = random.Random(t)
        generation = 0  # a new process name after an ambiguous call (its op may still land)
        while not self.stop.is_set():
            proc = f"{t}.{generation}"
            key = rng.choice(KEYS)
            roll = rng.random()
            if roll < 0.4:
                ambiguous = self._read(ks, proc, key)
            elif roll < 0.7:
                ambiguous = self._write(ks, proc, key)
            else:
                ambiguous = self._cas(ks, proc, key)
            generation += ambiguous
            with self.lock:
                self.ops += 1

    def _read(self, ks, proc: str, key: str) -> bool:
        op = self.history.invoke(proc, key, "read")
        try:
            doc = ks.get(key)
        except ShardexError as exc:
            if exc.code is ErrorCode.DOC_NOT_FOUND:
                self.history.complete(op, "ok", None)
            else:
                self.history.complete(op, "fail", exc.code.value)  # a read changes nothing
            return False
        self.history.complete(op, "ok", doc)
        return False

    def _write(self, ks, proc: str, key: str) -> bool:
        doc = {"v": self._unique()}
        op = self.history.invoke(proc, key, "write", doc)
        try:
            ks.upsert(key, doc, durability="majority")
        except ShardexError as exc:
            return self._failed(op, exc)
        self.history.complete(op, "ok")
        return False

    def _cas(self, ks, proc: str, key: str) -> bool:
        try:
            current = ks.get_versioned(key)
        except ShardexError:
            return False  # absent or unreachable: no cas this time (nothing recorded)
        new = {"v": self._unique()}
        op = self.history.invoke(proc, key, "cas", (current.doc, new))
        try:
            ks.replace(key, new, cas=current.cas, durability="majority")
        except ShardexError as exc:
            if exc.code in (ErrorCode.CAS_MISMATCH, ErrorCode.DOC_NOT_FOUND):
                self.history.complete(op, "fail", CAS_MISMATCH)
                return False
            return self._failed(op, exc)
        self.history.complete(op, "ok")
        return False

    def _failed(self, op, exc: ShardexError) -> bool:
        if exc.code in REFUSED:
            self.history.complete(op, "fail", exc.code.value)
            time.sleep(0.02)
            return False
        self.history.complete(op, "info", exc.code.value)
        return True


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("linearizable"), extra=FAST) as c:
        yield c


def test_registers_stay_linearizable_through_kill9_and_failover(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    history = History()
    with connect_local(cluster.path, name="nemesis", request_timeout=30) as admin:
        admin.create_keyspace(KS, 8, num_replicas=2)
        with Workload(cluster, history) as load:
            wait_for(lambda: load.ops > 200, 30, what="workload under way")
            for cycle in range(2):
                victim = 2 + cycle
                name = f"node{victim}"
                kill9(cluster, victim)
                wait_for(lambda n=name: n in admin.failed_over(), 30, what=f"{name} failed over")
                floor = load.ops + 200
                wait_for(lambda f=floor: load.ops > f, 30, what="operations after failover")
                cluster.start()
                admin.recover(name, "delta")
                admin.rebalance()
                wait_for(lambda: chains_full(admin, KS), 30, what="chains restored")
            floor = load.ops + 200
            wait_for(lambda f=floor: load.ops > f, 30, what="operations after the last cycle")
    ops = history.operations()
    oks = sum(1 for o in ops if o.status == "ok" and o.op != "read")
    assert oks > 100, f"too few successful writes to say anything ({oks})"
    result = check(history, time_budget_s=120)
    if not result.ok:
        dump = tmp_path / "history.jsonl"
        history.dump(dump)
        pytest.fail(f"{result.describe()}\n(history: {dump})")
