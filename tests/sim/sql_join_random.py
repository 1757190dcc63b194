"""One randomised join-shaped query per seed, the exchange join's shape (decision 0135): two
sides' leaves hash-partitioned into joiners on several members, each joiner reading its
build edge whole before its probe edge, and a root that takes the joiners' streams merged
(rows) or each alone (``by_sender``, a merge of sorted runs), with or without a LIMIT.

Drawn per seed: 2-4 members; which of them run each side and the joiners; rows per side
(none at all: an empty side); how many partitions get rows (the others see only the end of
each stream); a window near its minimum, batch sizes and padding, so senders block on
credit; a slow root; and one disturbance: none, the caller closing mid-build, a side's leaf
failing, a leaf hung (the statement's timeout ends it), a stray cancel inside a leaf, or a
participant wrongly suspecting the initiator.

Whatever happens the query ends: undisturbed with its exact rows (the first ``limit`` by
``i`` for a sorted top, any ``limit`` of them for a plain LIMIT), disturbed with the error
its disturbance names; bytes in flight stayed within the window on every stream; every
member frees all its state; at most 2N cancels.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

from sql_protocol_checkers import check_cancel_messages, check_rows
from sql_protocol_harness import SIM_CONFIG, Harness, drain_disturbed, emitted_rows, join_plan

from shardex.errors import ErrorCode
from shardex.sim import FaultConfig, Simulation, run_simulation

ACTIONS = ("none", "none", "none", "close", "fail", "hang", "stray", "suspect")
EXPECTED_CODES = {
    "close": {ErrorCode.QUERY_CANCELLED},
    "fail": {ErrorCode.EXPRESSION_EVAL},
    "hang": {ErrorCode.QUERY_CANCELLED},  # the statement's timeout
    "stray": {ErrorCode.INTERNAL},
    "suspect": {ErrorCode.QUERY_CANCELLED},
}
EXPECTED_REASONS = {
    "hang": "timeout",
    "stray": "fragment_cancelled",
    "suspect": "initiator_suspected",
}
HANG_TIMEOUT = 2.0


def faults(seed: int) -> FaultConfig:
    rng = random.Random(f"sqljoin-faults/{seed}")
    return FaultConfig(latency_mean=rng.choice([0.0005, 0.002, 0.01]), latency_max=0.05)


def _side(rng: random.Random, members: list[str]) -> list[str]:
    return sorted(rng.sample(members, rng.randrange(1, len(members) + 1)))


def expected(build: list[str], probe: list[str], build_args: Any, probe_args: Any) -> list[Any]:
    keys = {r["i"] for k, m in enumerate(build) for r in emitted_rows(m, k, build_args)}
    return [
        r for k, m in enumerate(probe) for r in emitted_rows(m, k, probe_args) if r["i"] in keys
    ]


async def scenario(sim: Simulation) -> dict[str, Any]:
    rng = sim.rng
    h = Harness(sim)
    members = [f"m{i}" for i in range(1, rng.randrange(2, 5) + 1)]
    await h.start(*members)
    build, probe, joiners = _side(rng, members), _side(rng, members), _side(rng, members)
    emit = {
        "rows": rng.choice([0, *(rng.randrange(1, 400) for _ in range(3))]),
        "batch_rows": rng.randrange(1, 60),
        "pad": rng.randrange(0, 120),
        "parts": rng.choice([None, None, rng.randrange(1, len(joiners) + 1)]),
    }
    shape = rng.choice(["rows", "sorted", "all"])
    limit = rng.randrange(1, 40) if shape != "all" else None
    join_args = {"limit": limit, "sorted": shape == "sorted"}
    root_kind = "merge" if shape == "sorted" else ("take" if limit else "collect")
    root_args: dict[str, Any] = {"limit": limit} if limit else {}
    if rng.random() < 0.3:
        root_args["delay"] = rng.choice([0.001, 0.01])
    plan = join_plan(
        "m1",
        joiners,
        build,
        probe,
        build_rows=rng.choice([0, *(rng.randrange(1, 400) for _ in range(3))]),
        build_exchange="hash",
        root_kind=root_kind,
        root_args=root_args,
        join_args=join_args,
        **emit,
    )
    probe_args, build_args = plan.fragments[2].args, plan.fragments[3].args
    action = rng.choice(ACTIONS)
    side_args, side = rng.choice([(build_args, build), (probe_args, probe)])
    victim = rng.choice(side)
    if action == "fail":
        side_args.update(fail_on=[victim], fail_after=rng.randrange(0, 3))
    elif action == "hang":
        side_args.update(hang_on=[victim])
    elif action == "stray":
        side_args.update(cancel_on=[victim], fail_after=rng.randrange(0, 3))
    others = sorted(set(build + probe + joiners) - {"m1"})  # participants but the initiator
    if action == "suspect" and not others:
        action = "none"
    if action == "suspect":  # the build side waits until the suspicion was acted on
        build_args["gate"] = "suspected"
    window = rng.choice([4096, 5000, 8192, 32768])
    timeout = HANG_TIMEOUT if action == "hang" else SIM_CONFIG.timeout
    result = await h.services["m1"].execute(plan, timeout=timeout, window=window)

    async def disturb() -> None:
        await asyncio.sleep(rng.random() * 0.02)
        if action == "close":
            await result.aclose()
        elif action == "suspect":
            suspecting = rng.choice(others)
            h.directory.suspected.add((suspecting, "m1"))
            # the member's watch acted: it holds nothing of the initiator's any more
            registry = h.services[suspecting].registry
            await h.until(lambda: "m1" not in registry.held_for_others())
            h.gate("suspected").set()

    rows, error = await drain_disturbed(result, disturb)
    h.directory.suspected.clear()
    if error is None:
        _check_result(rows, expected(build, probe, build_args, probe_args), shape, limit)
    if action == "none":
        assert error is None, error
    elif error is not None:
        assert error.code in EXPECTED_CODES[action], (action, error)
        reason = EXPECTED_REASONS.get(action)
        assert reason is None or error.details.get("reason") == reason, (action, error)
    check_cancel_messages(h.every_service, participants=len(set(build + probe + joiners + ["m1"])))
    stalled = any(st.stalls for st in h.meter.streams.values())  # a sender waited on credit
    await h.finish()
    return {
        "action": action,
        "error": None if error is None else error.code.value,
        "shape": shape,
        "stalled": stalled,
    }


def _check_result(
    rows: list[dict[str, Any]], want: list[dict[str, Any]], shape: str, limit: int | None
) -> None:
    for row in rows:
        row.pop("at")
    if shape == "all":
        check_rows(rows, want)
    elif shape == "sorted":
        assert [r["i"] for r in rows] == sorted(r["i"] for r in want)[:limit], "sorted top"
    else:
        assert limit is not None and len(rows) == min(limit, len(want)), (len(rows), limit)
        got = Counter(tuple(sorted(r.items())) for r in rows)
        have = Counter(tuple(sorted(r.items())) for r in want)
        assert not got - have, "a row that is not the join's, or one twice"


def run_random(seed: int) -> dict[str, Any]:
    return run_simulation(scenario, seed, faults(seed))
