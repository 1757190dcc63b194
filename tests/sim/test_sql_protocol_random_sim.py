"""Randomised SQL-protocol scenarios (``sql_protocol_random``): a few hundred seeds in the
default run, more with ``-m slow`` (``SHARDEX_SIM_SEEDS`` / ``SHARDEX_SIM_SEED_BASE``); a
failing seed replays exactly with ``SHARDEX_SIM_SEED=N``."""

from __future__ import annotations

from collections import Counter

import pytest
from sql_protocol_harness import each_seed
from sql_protocol_random import run_random, scenario

from shardex.sim import assert_deterministic, many_seeds, sim_seeds


def test_random_seeds() -> None:
    outcomes: Counter[str] = Counter()
    for out in each_seed(run_random, sim_seeds(200)):
        outcomes[out["action"] if out["error"] is None else f"{out['action']}:{out['error']}"] += 1
    if len(outcomes) > 1:  # not pinned to one seed: every kind of disturbance really happened
        for kind in ("none", "fail:", "kill:", "silent:", "hang:", "initiator:"):
            assert any(k.startswith(kind) for k in outcomes), (kind, outcomes)


@pytest.mark.slow
@pytest.mark.parametrize("seed", many_seeds(2000))
def test_random_seeds_many(seed: int) -> None:
    run_random(seed)


def test_a_random_seed_replays_exactly() -> None:
    from sql_protocol_random import faults

    assert_deterministic(scenario, 7, lambda: faults(7))
