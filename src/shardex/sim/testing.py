"""Seeds for tests and the replay recipe printed when one fails.

- ``SHARDEX_SIM_SEED=N`` pins every simulation test to seed ``N`` (replay a failure).
- ``SHARDEX_SIM_SEEDS=K`` sets how many seeds the slow many-seed tests run.
- ``SHARDEX_SIM_SEED_BASE=B`` starts those seeds at ``B`` (explore fresh seeds in CI).
"""

from __future__ import annotations

import os
import re

ENV_SEED = "SHARDEX_SIM_SEED"
ENV_SEEDS = "SHARDEX_SIM_SEEDS"
ENV_SEED_BASE = "SHARDEX_SIM_SEED_BASE"


def _pinned() -> int | None:
    value = os.environ.get(ENV_SEED)
    return int(value) if value not in (None, "") else None


def sim_seeds(count: int = 5, base: int = 0) -> list[int]:
    """Seeds for ``pytest.mark.parametrize``: ``count`` from ``base``, or the pinned one."""
    pinned = _pinned()
    return [pinned] if pinned is not None else list(range(base, base + count))


def many_seeds(default: int = 200) -> list[int]:
    """Seeds for a slow exploration test (``SHARDEX_SIM_SEEDS`` / ``SHARDEX_SIM_SEED_BASE``)."""
    pinned = _pinned()
    if pinned is not None:
        return [pinned]
    count = int(os.environ.get(ENV_SEEDS) or default)
    base = int(os.environ.get(ENV_SEED_BASE) or 0)
    return list(range(base, base + count))


def current_test_id() -> str | None:
    """The running pytest node id without its parameters (``file::test``), if any."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    if not current:
        return None
    node = current.rsplit(" (", 1)[0]
    return re.sub(r"\[.*\]$", "", node)


def replay_hint(seed: int) -> str:
    """The command that re-runs the current test with ``seed`` only."""
    test = current_test_id() or "tests/sim"
    return f"{ENV_SEED}={seed} .venv/bin/python -m pytest '{test}' -m '' -q"
