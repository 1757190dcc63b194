"""What ``bench.pipeline`` reads off a running pipeline: the published stability TS (held by
the master's timekeeper) and when it covers a set of writes, and the per-batch tables (the
driver's BatchStats, the rounds between batches, Spark's own progress durations).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench.common.dataset import INDEX_NAMES, KEYSPACE
from bench.common.driver import covers
from bench.common.runner import Row, ms, percentile


def index_ids(client: Any) -> list[str]:
    from shardex.meta.index_state import find_index
    from shardex.pipeline.indexers import index_state

    state = index_state(client)
    out = []
    for name in INDEX_NAMES:
        rec = find_index(state.indexes, KEYSPACE, name)
        assert rec is not None, f"no index {name}"
        out.append(rec.id)
    return out


_MASTER_TTL = 2.0
_masters: dict[int, tuple[str, float]] = {}


def timekeeper_node(client: Any) -> str:
    """The coordinator master, whose timekeeper the pipeline's stabilise rounds go to (read
    again every couple of seconds)."""
    from shardex.pipeline.indexers import index_state

    hit = _masters.get(id(client))
    if hit is not None and time.monotonic() - hit[1] < _MASTER_TTL:
        return hit[0]
    master = index_state(client).master
    _masters[id(client)] = (master, time.monotonic())
    return master


def held_stability(client: Any) -> dict[str, Any]:
    """Index id -> the stability TS the master's timekeeper holds for the keyspace."""
    from shardex.api.timekeeper import StabilityReply, StabilityRequest
    from shardex.core.timestamp import Timestamp
    from shardex.pipeline.indexers import to_node

    msg = StabilityRequest(keyspace=KEYSPACE)
    reply = client.rpc.run(to_node(client, timekeeper_node(client), msg, StabilityReply))
    return {i: Timestamp.from_wire(ts) for i, ts in reply.stability.items()}


def stable_seqnos(client: Any, ids: Sequence[str]) -> dict[int, int] | None:
    """Per data partition the seqno every listed index's published stability TS covers (the
    TS held by the master's timekeeper); None until all are published."""
    held = held_stability(client)
    if any(i not in held for i in ids):
        return None
    out: dict[int, int] = {}
    for n, i in enumerate(ids):
        for p, e in held[i].items():
            out[p] = e.seqno if n == 0 else min(out.get(p, 0), e.seqno)
    return out


def seqnos(ts: Any) -> dict[int, int]:
    return {p: e.seqno for p, e in ts.items()}


def wait_covered(
    client: Any, ids: Sequence[str], target: dict[int, int], timeout: float, interval: float = 0.02
) -> float:
    """Poll until the published stability covers ``target``; returns that wall time."""
    deadline = time.monotonic() + timeout
    while True:
        if covers(stable_seqnos(client, ids), target):
            return time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"stability did not cover {len(target)} partitions in {timeout}s")
        time.sleep(interval)


STAT_PARTS = ("wait_round", "project", "catch_up", "deliver", "stabilise", "total")


def batch_row(part: str, records: Sequence[tuple[float, Any]]) -> Row:
    """Medians of the driver's BatchStats over the batches that carried changes."""
    stats = [s for _, s in records if s.changes > 0]
    row: Row = {"part": part, "batches": len(stats)}
    if not stats:
        return row
    row["changes/batch"] = statistics.median(s.changes for s in stats)
    row["kv/batch"] = statistics.median(s.key_versions for s in stats)
    for name in STAT_PARTS:
        row[f"{name} ms"] = ms(statistics.median(getattr(s, name) for s in stats))
    totals = sorted(s.total for s in stats)
    row["total p90 ms"] = ms(percentile(totals, 90))
    row["retries"] = sum(s.retries for s in stats)
    row["on driver"] = sum(1 for s in stats if getattr(s, "on_driver", False))
    # key versions the batch took from the read-ahead (read while Spark committed the last)
    row["read ahead kv"] = statistics.median(getattr(s, "read_ahead", 0) for s in stats)
    # of those, delivered to the indexers before the batch's round (0: it delivered all)
    row["early kv"] = statistics.median(getattr(s, "early", 0) for s in stats)
    # sent while the batch was still projected (``pipeline/rounds/streamed.py``)
    row["streamed kv"] = statistics.median(getattr(s, "streamed", 0) for s in stats)
    return row


def between_row(part: str, job: Any, before: Any) -> Row:
    """The stability rounds between batches of ``job`` since ``before`` (a copy of its
    ``between.stats`` taken at the start): count, failures, stops, key versions, wall."""
    now = job.between.stats
    walls = now.walls[len(before.walls) :] if len(now.walls) >= len(before.walls) else now.walls
    return {
        "part": part,
        "rounds": now.rounds - before.rounds,
        "failed": now.failed - before.failed,
        "stopped": now.stopped - before.stopped,
        "kv/round": round((now.key_versions - before.key_versions) / max(1, len(walls))),
        "round ms p50": ms(statistics.median(walls)) if walls else float("nan"),
        "round ms p90": ms(percentile(sorted(walls), 90)) if walls else float("nan"),
        # of a round: deliver + stabilise on the indexers, then the timekeeper's publish
        "deliver ms p50": _median_ms(now.delivers[-len(walls) :] if walls else []),
        "publish ms p50": _median_ms(now.publishes[-len(walls) :] if walls else []),
    }


def _median_ms(samples: Sequence[float]) -> float:
    return ms(statistics.median(samples)) if samples else float("nan")


def progress_row(part: str, progress: Sequence[dict[str, Any]]) -> Row:
    """Medians of Spark's own durations (queryProgress durationMs) for the batches given."""
    row: Row = {"part": part, "batches": len(progress)}
    for key in (
        "triggerExecution",
        "latestOffset",
        "queryPlanning",
        "walCommit",
        "addBatch",
        "commitOffsets",
    ):
        vals = [float(p["durationMs"].get(key, 0)) for p in progress]
        row[key] = round(statistics.median(vals), 1) if vals else float("nan")
    return row
