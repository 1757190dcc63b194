"""Part 2 of ``bench.replication``: failover time. A 3-node cluster started with
``--heartbeat-interval 0.25 --failure-timeout 1 --auto-failover-timeout T``, keyspace ``fo``
of 16 partitions with ``num_replicas=1``; per run: kill -9 of node2 or node3 (in turn; node1
answers the admin client), then the time to the first acknowledged write on a document whose
partition's active was on the victim, probed by 10 writers started 0.1 s apart, and the time
until ``failed_over()`` lists the node. The node is then restarted, recovered (delta) and
rebalanced before the next run."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common.runner import Row, percentile

FO_KS, FO_PARTITIONS = "fo", 16
FAST_DETECTION = ("--heartbeat-interval", "0.25", "--failure-timeout", "1")
PROBES, PROBE_STAGGER = 10, 0.1  # failover probes: how many, seconds between their starts
FAILOVER_DEADLINE = 60.0  # seconds a run may take to fail over and write again


def log(msg: str) -> None:
    print(f"[replication] {msg}", file=sys.stderr, flush=True)


def _chains_full(admin: Any, keyspace: str) -> bool:
    ks = next(k for k in admin.list_keyspaces() if k.name == keyspace)
    return bool(ks.min_replicas == ks.num_replicas)


def _wait(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll ``cond`` until truthy; the seconds it took. RuntimeError at the deadline."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"{what}: not within {timeout:g} s")
        time.sleep(interval)
    return time.monotonic() - start


def _docids_on(ks: Any, partitions: set[int], n: int) -> list[str]:
    """``n`` docids, in distinct partitions of ``partitions`` while there are enough."""
    out: list[str] = []
    seen: set[int] = set()
    for i in range(100_000):
        docid = f"probe{i}"
        p = ks.partition_of(docid)
        if p in partitions and (p not in seen or len(seen) == len(partitions)):
            out.append(docid)
            seen.add(p)
            if len(out) == n:
                return out
    raise RuntimeError(f"no docids found in partitions {sorted(partitions)}")


def _probe(ks: Any, docid: str, t0: float, delay: float, done: threading.Event) -> float | None:
    """From ``t0 + delay``, upsert ``docid`` until one is acknowledged (or ``done``); the
    seconds from ``t0`` to that acknowledgement."""
    from shardex.errors import ShardexError

    time.sleep(max(0.0, t0 + delay - time.monotonic()))
    while not done.is_set() and time.monotonic() - t0 < FAILOVER_DEADLINE:
        try:
            ks.upsert(docid, {"probe": docid, "t": time.time()}, durability="persist_active")
        except ShardexError:
            time.sleep(0.01)  # refused at once (no route yet): do not spin
            continue
        return time.monotonic() - t0
    return None


def failover_cycle(cdir: Path, admin: Any, probe_ks: Any, victim: str) -> Row:
    """kill -9 ``victim``; time to failover and to the first write on one of its partitions;
    then restart, delta recovery and rebalance."""
    from bench.common.local_cluster import node_pids, start_stopped_nodes

    desc = next(k for k in admin.list_keyspaces() if k.name == FO_KS)
    affected = {p for p, node in desc.assignment.items() if node == victim}
    if not affected:
        raise RuntimeError(f"{victim} holds no active of {FO_KS!r}: {desc.assignment}")
    docids = _docids_on(probe_ks, affected, PROBES)
    for d in docids:  # routes and connections warm, as an application's would be
        probe_ks.upsert(d, {"probe": d}, durability="persist_active")
    pid = node_pids(cdir)[victim]
    results: list[float | None] = [None] * PROBES
    done = threading.Event()

    def run(k: int) -> None:
        results[k] = _probe(probe_ks, docids[k], t0, k * PROBE_STAGGER, done)
        if results[k] is not None:
            done.set()

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(PROBES)]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.start()
    detected = _wait(lambda: victim in admin.failed_over(), FAILOVER_DEADLINE, "failover")
    for t in threads:
        t.join(FAILOVER_DEADLINE)
    done.set()
    writes = [r for r in results if r is not None]
    if not writes:
        raise RuntimeError(f"no write acknowledged within {FAILOVER_DEADLINE:g} s of the kill")
    # Back to the starting state: restarted, recovered (delta), chains rebuilt and balanced.
    t1 = time.monotonic()
    start_stopped_nodes(cdir)
    admin.recover(victim, "delta")
    admin.rebalance()
    _wait(lambda: _chains_full(admin, FO_KS), 60, "chains restored")
    return {
        "victim": victim,
        "partitions": len(affected),
        "failed over s": round(detected, 3),
        "first write s": round(min(writes), 3),
        "restore s": round(time.monotonic() - t1, 1),
    }


def measure_failover(base: Path, timeout: float, runs: int) -> list[Row]:
    """``runs`` kill -9 cycles on a cluster with ``--auto-failover-timeout timeout``."""
    from bench.common.local_cluster import shardex_cluster
    from shardex.client import connect_local

    extra = (*FAST_DETECTION, "--auto-failover-timeout", f"{timeout:g}")
    out: list[Row] = []
    with (
        shardex_cluster(base, 3, extra) as cdir,
        connect_local(cdir, name="bench-failover-admin", request_timeout=30) as admin,
        connect_local(cdir, name="bench-failover-probe") as probe,
    ):
        admin.create_keyspace(FO_KS, FO_PARTITIONS, num_replicas=1)
        probe_ks = probe.keyspace(FO_KS)
        for run in range(runs):
            victim = f"node{2 + run % 2}"  # node1 answers the admin client
            row = failover_cycle(cdir, admin, probe_ks, victim)
            log(f"failover at {timeout:g} s, run {run + 1}/{runs}: {row}")
            out.append({"timeout s": timeout, "run": run + 1, **row})
    return out


def failover_summary(runs: Sequence[Row]) -> list[Row]:
    """Per timeout: p50 and max of the time to failover and to the first write; the goal."""
    out: list[Row] = []
    for timeout in sorted({r["timeout s"] for r in runs}):
        mine = [r for r in runs if r["timeout s"] == timeout]
        writes = sorted(r["first write s"] for r in mine)
        detected = sorted(r["failed over s"] for r in mine)
        worst = writes[-1]
        out.append(
            {
                "auto-failover timeout s": timeout,
                "runs": len(mine),
                "failed over p50 s": percentile(detected, 50),
                "first write p50 s": percentile(writes, 50),
                "first write max s": worst,
                "goal": f"<= {timeout + 1:g} s: " + ("met" if worst <= timeout + 1 else "NOT met"),
            }
        )
    return out
