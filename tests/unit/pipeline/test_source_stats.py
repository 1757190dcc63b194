"""The stream readers' call statistics (``pipeline/source/stats.py``): what
``bench.diagnostics.pipeline_floor`` tables per stream reader, so a wrong figure misleads a
decision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardex.pipeline.source import stats as source_stats
from shardex.pipeline.source.stats import SourceCallStats


class Clock:
    """A perf_counter the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(source_stats.time, "perf_counter", c)
    return c


def _batch(stats: SourceCallStats, clock: Clock, *, idle: bool, rtt: float) -> None:
    """One trigger as Spark makes it: latestOffset, then reportLatestOffset ``rtt`` later."""
    with stats.call("latestOffset", gap_after="partitions"):
        clock.now += 0.004
        stats.idle = idle
    clock.now += rtt
    with stats.call("reportLatestOffset", gap_after="latestOffset"):
        clock.now += 0.001


def test_calls_gaps_and_idle_triggers_are_kept_apart(clock: Clock) -> None:
    stats = SourceCallStats()
    _batch(stats, clock, idle=False, rtt=0.010)
    clock.now += 0.020
    with stats.call("commit", gap_after="reportLatestOffset"):
        pass
    clock.now += 0.030
    with stats.call("partitions", gap_after="commit"):
        clock.now += 0.002
    clock.now += 0.200
    _batch(stats, clock, idle=True, rtt=0.003)
    _batch(stats, clock, idle=True, rtt=0.005)

    snap = stats.snapshot()
    ms = snap["median_ms"]
    assert snap["calls"] == {
        "latestOffset": 1,
        "reportLatestOffset": 1,
        "commit": 1,
        "partitions": 1,
        "latestOffset idle": 2,
        "reportLatestOffset idle": 2,
    }
    assert ms["latestOffset"] == pytest.approx(4.0)
    assert ms["latestOffset->reportLatestOffset"] == pytest.approx(10.0)
    assert ms["reportLatestOffset->commit"] == pytest.approx(20.0)
    assert ms["commit->partitions"] == pytest.approx(30.0)
    assert ms["partitions"] == pytest.approx(2.0)
    # the gap from the batch's planning to the next trigger, labelled by that trigger
    assert ms["partitions->latestOffset idle"] == pytest.approx(200.0)
    assert ms["latestOffset->reportLatestOffset idle"] == pytest.approx(4.0)  # (3 + 5) / 2
    # a gap is measured once: the second idle trigger had no partitions call before it
    assert snap["samples"]["partitions->latestOffset idle"] == 1


def test_counters_stay_readable_and_the_file_is_written(clock: Clock, tmp_path: Path) -> None:
    stats = SourceCallStats()
    stats["rpc_calls"] += 2
    stats["rpc_seconds"] += 0.5
    stats.sample("high_seqnos_rpc", 0.003)
    path = tmp_path / "stats.json"
    stats.write(str(path))
    data: dict[str, Any] = json.loads(path.read_text())
    assert data["rpc_calls"] == 2 and data["rpc_seconds"] == 0.5
    assert data["latest_calls"] == 0
    assert data["median_ms"] == {"high_seqnos_rpc": 3.0}
    stats["rpc_calls"] += 1
    stats.write(str(path))  # within a second of the last write: skipped
    assert json.loads(path.read_text())["rpc_calls"] == 2
    stats.write(str(path), force=True)
    assert json.loads(path.read_text())["rpc_calls"] == 3
    stats.write(None, force=True)  # no path: nothing to do, no error
