"""The checker on generated histories: from a real register they must pass; with one read
made to return a value that was never current in its window they must fail."""

from __future__ import annotations

import random

import pytest

from shardex.testing.linearizability import Verdict, check
from tests.unit.testing.register_workload import generate, stale_read, unwritten_read

SEEDS = range(40)


def _shape(rng: random.Random) -> dict[str, int]:
    return {
        "processes": rng.randint(2, 6),
        "ops": rng.randint(20, 200),
        "keys": rng.randint(1, 4),
    }


@pytest.mark.parametrize("seed", SEEDS)
def test_histories_of_a_real_register_are_linearizable(seed: int) -> None:
    rng = random.Random(seed)
    ops = generate(rng, **_shape(rng), ambiguous=0.1)
    check(ops).assert_linearizable()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_stale_read_is_found(seed: int) -> None:
    rng = random.Random(1000 + seed)
    mutated = None
    while mutated is None:
        mutated = stale_read(generate(rng, **_shape(rng), ambiguous=0.1), rng)
    result = check(mutated)
    assert result.verdict is Verdict.VIOLATION, result.describe()
    assert len(result.violations()) == 1  # keys are independent: only the mutated one


@pytest.mark.parametrize("seed", SEEDS)
def test_a_read_of_a_value_never_written_is_found(seed: int) -> None:
    rng = random.Random(2000 + seed)
    mutated = None
    while mutated is None:
        mutated = unwritten_read(generate(rng, **_shape(rng), ambiguous=0.1), rng)
    assert check(mutated).verdict is Verdict.VIOLATION


def test_five_processes_two_thousand_operations_twenty_keys() -> None:
    rng = random.Random(7)
    ops = generate(rng, processes=5, ops=2000, keys=20, ambiguous=0.05)
    result = check(ops)
    result.assert_linearizable()
    assert len(result.keys) == 20
    mutated = stale_read(ops, rng)
    assert mutated is not None
    assert check(mutated).verdict is Verdict.VIOLATION


def test_the_generator_makes_every_kind_of_outcome() -> None:
    # the tests above mean something only if the histories hold these
    rng = random.Random(3)
    ops = generate(rng, processes=5, ops=2000, keys=20, ambiguous=0.05)
    outcomes = {(o.op, o.status, o.result if o.status == "fail" else None) for o in ops}
    for needed in [
        ("read", "ok", None),
        ("write", "ok", None),
        ("write", "info", None),
        ("write", "fail", "DURABILITY_IMPOSSIBLE"),
        ("cas", "ok", None),
        ("cas", "fail", "mismatch"),
        ("cas", "info", None),
        ("delete", "ok", None),
    ]:
        assert needed in outcomes
    assert any(o.status is None for o in ops)
