"""A ROLLBACK handled while a node is down during a failover, then the index's rebuild: the
maintenance stream must go on applying changes afterwards (the index reaches the keyspace's
high seqnos and equals the oracle there).

How: the index has slices on node1 and on the node A holding the active copy of a data
partition p (the replica on B). B is paused (SIGSTOP), writes to p are acknowledged by A at
``persist_active`` and the index publishes a stability TS covering them; then A is killed and
B resumed, so the promoted copy lacks those writes and the stream's next batch fails with
ROLLBACK. The supervisor's ``handle_rollback`` needs A's indexer (it holds slices of the
index), so it fails with A down and is retried every poll: A stays down until it was
tried at least three times. Then A returns (delta recovery, rebalance), the index is rebuilt,
and writes after it must reach the index. The stall watchdog runs with a short period, so a
stream that stops applying is also restarted; the test reports whether it had to."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cluster_helpers import wait_for
from data_helpers import chains_full, kill9, running_cluster
from pipeline_helpers import check_oracle, running_pipeline, stability_of, wait_stable

import shardex.pipeline.driver as driver_mod
from shardex.client import connect_local
from shardex.errors import ErrorCode, ShardexError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYSPACE = "rbdown"
NAME = "by_name"
NP = 8
NAMES = ("ann", "bob", "cy", "dee", "eve")
# Fast failure detection, but an auto-failover timeout above how long the replica stays
# paused (while the index publishes the writes only the active holds): a paused replica
# failed over itself would use up the one automatic failover the cluster allows.
FAILOVER = ("--heartbeat-interval", "0.25", "--failure-timeout", "1")
FAILOVER += ("--auto-failover-timeout", "45")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_rollback_while_a_node_is_down_then_the_stream_applies_again(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[BaseException | None] = []
    real: Callable[..., Any] = driver_mod.handle_rollback

    def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            out = real(*args, **kwargs)
        except BaseException as exc:
            attempts.append(exc)
            raise
        attempts.append(None)
        return out

    monkeypatch.setattr(driver_mod, "handle_rollback", counted)
    path = tmp_path / "cluster"
    with (
        running_cluster(path, nodes=3, extra=FAILOVER) as cluster,
        connect_local(path, request_timeout=30, as_node=True) as client,
        running_pipeline(spark, path, tmp_path / "ckpt", poll=0.3, stall_after=20.0) as driver,
    ):
        client.create_keyspace(KEYSPACE, num_partitions=NP, num_replicas=1)
        ks = client.keyspace(KEYSPACE)
        oracle: dict[str, dict[str, Any]] = {}

        def write(n: int, prefix: str) -> None:
            for i in range(n):
                doc = {"name": NAMES[i % len(NAMES)], "v": i}
                ks.upsert(f"{prefix}{i}", doc, durability="majority")
                oracle[f"{prefix}{i}"] = doc

        write(100, "d")
        desc = next(k for k in client.list_keyspaces() if k.name == KEYSPACE)
        p = next(q for q in range(NP) if "node1" not in (desc.assignment[q], *desc.replicas[q]))
        active, replica = desc.assignment[p], desc.replicas[p][0]
        client.create_index(
            KEYSPACE,
            NAME,
            ["name", "v"],
            partition_by=["META().id"],
            num_partition=2,
            nodes=["node1", active],
        )
        client.wait_for_index(KEYSPACE, NAME, timeout=300)
        wait_stable(client, KEYSPACE, [NAME], timeout=360)
        new = [d for d in (f"lost-{i}" for i in range(5000)) if ks.partition_of(d) == p][:5]
        rpid = cluster.pid(int(replica.removeprefix("node")))
        assert rpid is not None
        os.kill(rpid, signal.SIGSTOP)
        try:
            last = 0
            for i, docid in enumerate(new):
                res = ks.upsert(docid, {"name": "zed", "v": -i}, durability="persist_active")
                last = res.seqno
            # The index applied and published the writes only A holds.
            wait_for(
                lambda: (stability_of(client, KEYSPACE, NAME) or {}).get(p, 0) >= last,
                240,
                what=f"the index's stability covers seqno {last} of partition {p}",
            )
            kill9(cluster, int(active.removeprefix("node")))
        finally:
            os.kill(rpid, signal.SIGCONT)
        wait_for(lambda: active in client.failed_over(), 180, what=f"{active} failed over")
        # The promoted copy may hold the first of those writes (a ReplicaApply in flight when
        # its node was paused): those are history now, the others are lost.
        for i, docid in enumerate(new):
            if _read(ks, docid) is not None:
                oracle[docid] = {"name": "zed", "v": -i}
        # The rollback is tried, and fails, while A is down.
        wait_for(
            lambda: sum(1 for a in attempts if a is not None) >= 3,
            300,
            what="handle_rollback tried three times with the node down",
        )
        assert all(a is not None for a in attempts), attempts
        cluster.start()
        client.recover(active, "delta")
        client.rebalance()
        wait_for(lambda: chains_full(client, KEYSPACE), 120, what="chains restored")
        kp = driver.keyspaces[KEYSPACE]
        wait_for(lambda: kp.rollbacks >= 1, 300, what="the rollback handled")
        client.wait_for_index(KEYSPACE, NAME, timeout=300)
        write(50, "after-")
        ts = wait_stable(client, KEYSPACE, [NAME], timeout=360)
        entries = check_oracle(client, KEYSPACE, NAME, ts)
        rows = client.scan(KEYSPACE, NAME, consistency="request_plus", timeout=120)
        got = sorted((tuple(r["key"]), r["docid"]) for r in rows)
        assert got == sorted(((d["name"], d["v"]), docid) for docid, d in oracle.items())
        print(
            f"\nrollback of partition {p} with {active} down: handle_rollback failed "
            f"{sum(1 for a in attempts if a is not None)} times, then succeeded; "
            f"{entries} entries equal the oracle at {ts!r}; watchdog restarts: {kp.stalls}"
        )


def _read(ks: Any, docid: str) -> dict[str, Any] | None:
    """The document as the (new) active has it, None if absent; retried while the route to
    the promoted copy settles."""

    def read() -> tuple[dict[str, Any] | None] | None:
        try:
            return (ks.get(docid),)
        except ShardexError as exc:
            if exc.code is ErrorCode.DOC_NOT_FOUND:
                return (None,)
            return None

    got, _ = wait_for(read, 30, what=f"a read of {docid}")
    return got[0]
