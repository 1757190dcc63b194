"""Documents stay linearizable (each one a CAS register) through an automatic failover.

Three full nodes (manager + data, ``failover_harness.py``) hold a keyspace with two replicas
per partition; clients beside each node read, upsert and compare-and-swap at durability
``majority``. The node holding the documents' active copies is cut off with its client by a
partition (or powered off); the majority fails it over by itself and keeps serving on the
promoted replicas while the cut-off client keeps calling the isolated node; the partition
heals, the node is recovered. ``shardex.testing.linearizability.check`` judges the recorded
history. Without the serving lease the isolated node answers stale reads: the negative
control requires the checker to say so. A failing seed replays with ``SHARDEX_SIM_SEED=N``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from failover_harness import CLIENTS, Params, Run, failover_scenario, ok_writes_inside

from shardex.sim import FaultConfig, Simulation, many_seeds, run_simulation, sim_seeds
from shardex.testing.linearizability import Result, check


def run(seed: int, params: Params | None = None, fault: str = "partition") -> Run:
    async def main(sim: Simulation) -> Run:
        return await failover_scenario(sim, params or Params(), fault)

    return run_simulation(main, seed, FaultConfig())


def checked(r: Run, tmp_path: Path) -> Result:
    result = check(r.cluster.history)
    if not result.ok:
        dump = tmp_path / "history.jsonl"
        r.cluster.history.dump(dump)
        print(f"history saved to {dump}")
    return result


def assert_scenario_happened(r: Run) -> None:
    counts = r.cluster.counts.by_status
    assert counts.get("ok", 0) >= 50, counts
    assert r.failed_over_at - r.cut_at < 10, (r.cut_at, r.failed_over_at)
    # the majority side kept acknowledging writes once it had failed the node over
    majority = [h for h, n in CLIENTS.items() if n != r.victim]
    after = [
        o
        for o in r.cluster.history.operations()
        if str(o.process).split("/")[0] in majority
        and o.op in ("write", "cas")
        and o.status == "ok"
        and r.failed_over_at * 1e9 <= o.invoke_ns
        and o.complete_ns is not None
        and o.complete_ns <= r.healed_at * 1e9
    ]
    assert after, "no write acknowledged on the majority side after the failover"


@pytest.mark.parametrize("seed", sim_seeds(5))
def test_partition_failover_is_linearizable(seed: int, tmp_path: Path) -> None:
    r = run(seed)
    assert_scenario_happened(r)
    minority = [h for h, n in CLIENTS.items() if n == r.victim]
    for client in minority:
        acked = ok_writes_inside(r.cluster.history, client, r.cut_at, r.healed_at)
        assert not acked, f"writes acknowledged on the cut-off side: {acked}"
    checked(r, tmp_path).assert_linearizable()


@pytest.mark.parametrize("seed", sim_seeds(3))
def test_power_off_failover_is_linearizable(seed: int, tmp_path: Path) -> None:
    r = run(seed, fault="power_off")
    assert_scenario_happened(r)
    checked(r, tmp_path).assert_linearizable()


def test_without_the_lease_the_checker_finds_stale_reads(tmp_path: Path) -> None:
    """Negative control: the isolated node serves without the lease; reads there return
    values the promoted side has overwritten, and the checker must say so."""
    r = run(0, Params(lease=False))
    result = check(r.cluster.history)
    assert not result.ok, "no violation found with the lease disabled"


@pytest.mark.slow
@pytest.mark.parametrize("seed", many_seeds(30))
def test_partition_failover_is_linearizable_many_seeds(seed: int, tmp_path: Path) -> None:
    checked(run(seed), tmp_path).assert_linearizable()


@pytest.mark.slow
@pytest.mark.parametrize("seed", many_seeds(15))
def test_power_off_failover_is_linearizable_many_seeds(seed: int, tmp_path: Path) -> None:
    checked(run(seed, fault="power_off"), tmp_path).assert_linearizable()
