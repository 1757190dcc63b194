"""Broadcast and hash-partitioned exchanges between non-initiator fragments, under the
simulator: a fragment on several members, fed by every sender, a fragment with two inputs,
and the same credit, cancel and cleanup rules as a gather (``Harness.finish`` checks bytes
in flight against the window on every stream, sender to each receiver, and that all state
is freed). Replay any failure with ``SHARDEX_SIM_SEED=N``."""

from __future__ import annotations

from collections import Counter

import pytest
from sql_join_random import run_random
from sql_protocol_checkers import check_cancel_messages, check_rows
from sql_protocol_harness import (
    Harness,
    drain,
    drain_error,
    each_seed,
    emitted_rows,
    expected_gather,
    gather_plan,
    join_plan,
    message,
    partition_plan,
    run_scenario,
)

from shardex.errors import ErrorCode
from shardex.sim import many_seeds, sim_seeds
from shardex.sql.protocol import QueryExecute

SEEDS = sim_seeds(3)


run = run_scenario


@pytest.mark.parametrize("seed", SEEDS)
def test_a_hash_exchange_sends_each_row_to_its_partition_only(seed: int) -> None:
    """emit on m2 and m3 -> hash -> tag on m1, m2, m3 (each sender also a reader: streams
    to itself are dispatched in place) -> root on m1."""
    emit = {"rows": 500, "batch_rows": 40, "pad": 40}
    readers = ["m1", "m2", "m3"]

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        result = await h.services["m1"].execute(partition_plan("m1", readers, ["m2", "m3"], **emit))
        got = await drain(result)
        for row in got:
            assert readers.index(row.pop("at")) == row["i"] % 3, row
        check_rows(got, expected_gather(["m2", "m3"], **emit))
        q = result.query_id
        edge2 = {k[2:]: st for k, st in h.meter.streams.items() if k[0] == q and k[1] == 2}
        # One stream per sender and reader, each under the window (``finish``); the window
        # really limited them (the flow checker is not vacuous).
        assert set(edge2) == {(s, r) for s in ("m2", "m3") for r in readers}
        assert sum(st.stalls > 0 for st in edge2.values()) >= 3, edge2

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_fragment_joins_a_broadcast_input_with_a_partitioned_one(seed: int) -> None:
    """build: emit on m3, broadcast to the joiners m2 and m3; probe: emit on m2 and m3,
    hashed among them; each joiner holds the whole build side and sees its probe rows."""
    emit = {"rows": 300, "batch_rows": 25, "pad": 30}
    joiners = ["m2", "m3"]

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        plan = join_plan("m1", joiners, ["m3"], ["m2", "m3"], build_rows=120, **emit)
        got = await drain(await h.services["m1"].execute(plan))
        for row in got:
            assert joiners.index(row.pop("at")) == row["i"] % 2, row
        expected = [r for r in expected_gather(["m2", "m3"], **emit) if r["i"] < 120]
        check_rows(got, expected)

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_failing_partitioned_sender_cancels_every_member(seed: int) -> None:
    emit = {"rows": 400, "batch_rows": 20, "fail_on": ["m3"], "fail_after": 3}

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3", "m4")
        plan = join_plan("m1", ["m2", "m4"], ["m3"], ["m2", "m3"], build_rows=50, **emit)
        error = await drain_error(await h.services["m1"].execute(plan))
        assert error.code is ErrorCode.EXPRESSION_EVAL and error.details["member"] == "m3"
        check_cancel_messages(h.every_service, participants=4)

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_batch_to_a_partition_before_its_execute_is_held(seed: int) -> None:
    """m4 joins; its execute is held while m2's partitioned batches for it arrive: m4 keeps
    them (within the window, the senders blocked) and joins them once it starts."""
    emit = {"rows": 300, "batch_rows": 20, "pad": 20}

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3", "m4")
        held = h.interceptor.hold(message(QueryExecute, "m1", "m4"))
        plan = join_plan("m1", ["m3", "m4"], ["m2"], ["m2"], build_rows=300, **emit)
        result = await h.services["m1"].execute(plan)
        m4 = h.services["m4"].registry
        await h.until(lambda: m4.pending_bytes > 0)
        assert m4.stats["executions_started"] == 0
        held.release.set()
        got = await drain(result)
        for row in got:
            row.pop("at")
        check_rows(got, expected_gather(["m2"], **emit))
        assert m4.stats["batches_held"] > 0
        assert h.interceptor.rules[0].hits == 1

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_reader_takes_each_sender_alone(seed: int) -> None:
    """A gather from a fragment on three members, read sender by sender: each run holds one
    sender's rows in its order (what a merge of sorted runs needs), however the batches of
    the senders interleave on arrival."""
    emit = {"rows": 200, "batch_rows": 15, "pad": 20}
    senders = ["m2", "m3", "m4"]

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3", "m4")
        plan = gather_plan("m1", senders, root_kind="runs", **emit)
        got = await drain(await h.services["m1"].execute(plan))
        for run, member in enumerate(senders):
            mine = [r["i"] for r in got if r["run"] == run]
            assert mine == [r["i"] for r in emitted_rows(member, run, emit)]
        for row in got:
            row.pop("run")
        check_rows(got, expected_gather(senders, **emit))

    run(scenario, seed)


def test_random_join_shaped_queries_end_with_their_rows_or_a_clear_error() -> None:
    """``sql_join_random``: a few hundred seeds of the exchange join's shape (empty sides
    and partitions, early-stopping joiners, sorted runs merged sender by sender, windows
    near the minimum) with one disturbance each; replay a seed with SHARDEX_SIM_SEED=N."""
    outcomes: Counter[str] = Counter()
    for out in each_seed(run_random, sim_seeds(150)):
        outcomes[f"{out['action']}:{out['error']}"] += 1
        outcomes[out["shape"]] += 1
        outcomes[f"{out['shape']} stalled"] += out["stalled"]
    if len(outcomes) > 2:  # not pinned to one seed: each disturbance really hit some query
        for kind in ("close:", "fail:", "hang:", "stray:", "suspect:", "rows", "sorted", "all"):
            assert any(k.startswith(kind) and "None" not in k for k in outcomes), (kind, outcomes)
        # Senders really waited on credit, with every shape (early stops included).
        for shape in ("rows", "sorted", "all"):
            assert outcomes[f"{shape} stalled"] > 0, outcomes


@pytest.mark.slow
@pytest.mark.parametrize("seed", many_seeds(2000))
def test_random_join_shaped_queries_many(seed: int) -> None:
    run_random(seed)
