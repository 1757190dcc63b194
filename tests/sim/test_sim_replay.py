"""A seed determines the run: same seed, same trace (even in another process with another hash
seed); different seed, different trace; a failure says which seed and how to replay it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from echo_scenario import chatter_trace, echo
from rpc_scenario import run_sim

from shardex.sim import Simulation, many_seeds, sim_seeds
from shardex.sim.testing import ENV_SEED, ENV_SEED_BASE, ENV_SEEDS

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def test_same_seed_gives_an_identical_trace() -> None:
    first, second = chatter_trace(11), chatter_trace(11)
    assert len(first.trace) > 100
    assert first.trace.events == second.trace.events
    assert first.trace.digest == second.trace.digest
    kinds = {e.kind for e in first.trace}
    assert {"send", "deliver", "partition", "heal", "crash", "restart"} <= kinds


def test_different_seeds_give_different_traces() -> None:
    digests = {chatter_trace(seed).trace.digest for seed in range(5)}
    assert len(digests) == 5


def test_replay_in_other_processes_with_other_hash_seeds() -> None:
    """What a replay really is: a new interpreter, new addresses, new str hashes."""
    seed = 7
    expected = [chatter_trace(seed).trace.digest, run_sim(seed)[1].trace.digest]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import echo_scenario as e, rpc_scenario as r;"
        f"print(e.chatter_trace({seed}).trace.digest); print(r.run_sim({seed})[1].trace.digest)"
    )
    # One other process (each costs an interpreter start); its str hash seed differs from ours
    # unless PYTHONHASHSEED is pinned to this very value.
    for hash_seed in ("4242",):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", code, str(HERE)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert out.stdout.split() == expected, out.stderr[-2000:]


def test_a_failure_names_its_seed_and_the_replay_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def failing(sim: Simulation) -> None:
        await sim.network.transport("s1").listen("s1:7000", echo)
        comm = await sim.network.transport("c1").connect("s1:7000", 1.0)
        await comm.write(b"x")
        await comm.read()
        raise AssertionError("invariant violated")

    with pytest.raises(AssertionError, match="invariant violated") as info:
        Simulation(42).run(failing)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    printed = capsys.readouterr().out
    for text in (notes, printed):
        assert "seed=42" in text
        assert f"{ENV_SEED}=42" in text
        assert "tests/sim/test_sim_replay.py::test_a_failure_names_its_seed" in text
        assert "deliver" in text  # the tail of the trace


def test_seed_selection_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SEED, raising=False)
    monkeypatch.delenv(ENV_SEEDS, raising=False)
    monkeypatch.delenv(ENV_SEED_BASE, raising=False)
    assert sim_seeds(3) == [0, 1, 2]
    assert len(many_seeds(50)) == 50
    monkeypatch.setenv(ENV_SEEDS, "7")
    monkeypatch.setenv(ENV_SEED_BASE, "100")
    assert many_seeds() == list(range(100, 107))
    monkeypatch.setenv(ENV_SEED, "1234")
    assert sim_seeds(3) == [1234]
    assert many_seeds() == [1234]
