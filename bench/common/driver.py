"""The pipeline driver in the benchmark's own process: ``InProcessDriver`` (``PipelineDriver``
on this process's SparkSession, in a thread), the log of its per-batch statistics, and the
timed BUILD INDEX of the two indexes (``shardex_build``) that ``bench.pipeline``,
``bench.scan``, ``bench.sql`` and the diagnostics start from.

Nothing here imports PySpark at module level.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common.dataset import INDEX_NAMES, KEYSPACE
from bench.common.runner import Row, load1, log


@dataclass
class BatchLog:
    """Every BatchStats the driver reports, with the wall time it finished."""

    records: list[tuple[float, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, stats: Any) -> None:
        with self.lock:
            self.records.append((time.time(), stats))

    def since(self, t0: float, t1: float | None = None) -> list[tuple[float, Any]]:
        with self.lock:
            return [(t, s) for t, s in self.records if t >= t0 and (t1 is None or t <= t1)]

    def wait_end(self, target: dict[int, int], timeout: float = 30.0) -> None:
        """Until a batch whose end covers ``target`` is recorded: the driver records a batch
        just after its TS is published, so a poller can see the TS first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                last = self.records[-1][1] if self.records else None
            if last is not None and covers({p: e[0] for p, e in last.end.items()}, target):
                return
            time.sleep(0.01)
        log("no recorded batch covers the target (stats of the last batch may be missing)")


class InProcessDriver:
    """``PipelineDriver`` on this process's SparkSession, in a thread (as the e2e tests run
    it); ``stop()`` stops its queries. A new one on the same checkpoint root resumes."""

    def __init__(
        self,
        spark: Any,
        cluster_dir: Path,
        checkpoints: Path,
        batches: BatchLog,
        poll: float,
    ) -> None:
        from shardex.client import connect_local
        from shardex.pipeline.driver import PipelineDriver

        self.client = connect_local(cluster_dir, name="bench-pipeline-driver", as_node=True)
        self.driver = PipelineDriver(
            spark,
            self.client,
            {"cluster_dir": str(cluster_dir)},
            checkpoints,
            poll=poll,
            on_batch=batches,
        )
        self.thread = threading.Thread(target=self.driver.run, name="pipeline-driver", daemon=True)
        self.started = time.time()
        self.thread.start()

    def keyspace(self) -> Any:
        return self.driver.keyspaces.get(KEYSPACE)

    def stop(self) -> None:
        self.driver.stop()
        self.thread.join(timeout=120)
        if self.thread.is_alive():
            log("the pipeline driver did not stop within 120 s")
        self.client.close()


def covers(stable: dict[int, int] | None, target: dict[int, int]) -> bool:
    """Whether the per-partition seqnos ``stable`` reach every seqno of ``target``."""
    return stable is not None and all(stable.get(p, 0) >= s for p, s in target.items())


def shardex_build(client: Any, driver: Any, n: int, timeout: float) -> tuple[list[Row], Any]:
    """BUILD INDEX both at once; wall time until both are ACTIVE, and the driver's job time."""
    load = load1()
    log(f"BUILD INDEX {', '.join(INDEX_NAMES)}")
    t = time.perf_counter()
    client.build_index(KEYSPACE, *INDEX_NAMES)
    for name in INDEX_NAMES:
        client.wait_for_index(KEYSPACE, name, timeout=timeout)
    wall = time.perf_counter() - t
    log(f"both indexes ACTIVE after {wall:.1f} s")
    kp = driver.keyspace()
    deadline = time.monotonic() + 30
    while (kp is None or not kp.builds) and time.monotonic() < deadline:
        time.sleep(0.1)
        kp = driver.keyspace()
    if kp is None or not kp.builds:
        raise RuntimeError("both indexes are ACTIVE but the driver recorded no BuildResult")
    result = kp.builds[-1]
    if len(kp.builds) != 1:
        log(f"the driver recorded {len(kp.builds)} builds (expected one build of both)")
    rows = [
        {
            "system": "shardex",
            "case": "BUILD INDEX x2 -> both ACTIVE",
            "docs": n,
            "seconds": round(wall, 2),
            "docs/s": round(n / wall),
            "detail": "client.build_index .. wait_for_index",
            "load_1m": load,
        },
        {
            "system": "shardex",
            "case": "build job (BuildResult.seconds)",
            "docs": result.docs,
            "seconds": round(result.seconds, 2),
            "docs/s": round(result.docs / result.seconds),
            "detail": f"entries {result.items}, errors {result.errors}",
            "load_1m": load,
        },
    ]
    return rows, result
