"""What a running pipeline costs an idle cluster, and how fresh it keeps the index:
``python -m bench.diagnostics.pipeline_idle [--idle S] [--writes N] [--modes a,b]``.

One run: a 3-node local cluster, a keyspace of 16 partitions with one index, the pipeline
driver (``PipelineDriver``) in this process on one SparkSession. For each mode (the
change source's ``idle_offset_interval_ms``: ``20`` polls every 20 ms as before the idle
back-off, the default backs off while nothing changes), a driver is started on the same
checkpoints and measured:

1. idle: for ``--idle`` seconds with no writes, the ``HighSeqnos`` requests the driver
   process sends, counted per receiving node (a gathered one, ``partitions`` unset, is
   handled by the node it goes to and again by every owner it asks: all three nodes here),
   and the ``HighSeqnos`` of Spark's ``latestOffset`` (the source runs in a runner process of
   Spark's: its ``stats_path`` counters), and the CPU seconds each node process and the
   driver used (``/proc``);
2. freshness: ``--writes`` isolated upserts, 0.2-1.2 s apart (random, so they land at every
   phase of the polling), each timed from its acknowledgement to (a) the master's published
   stability TS covering it and (b) a not_bounded scan of the index returning its new key.

Counts come from the driver's own connections (``Connection.request`` and
``request_future`` wrapped in this process): idle, nothing else sends ``HighSeqnos``. The
machine may be shared: read the per-second counts and the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common.local_cluster import node_pids, shardex_cluster
from bench.common.proc_cpu import process_cpu
from bench.common.runner import load_average, percentile, print_table

KEYSPACE = "idle"
INDEX = "by_v"
PARTITIONS = 16


class SentCounter:
    """``HighSeqnos`` requests sent by this process, per peer address (thread-safe)."""

    def __init__(self) -> None:
        self.direct: Counter[str] = Counter()  # with ``partitions``: an owner's share
        self.gathered: Counter[str] = Counter()  # without: the node gathers from the owners
        self.lock = threading.Lock()

    def install(self) -> None:
        from shardex.api.data import HighSeqnos
        from shardex.net.connection import Connection

        counter = self
        request, request_future = Connection.request, Connection.request_future

        def note(conn: Any, msg: Any) -> None:
            if isinstance(msg, HighSeqnos):
                with counter.lock:
                    box = counter.direct if msg.partitions is not None else counter.gathered
                    box[conn.peer_address] += 1

        def req(self: Any, msg: Any, *args: Any, **kwargs: Any) -> Any:
            note(self, msg)
            return request(self, msg, *args, **kwargs)

        def req_future(self: Any, msg: Any, *args: Any, **kwargs: Any) -> Any:
            note(self, msg)
            return request_future(self, msg, *args, **kwargs)

        Connection.request = req  # type: ignore[method-assign,assignment]
        Connection.request_future = req_future  # type: ignore[method-assign]

    def snapshot(self) -> tuple[Counter[str], Counter[str]]:
        with self.lock:
            return Counter(self.direct), Counter(self.gathered)


def handled_per_node(
    before: tuple[Counter[str], Counter[str]],
    after: tuple[Counter[str], Counter[str]],
    addresses: dict[str, str],
) -> dict[str, int]:
    """``HighSeqnos`` each node handled between two snapshots: the direct ones sent to it,
    plus every gathered one (each node owns partitions here, so each is asked its share)."""
    direct = after[0] - before[0]
    gathered = sum((after[1] - before[1]).values())
    return {name: direct[addr] + gathered for name, addr in addresses.items()}


def run(idle: float, writes: int, modes: list[str]) -> list[dict[str, Any]]:
    from shardex.client import connect_local
    from shardex.core.timestamp import Timestamp
    from shardex.meta import cluster_dir as cdir
    from shardex.pipeline.driver import PipelineDriver
    from shardex.pipeline.session import build_spark_session

    counter = SentCounter()
    counter.install()
    rows: list[dict[str, Any]] = []
    base = Path(tempfile.mkdtemp(prefix="shardex-idle-"))
    rng = random.Random(7)
    with shardex_cluster(base, 3) as cluster, connect_local(cluster, as_node=True) as client:
        addresses = {n.name: n.address for n in cdir.load(cluster).nodes}
        pids = node_pids(cluster)
        client.create_keyspace(KEYSPACE, num_partitions=PARTITIONS, num_replicas=0)
        ks = client.keyspace(KEYSPACE)
        ks.upsert_many([(f"d{i}", {"v": i}) for i in range(200)])
        client.create_index(KEYSPACE, INDEX, ["v"])
        spark = build_spark_session(
            app_name="pipeline-idle",
            conf_overrides={"spark.sql.warehouse.dir": str(base / "wh")},
        )
        try:
            for n, mode in enumerate(modes):
                stats = base / f"source-{n}.json"
                options = {"cluster_dir": str(cluster), "stats_path": str(stats)}
                if mode != "default":
                    options["idle_offset_interval_ms"] = mode
                driver = PipelineDriver(spark, client, options, base / "ckpt", poll=0.3)
                thread = threading.Thread(target=driver.run, daemon=True)
                thread.start()
                try:
                    client.wait_for_index(KEYSPACE, INDEX, timeout=300)
                    _wait_fresh(client, ks, f"warm{n}", 10_000 + n, Timestamp)
                    time.sleep(3.0)  # the last batch's rounds settle; the polling backs off
                    s0 = _source_calls(stats)
                    b0, c0 = counter.snapshot(), process_cpu(pids.values())
                    d0 = process_cpu([_self_pid()])
                    t0 = time.monotonic()
                    time.sleep(idle)
                    span = time.monotonic() - t0
                    handled = handled_per_node(b0, counter.snapshot(), addresses)
                    s1 = _source_calls(stats)
                    # Spark's runner asks every owner once per call (``source/seqnos.py``).
                    runner = (s1[0] - s0[0]) / (s1[1] - s0[1])
                    node_cpu = process_cpu(pids.values()) - c0
                    driver_cpu = process_cpu([_self_pid()]) - d0
                    stab, scan = [], []
                    for i in range(writes):
                        time.sleep(rng.uniform(0.2, 1.2))
                        a, b = _wait_fresh(
                            client, ks, f"w{n}-{i}", 20_000 + n * 1000 + i, Timestamp
                        )
                        stab.append(a)
                        scan.append(b)
                    rows.append(
                        {
                            "mode": mode,
                            "HighSeqnos/s per node": " ".join(
                                f"{handled[k] / span + runner:.1f}" for k in sorted(handled)
                            ),
                            "of which latestOffset": round(runner, 1),
                            "node CPU %": round(100 * node_cpu / span / len(pids), 1),
                            "driver CPU %": round(100 * driver_cpu / span, 1),
                            "stable p50 ms": round(statistics.median(stab) * 1e3),
                            "stable p90 ms": round(percentile(sorted(stab), 90) * 1e3),
                            "scan p50 ms": round(statistics.median(scan) * 1e3),
                            "scan p90 ms": round(percentile(sorted(scan), 90) * 1e3),
                        }
                    )
                finally:
                    driver.stop()
                    thread.join(timeout=120)
        finally:
            spark.stop()
    return rows


def _source_calls(path: Path) -> tuple[float, float]:
    """The change source's HighSeqnos calls so far (its ``stats_path`` file, written by
    Spark's runner process at most once a second) and when the file was written."""
    import json

    deadline = time.monotonic() + 5.0
    while True:
        try:
            return json.loads(path.read_text())["rpc_calls"], path.stat().st_mtime
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _self_pid() -> int:
    import os

    return os.getpid()


def _wait_fresh(
    client: Any, ks: Any, docid: str, value: int, ts_type: Any, timeout: float = 60.0
) -> tuple[float, float]:
    """Upsert ``docid`` with ``v = value``; seconds from its acknowledgement to the published
    stability covering it, and to a not_bounded scan returning it."""
    res = ks.upsert(docid, {"v": value})
    acked = time.monotonic()
    p, seqno = res.partition, res.seqno
    stable = seen = None
    deadline = acked + timeout
    span = {"low": [value], "high": [value], "inclusion": "both"}
    while (stable is None or seen is None) and time.monotonic() < deadline:
        if stable is None:
            tss = client.stability(KEYSPACE)
            if tss and all(t.seqno(p) >= seqno for t in tss.values()):
                stable = time.monotonic() - acked
        if seen is None and any(r["docid"] == docid for r in client.scan(KEYSPACE, INDEX, [span])):
            seen = time.monotonic() - acked
        time.sleep(0.002)
    if stable is None or seen is None:
        raise RuntimeError(f"{docid} not fresh after {timeout} s")
    return stable, seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diagnostics.pipeline_idle")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle measured")
    ap.add_argument("--writes", type=int, default=15, help="isolated writes timed per mode")
    ap.add_argument(
        "--modes",
        default="20,default",
        help="idle_offset_interval_ms per run (default: the source's own)",
    )
    args = ap.parse_args(argv)
    rows = run(args.idle, args.writes, args.modes.split(","))
    load = load_average()
    print_table(f"pipeline idle cost and freshness (load {load})", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
