"""One randomised SQL-protocol scenario per seed: a random plan over 2-4 members, a random
window, latency and one random disturbance (none, caller close, fragment failure, a leaf
killed or silently lost, a hung leaf hitting the timeout, the initiator lost, lossy links).

Whatever happens: if the query was left alone its rows are exact; otherwise it ends in a
clear error of the expected kind; bytes in flight stayed within the window; every live
member frees all its state.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from sql_protocol_checkers import check_cancel_messages, check_rows
from sql_protocol_harness import (
    SIM_CONFIG,
    Harness,
    chain_plan,
    drain_disturbed,
    expected_gather,
    gather_plan,
)

from shardex.errors import ErrorCode
from shardex.sim import FaultConfig, Simulation, run_simulation
from shardex.sql.protocol import QueryPlan

ACTIONS = ("none", "none", "none", "close", "fail", "kill", "silent", "hang", "initiator", "lossy")

# What the caller may see for each disturbance.
EXPECTED_CODES = {
    "close": {ErrorCode.QUERY_CANCELLED},  # "closed by the caller", if it was still running
    "fail": {ErrorCode.EXPRESSION_EVAL, ErrorCode.QUERY_CANCELLED},
    "kill": {ErrorCode.QUERY_CANCELLED},
    "silent": {ErrorCode.QUERY_CANCELLED},
    "hang": {ErrorCode.QUERY_CANCELLED},
    "initiator": {ErrorCode.QUERY_CANCELLED, ErrorCode.NODE_UNAVAILABLE},
    "lossy": {ErrorCode.QUERY_CANCELLED, ErrorCode.CONNECTION_CLOSED, ErrorCode.PROTOCOL_ERROR},
}


def faults(seed: int) -> FaultConfig:
    rng = random.Random(f"sqlproto-faults/{seed}")
    return FaultConfig(latency_mean=rng.choice([0.0005, 0.002, 0.01]), latency_max=0.05)


def make_plan(rng: random.Random, members: list[str]) -> tuple[QueryPlan, list[str], dict, Any]:
    emit: dict[str, Any] = {
        "rows": rng.randrange(0, 300),
        "batch_rows": rng.randrange(1, 60),
        "pad": rng.randrange(0, 80),
    }
    leaves = sorted(rng.sample(members, rng.randrange(1, len(members) + 1)))
    if rng.random() < 0.5:
        return gather_plan("m1", leaves, **emit), leaves, emit, None
    middle = rng.choice(members)
    mod = rng.randrange(1, 4)
    return chain_plan("m1", middle, leaves, mod=mod, **emit), leaves, emit, mod


async def scenario(sim: Simulation) -> dict[str, Any]:
    rng = sim.rng
    h = Harness(sim)
    members = [f"m{i}" for i in range(1, rng.randrange(2, 5) + 1)]
    await h.start(*members)
    plan, leaves, emit, mod = make_plan(rng, members)
    action = rng.choice(ACTIONS)
    others = [m for m in members if m != "m1"]
    victim = rng.choice(others)
    leaf_args = plan.fragments[-1].args  # the emit fragment's own dict
    if action == "fail":
        leaf_args.update(fail_on=[rng.choice(leaves)], fail_after=rng.randrange(0, 3))
    if action == "hang":
        leaf_args.update(hang_on=[rng.choice(leaves)])
    if action == "lossy":
        sim.config.drop_rate = 0.01
    if rng.random() < 0.3:
        plan.fragments[0].args["delay"] = rng.choice([0.001, 0.01])
    window = rng.choice([4096, 6000, 8192, 32768])
    timeout = 2.0 if action == "hang" else SIM_CONFIG.timeout
    result = await h.services["m1"].execute(plan, timeout=timeout, window=window)

    async def disturb() -> None:
        await asyncio.sleep(rng.random() * 0.02)
        if action in ("kill", "silent"):
            await h.crash(victim, power_off=action == "silent")
            await asyncio.sleep(3.0)
            h.directory.down[victim] = True
        elif action == "initiator":
            await h.crash("m1", power_off=rng.random() < 0.5)
            await asyncio.sleep(3.0)
            h.directory.down["m1"] = True
        elif action == "close":
            await result.aclose()

    rows, error = await drain_disturbed(result, disturb)
    sim.config.drop_rate = 0.0
    if error is None:
        # Finished before any disturbance hit (or nothing hit): every row, exactly once.
        expected = expected_gather(leaves, **emit)
        if mod is not None:
            expected = [r for r in expected if r["i"] % mod == 0]
        check_rows(rows, expected)
    if action == "none":
        assert error is None, error
    if error is not None:
        assert action != "none" and error.code in EXPECTED_CODES[action], (action, error)
    check_cancel_messages(h.every_service, participants=len(members))
    await h.finish()
    return {"action": action, "error": None if error is None else error.code, "rows": len(rows)}


def run_random(seed: int) -> dict[str, Any]:
    return run_simulation(scenario, seed, faults(seed))
