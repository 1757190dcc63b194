"""``bench.replication``'s pure pieces (the level mapping, ratios, goal lines, arguments) and
its set-up: the synchronous standby (``bench/common/pg_standby.py``) and CPU from ``/proc``.
Only the ``slow`` test starts real servers (run with ``-m slow``)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from bench.common import pg_standby
from bench.common import postgres as pgh
from bench.common.proc_cpu import process_cpu, tree_cpu

from bench import replication as rep
from bench import replication_pipeline as rpipe


def test_every_level_has_one_postgres_counterpart_and_the_goal_is_remote_apply() -> None:
    assert set(rep.COUNTERPART) == set(rep.LEVELS)
    pg = [pg for pg, _why in rep.COUNTERPART.values()]
    assert sorted(pg) == sorted(rep.PG_LEVELS)  # each PostgreSQL level measured is used once
    assert rep.COUNTERPART[rep.GOAL_LEVEL][0] == "remote_apply"


def _row(system: str, level: str, n: int, rate: float, **extra: Any) -> dict[str, Any]:
    return {"system": system, "level": level, "clients": n, "upserts/s": rate, **extra}


def test_ratios_pair_each_level_with_its_counterpart_and_mark_the_goal() -> None:
    plan = rep.Plan(clients=[1, 16])
    rows = [
        _row("postgresql", "remote_apply", 16, 1000.0),
        _row("postgresql", "remote_apply", 1, 100.0),
        _row("postgresql", "off", 16, 5000.0),
        _row("shardex", "majority", 16, 1200.0, replicas=1),
        _row("shardex", "majority", 1, 50.0, replicas=1),
        _row("shardex", "none", 16, 9999.0, replicas=0),  # part 3: not a ratio row
        _row("shardex", "none", 16, 2500.0, replicas=1),
    ]
    out = {(r["shardex level"], r["clients"]): r for r in rep.ratio_rows(rows, plan)}
    assert set(out) == {("majority", 16), ("majority", 1), ("none", 16)}
    assert out["majority", 16]["shardex/pg"] == 1.2
    assert out["majority", 16]["goal"].startswith("met")
    assert out["majority", 1]["goal"] == ""  # the goal line is at 16 clients only
    assert out["none", 16]["postgresql level"] == "off"
    assert out["none", 16]["shardex/pg"] == 0.5

    rows[3]["upserts/s"] = 900.0
    (goal,) = [r for r in rep.ratio_rows(rows, plan) if r["goal"]]
    assert goal["goal"].startswith("NOT met")


def test_replica_cost_compares_none_with_and_without_a_replica() -> None:
    rows = [
        _row("shardex", "none", 16, 2000.0, replicas=0, **{"server cpu ms/upsert": 0.5}),
        _row("shardex", "none", 16, 1500.0, replicas=1, **{"server cpu ms/upsert": 0.8}),
        _row("shardex", "majority", 16, 1000.0, replicas=1, **{"server cpu ms/upsert": 1.0}),
    ]
    (row,) = rep.replica_cost_rows(rows, rep.Plan(clients=[1, 16]))
    assert row["clients"] == 16
    assert row["1 / 0 rate"] == 0.75
    assert row["1 / 0 cpu"] == 1.6


def _pipe_row(replicas: int, drain: float, p50: float) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "load docs/s": 1000.0,
        "build docs/s": 500.0 * (1 + replicas),  # the second cluster's build: a warm JVM
        "drain mutations/s": drain,
        "drain /s (batches)": drain * 2,
        "fresh p50 ms": p50,
        "fresh p99 ms": p50 * 3,
    }


def test_pipeline_ratios_are_one_replica_over_none() -> None:
    rows = [_pipe_row(0, 10_000.0, 100.0), _pipe_row(1, 8_000.0, 150.0)]
    out = {r["metric"]: r for r in rpipe.pipeline_ratio_rows(rows)}
    assert "build docs/s" not in out  # the first build warms the JVM: not compared
    assert out["drain mutations/s"]["1 / 0"] == 0.8
    assert (out["drain mutations/s"]["0 replicas"], out["drain mutations/s"]["1 replica"]) == (
        10_000.0,
        8_000.0,
    )
    assert out["load docs/s"]["1 / 0"] == 1.0
    assert out["fresh p50 ms"]["1 / 0"] == 1.5
    assert out["fresh p99 ms"]["1 / 0"] == 1.5
    assert rpipe.pipeline_ratio_rows(rows[:1]) == []  # one cluster only: nothing to compare


def test_failover_summary_checks_the_worst_run_against_timeout_plus_one() -> None:
    runs = [
        {"timeout s": 2.0, "failed over s": 2.4, "first write s": w} for w in (2.5, 2.7, 2.9)
    ] + [{"timeout s": 5.0, "failed over s": 5.4, "first write s": w} for w in (5.5, 6.2)]
    by_timeout = {r["auto-failover timeout s"]: r for r in rep.failover_summary(runs)}
    assert by_timeout[2.0]["first write p50 s"] == 2.7
    assert by_timeout[2.0]["first write max s"] == 2.9
    assert by_timeout[2.0]["goal"] == "<= 3 s: met"
    assert by_timeout[5.0]["goal"] == "<= 6 s: NOT met"


def test_quick_is_short_and_parts_can_be_picked() -> None:
    plan, path = rep.parse_args(["--quick"])
    assert plan.seconds == 2.0 and plan.failover_runs == 3 and plan.failover_timeouts == [2.0]
    assert plan.pipeline.docs < rpipe.PipelinePlan().docs and 4 in plan.parts
    assert path.name == "replication-quick.json"
    plan, path = rep.parse_args(["--part", "2", "--runs", "5"])
    assert plan.parts == [2] and plan.failover_runs == 5 and plan.failover_timeouts == [2.0, 5.0]
    assert path.name == "replication.json"
    with pytest.raises(SystemExit):
        rep.parse_args(["--runs", "0"])


def test_primary_settings_name_the_standby_and_hba_allows_replication_only_when_asked() -> None:
    settings = pg_standby.sync_primary_settings("standby1")
    assert settings["synchronous_standby_names"] == "FIRST 1 (standby1)"
    with pytest.raises(ValueError):
        pg_standby.sync_primary_settings("x'); drop")
    assert "replication" not in pgh.render_hba("bench")
    rules = [line.split() for line in pgh.render_hba("bench", replication=True).splitlines()]
    assert ["host", "replication", "bench", "127.0.0.1/32", "trust"] in rules


def test_cpu_of_processes_reads_proc() -> None:
    sum(i * i for i in range(200_000))  # some CPU for this process to have used
    own = process_cpu([os.getpid()])
    assert own > 0
    assert tree_cpu([os.getpid()]) >= own  # itself and its children
    assert process_cpu([2**22 + 7]) == 0  # no such process: counts nothing


def test_tree_cpu_keeps_the_time_of_reaped_children() -> None:
    """A child that burnt CPU and was waited for (a parallel query worker of the
    postmaster) still counts: its time moved to the parent's reaped children's."""
    import resource
    import subprocess
    import sys

    def children() -> float:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    before, children0 = tree_cpu([os.getpid()]), children()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    burnt = children() - children0
    assert burnt > 0.05  # the child did use CPU
    # /proc counts in 10 ms ticks, rusage in microseconds: one tick of slack each way.
    assert tree_cpu([os.getpid()]) - before >= burnt - 0.02


@pytest.mark.slow
def test_standby_is_synchronous_and_applies_the_primarys_commits() -> None:
    if pgh.find_binaries() is None:
        pytest.skip("PostgreSQL server binaries absent: apt-get install -y postgresql")
    primary = pgh.PostgresServer(pg_standby.sync_primary_settings(), replication=True)
    with primary, pg_standby.StandbyServer(primary) as standby:
        assert standby.wait_sync() == {"state": "streaming", "sync_state": "sync"}
        with primary.connect() as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
            conn.execute("SET synchronous_commit = remote_apply")
            conn.execute("INSERT INTO t VALUES (1)")
        with standby.connect() as conn:  # applied there before the commit returned
            assert conn.execute("SELECT id FROM t").fetchall() == [(1,)]
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        tmp = standby.tmp
        assert tmp is not None and tmp.exists()
    assert not tmp.exists()
