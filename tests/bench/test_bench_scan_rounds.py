"""``bench.scan``'s interleaving (``bench/scan/rounds.py``): the order of the measurements
(rounds outermost, arms reversed every other round), the medians over rounds and the
ratio of medians with the per-round ratios' spread; and the /proc CPU reading of
``bench/scan/interleaved.py`` on this process."""

from __future__ import annotations

import os
import time

import pytest
from bench.scan.interleaved import CpuProbe, cpu_percent, tree_cpu
from bench.scan.rounds import (
    PG_LABEL,
    POSTGRESQL,
    SHARDEX,
    Arm,
    Step,
    arms,
    median_rows,
    round_order,
    round_ratios,
    sample_row,
    scan_ratios,
    schedule,
)
from bench.scan.run import scan_ratios as exported_scan_ratios

NB, RP = "not_bounded", "request_plus"


def test_arms_put_postgresql_first_then_each_consistency() -> None:
    got = arms([NB, RP])
    assert got == [
        Arm(POSTGRESQL, "-", PG_LABEL),
        Arm(SHARDEX, NB, NB),
        Arm(SHARDEX, RP, RP),
    ]


def test_round_order_reverses_every_other_round() -> None:
    a = arms([NB, RP])
    assert round_order(a, 0) == a and round_order(a, 2) == a
    assert round_order(a, 1) == a[::-1] and round_order(a, 3) == a[::-1]


def test_schedule_runs_rounds_outermost_and_alternates_the_first_system() -> None:
    steps = list(schedule(["c1", "c2"], [1, 4], arms([NB]), 3))
    assert len(steps) == 3 * 2 * 2 * 2
    assert [s.round for s in steps] == sorted(s.round for s in steps)  # rounds outermost
    for rnd in range(3):
        mine = [s for s in steps if s.round == rnd]
        assert [(s.case, s.clients) for s in mine[::2]] == [
            ("c1", 1),
            ("c1", 4),
            ("c2", 1),
            ("c2", 4),
        ]
        first = POSTGRESQL if rnd % 2 == 0 else SHARDEX
        assert {s.arm.system for s in mine[::2]} == {first}  # each slot starts with it
    # Every slot measures every arm once per round.
    slots = {(s.round, s.case, s.clients, s.arm.system) for s in steps}
    assert len(slots) == len(steps)


def test_schedule_rejects_no_rounds() -> None:
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        list(schedule(["c"], [1], arms([NB]), 0))


def _sample(rnd: int, arm: Arm, clients: int, p50: float, rate: float, load: float) -> dict:
    summary = {
        "scans": 10,
        "p50 ms": p50,
        "p99 ms": 2 * p50,
        "mean ms": p50,
        "scans/s": rate,
        "rows/scan": 100.0,
        "errors": 0,
    }
    row = sample_row(Step(rnd, "c", clients, arm), summary, load)
    row["own cpu %"] = 90.0 + rnd
    row["peer cpu %"] = float(rnd)
    return row


PG, SX = arms([NB])


def samples_three_rounds() -> list[dict]:
    # PostgreSQL's p50 swings with the load (2, 6, 3 ms); shardex's less (5, 8, 6 ms).
    return [
        _sample(0, PG, 4, 2.0, 400.0, 1.0),
        _sample(0, SX, 4, 5.0, 100.0, 1.5),
        _sample(1, SX, 4, 8.0, 80.0, 6.0),
        _sample(1, PG, 4, 6.0, 200.0, 6.5),
        _sample(2, PG, 4, 3.0, 300.0, 2.0),
        _sample(2, SX, 4, 6.0, 90.0, 2.5),
    ]


def test_median_rows_take_the_median_over_rounds_and_list_the_loads() -> None:
    rows = median_rows(samples_three_rounds(), ["c"])
    assert [r["system"] for r in rows] == [POSTGRESQL, SHARDEX]
    pg, sx = rows
    assert pg["consistency"] == PG_LABEL and sx["consistency"] == NB
    assert pg["rounds"] == 3 and pg["scans"] == 30 and pg["errors"] == 0
    assert pg["p50 ms"] == 3.0 and pg["p99 ms"] == 6.0 and pg["scans/s"] == 300.0
    assert sx["p50 ms"] == 6.0 and sx["scans/s"] == 90.0
    assert pg["load per round"] == "1.0 6.5 2.0" and pg["load_1m"] == 2.0
    assert pg["own cpu %"] == 91.0 and pg["peer cpu %"] == 1.0


def test_median_rows_order_system_case_consistency_clients() -> None:
    a = arms([NB, RP])
    samples = [_sample(0, arm, n, 1.0, 1.0, 1.0) for n in (16, 1) for arm in round_order(a, 1)]
    got = [(r["system"], r["consistency"], r["clients"]) for r in median_rows(samples, ["c"])]
    # request_plus was measured first here, so it comes first; clients ascending.
    assert got == [
        (POSTGRESQL, PG_LABEL, 1),
        (POSTGRESQL, PG_LABEL, 16),
        (SHARDEX, RP, 1),
        (SHARDEX, RP, 16),
        (SHARDEX, NB, 1),
        (SHARDEX, NB, 16),
    ]


def test_ratios_are_of_medians_with_the_per_round_spread() -> None:
    samples = samples_three_rounds()
    rows = median_rows(samples, ["c"])
    assert round_ratios(samples, rows[1], "p50 ms") == [2.5, 1.33, 2.0]
    (r,) = scan_ratios(rows, samples)
    assert r["p50 x"] == 2.0  # 6 / 3: the medians, not the mean of the per-round ratios
    assert r["p50 x min"] == 1.33 and r["p50 x max"] == 2.5
    assert r["scans/s x"] == 0.3 and r["scans/s x min"] == 0.25 and r["scans/s x max"] == 0.4
    assert r["p99 x"] == 2.0 and r["gap x"] == 1.0
    # Without the samples (a one-round layout): no spread columns, same medians.
    (plain,) = scan_ratios(rows)
    assert "p50 x min" not in plain and plain["p50 x"] == 2.0
    assert exported_scan_ratios is scan_ratios  # bench.scan keeps its name


def test_round_ratio_is_none_when_postgresql_missed_that_round() -> None:
    samples = [s for s in samples_three_rounds() if (s["round"], s["system"]) != (1, POSTGRESQL)]
    rows = median_rows(samples, ["c"])
    assert round_ratios(samples, rows[1], "p50 ms") == [2.5, None, 2.0]
    (r,) = scan_ratios(rows, samples)
    assert r["p50 x min"] == 2.0 and r["p50 x max"] == 2.5


def test_cpu_probe_sees_this_process_burn_cpu() -> None:
    probe = CpuProbe({"me": [os.getpid()], "gone": [2**22 + 12345]})
    before, t0, c0 = probe.sample(), time.monotonic(), time.process_time()
    while time.process_time() < c0 + 0.3:  # burn 0.3 s of CPU
        pass
    after, wall, used = probe.sample(), time.monotonic() - t0, time.process_time() - c0
    pct = cpu_percent(before, after, wall)
    # What this process used as a share of the wall time, whatever the machine's load
    # stretched the wall time to; /proc counts in ticks of 10 ms (two of slack).
    assert abs(pct["me"] - 100 * used / wall) <= 100 * 0.02 / wall + 0.1
    assert pct["me"] > 0.0
    assert pct["gone"] == 0.0  # a pid that does not exist counts nothing
    assert tree_cpu(os.getpid(), {}) > 0.0
