"""The SQL execution protocol under the simulator: every message order the specification discusses.

Each scenario runs real ``QueryService`` members over ``SimNetwork`` (``sql_protocol_harness``)
and ends with ``Harness.finish``: bytes in flight never above the credit window on any
stream, and all state (executions, initiated queries, held batches, tombstones, protocol
tasks) freed on every live member. Message orders are forced with the harness's
``Interceptor`` (hold or drop a message before it leaves its member), never with sleeps.
Replay any failure with ``SHARDEX_SIM_SEED=N``.
"""

from __future__ import annotations

import asyncio

import pytest
from sql_protocol_checkers import check_cancel_messages, check_rows
from sql_protocol_harness import (
    Harness,
    chain_plan,
    drain,
    drain_error,
    expected_gather,
    gather_plan,
    message,
    run_scenario,
)

from shardex.errors import ErrorCode, ShardexError
from shardex.sim import Simulation, run_simulation, sim_seeds
from shardex.sql.protocol import QueryBatch, QueryCancel, QueryExecute

SEEDS = sim_seeds(3)


run = run_scenario


def cancels(h: Harness) -> int:
    return sum(s.sent["QueryCancel"] for s in h.every_service)


def stat(h: Harness, host: str, name: str) -> int:
    return h.services[host].registry.stats[name]


@pytest.mark.parametrize("seed", SEEDS)
def test_execute_before_batches_delivers_every_row_within_the_window(seed: int) -> None:
    emit = {"rows": 600, "batch_rows": 40, "pad": 30}

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        result = await h.services["m1"].execute(gather_plan("m1", ["m2", "m3"], **emit))
        check_rows(await drain(result), expected_gather(["m2", "m3"], **emit))
        assert result.metrics.rows == 1200
        # The window really constrained the senders (the flow checker is not vacuous).
        streams = list(h.meter.streams.values())
        assert all(st.stalls > 0 for st in streams), streams
        assert max(st.max_in_flight for st in streams) > h.config.window // 2
        assert cancels(h) == 0

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_three_fragments_with_the_initiator_also_a_leaf(seed: int) -> None:
    """emit on m3 and m1 -> keep_multiples on m2 -> root on m1 (m1 sends to m2 and m2 to m1)."""
    emit = {"rows": 300, "batch_rows": 25}

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        result = await h.services["m1"].execute(chain_plan("m1", "m2", ["m3", "m1"], mod=3, **emit))
        expected = [r for r in expected_gather(["m3", "m1"], **emit) if r["i"] % 3 == 0]
        check_rows(await drain(result), expected)

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_batches_before_execute_are_held_then_consumed(seed: int) -> None:
    """Snippet 14: m3's batches reach m2 before m2's execute; m2 keeps them (bounded by the
    window, since no credits come before the execute) and consumes them once it starts."""
    emit = {"rows": 400, "batch_rows": 20, "pad": 10}

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        held = h.interceptor.hold(message(QueryExecute, "m1", "m2"))
        result = await h.services["m1"].execute(chain_plan("m1", "m2", ["m3"], mod=1, **emit))
        m2 = h.services["m2"].registry
        await h.until(
            lambda: m2.pending and h.meter.streams[(result.query_id, 2, "m3", "m2")].stalls
        )
        assert 0 < m2.pending_bytes <= h.config.window  # the sender is blocked on credits
        assert m2.stats["executions_started"] == 0
        held.release.set()
        check_rows(await drain(result), expected_gather(["m3"], **emit))
        assert m2.stats["batches_held"] > 0

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_cancel_before_execute_makes_the_late_execute_a_no_op(seed: int) -> None:
    """m3's fragment fails at once; its cancel goes to m1, which broadcasts to m2 while m2's
    execute is still held; the execute that arrives afterwards starts nothing."""

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        held = h.interceptor.hold(message(QueryExecute, "m1", "m2"))
        plan = chain_plan("m1", "m2", ["m3"], mod=1, rows=50, fail_on=["m3"], fail_after=0)
        result = await h.services["m1"].execute(plan)
        error = await drain_error(result)
        assert error.code is ErrorCode.EXPRESSION_EVAL and error.details["member"] == "m3"
        m2 = h.services["m2"].registry
        await h.until(lambda: m2.is_tombstoned(result.query_id))
        held.release.set()
        await h.until(lambda: m2.stats["executes_ignored"] == 1)
        assert m2.stats["executions_started"] == 0 and not m2.executions
        assert cancels(h) == 2  # m3 -> m1, m1 -> m2 (m3 is not told again)

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_batch_racing_the_cancel_is_discarded(seed: int) -> None:
    """Snippet 13: m2's batch is on the wire when m1 cancels; it arrives after the cancel
    and is dropped; m2 learns of the cancel afterwards and stops."""
    emit = {"rows": 500, "batch_rows": 10}

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        in_flight = h.interceptor.hold(
            lambda s, d, m: s == "m2" and isinstance(m, QueryBatch) and m.seq == 3
        )
        late_cancel = h.interceptor.hold(message(QueryCancel, "m1", "m2"))
        result = await h.services["m1"].execute(gather_plan("m1", ["m2", "m3"], **emit))
        await h.until(lambda: in_flight.hits == 1)
        await result.aclose()
        m1 = h.services["m1"].registry
        assert not m1.executions and m1.is_tombstoned(result.query_id)
        in_flight.release.set()
        await h.until(lambda: m1.stats["batches_discarded"] >= 1)
        assert result.query_id in h.services["m2"].registry.executions  # not told yet
        late_cancel.release.set()
        await h.until(lambda: not h.services["m2"].registry.executions)

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_several_participants_cancelling_at_once_cost_at_most_2n_messages(seed: int) -> None:
    leaves = ["m2", "m3", "m4", "m5"]

    async def scenario(h: Harness) -> None:
        await h.start("m1", *leaves)
        plan = gather_plan(
            "m1", leaves, rows=200, batch_rows=20, gate="go", fail_on=leaves, fail_after=1
        )
        result = await h.services["m1"].execute(plan)
        await h.until(lambda: all(h.services[m].registry.executions for m in leaves))
        h.gate("go").set()  # every leaf fails in the same instant
        error = await drain_error(result)
        assert error.code is ErrorCode.EXPRESSION_EVAL
        await h.settle()
        sent = check_cancel_messages(h.every_service, participants=5)
        assert sent >= len(leaves)  # each leaf asked the initiator once

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_stale_batch_is_freed_by_check(seed: int) -> None:
    """m2 never gets its execute nor the cancel (both lost); the batches m3 sent it stay
    pending until m2's check learns from m1 that the query is over."""

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        h.interceptor.drop(message(QueryExecute, "m1", "m2"))
        h.interceptor.drop(message(QueryCancel, "m1", "m2"))
        result = await h.services["m1"].execute(chain_plan("m1", "m2", ["m3"], mod=1, rows=100))
        m2 = h.services["m2"].registry
        await h.until(lambda: bool(m2.pending))
        await result.aclose()
        await h.until(lambda: not m2.pending)
        assert m2.stats["freed_by_check"] == 1
        assert m2.stats["executions_started"] == 0

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("power_off", [True, False], ids=["silent", "killed"])
def test_participant_leave_cancels_with_a_clear_error(seed: int, power_off: bool) -> None:
    """A leaf dies mid-stream. Silent (power off): only membership tells, after the failure
    timeout. Killed: the broken connections tell first. Either way a clear error."""

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3", "m4")
        plan = chain_plan("m1", "m2", ["m3", "m4"], mod=1, rows=2000, batch_rows=20)
        result = await h.services["m1"].execute(plan)
        await h.until(lambda: h.meter.streams.get((result.query_id, 2, "m3", "m2")) is not None)
        await h.crash("m3", power_off=power_off)
        await asyncio.sleep(3.0)  # the failure detector's timeout (virtual time)
        h.directory.down["m3"] = True
        error = await drain_error(result)
        assert error.code is ErrorCode.QUERY_CANCELLED
        assert error.details["member"] == "m3"
        want = "participant_left" if power_off else "link_lost"
        assert error.details["reason"] == want, error
        check_cancel_messages(h.every_service, participants=4)

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_initiator_death_frees_participants(seed: int) -> None:
    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        plan = chain_plan("m1", "m2", ["m3"], mod=1, rows=2000, batch_rows=20)
        plan.fragments[0].args["delay"] = 0.05  # slow root: the query is mid-flight
        result = await h.services["m1"].execute(plan)
        await h.until(lambda: result.metrics.rows == 0 and bool(h.services["m3"].meter.streams))
        await h.until(lambda: all(h.services[m].registry.executions for m in ("m2", "m3")))
        await h.crash("m1", power_off=True)
        sent_before = cancels(h)
        h.directory.down["m1"] = True
        for m in ("m2", "m3"):
            await h.until(lambda m=m: not h.services[m].registry.executions)
            assert h.services[m].registry.stats["freed_initiator_down"] == 1
        # Each still sends its one cancel to m1 (in case the suspicion was wrong): lost, or
        # not even sent where no link to m1 was open (the connect fails).
        assert cancels(h) <= sent_before + 2
        await drain_error(result)  # the caller died with m1; its result just ends in an error

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_participant_wrongly_suspecting_the_initiator_fails_the_query_at_once(
    seed: int,
) -> None:
    """Only m2's failure detector holds m1 down (m1 is up: its heartbeats were late). m2
    drops its part; its cancel tells m1, whose caller gets that error now, not a timeout
    after waiting on a stream nobody will end."""

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        plan = chain_plan("m1", "m2", ["m3"], mod=1, rows=2000, batch_rows=20)
        plan.fragments[0].args["delay"] = 0.05  # slow root: the query is mid-flight
        result = await h.services["m1"].execute(plan)
        await h.until(lambda: all(h.services[m].registry.executions for m in ("m2", "m3")))
        h.directory.suspected.add(("m2", "m1"))
        error = await drain_error(result)
        assert error.code is ErrorCode.QUERY_CANCELLED, error
        assert error.details["reason"] == "initiator_suspected", error
        assert error.details["member"] == "m2" and "m1" in error.message
        assert h.services["m2"].registry.stats["freed_initiator_down"] == 1
        h.directory.suspected.clear()
        check_cancel_messages(h.every_service, participants=3)

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_restarted_initiator_answers_check_and_participants_free_state(seed: int) -> None:
    """m1 crashes and comes back before the failure detector notices: the new m1 knows
    nothing of the query, so m2's check frees the batches it held for it."""

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        h.interceptor.drop(message(QueryExecute, "m1", "m2"))
        result = await h.services["m1"].execute(chain_plan("m1", "m2", ["m3"], mod=1, rows=300))
        m2 = h.services["m2"].registry
        await h.until(lambda: bool(m2.pending))
        await h.crash("m1", power_off=True)
        await h.restart("m1")
        await h.until(lambda: not m2.pending and not h.services["m3"].registry.executions)
        assert m2.stats["freed_by_check"] == 1
        await drain_error(result)

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_timeout_cancels_everywhere(seed: int) -> None:
    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        loop = asyncio.get_running_loop()
        start = loop.time()
        plan = gather_plan("m1", ["m2", "m3"], rows=100, hang_on=["m3"])
        result = await h.services["m1"].execute(plan, timeout=2.0)
        error = await drain_error(result)
        assert error.code is ErrorCode.QUERY_CANCELLED
        assert error.details["reason"] == "timeout" and error.details["timeout"] == 2.0
        assert loop.time() - start >= 2.0
        await h.until(lambda: not any(s.registry.executions for s in h.services.values()))

    run(scenario, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_root_that_stops_early_stops_the_senders(seed: int) -> None:
    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        plan = gather_plan(
            "m1", ["m2", "m3"], root_kind="take", root_args={"limit": 7}, rows=5000, batch_rows=5
        )
        result = await h.services["m1"].execute(plan)
        rows = await drain(result)
        assert len(rows) == 7
        await h.until(lambda: not any(s.registry.executions for s in h.services.values()))

    run(scenario, seed)


def test_bad_queries_are_refused_before_anything_is_sent() -> None:
    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        m1 = h.services["m1"]
        cases = {
            "unknown kind": (gather_plan("m1", ["m2"], root_kind="nope", rows=1), {}),
            "tiny window": (gather_plan("m1", ["m2"], rows=1), {"window": 100}),
            "zero timeout": (gather_plan("m1", ["m2"], rows=1), {"timeout": 0}),
            "root elsewhere": (gather_plan("m2", ["m3"], rows=1), {}),
        }
        for name, (plan, kwargs) in cases.items():
            with pytest.raises(ShardexError) as err:
                await m1.execute(plan, **kwargs)
            assert err.value.code is ErrorCode.BAD_REQUEST, name
            assert "value" in err.value.details, name
        h.directory.down["m3"] = True
        with pytest.raises(ShardexError) as err:
            await m1.execute(gather_plan("m1", ["m2", "m3"], rows=1))
        assert err.value.code is ErrorCode.NODE_UNAVAILABLE and err.value.details["value"] == "m3"
        h.directory.down["m3"] = False
        assert sum(sum(s.sent.values()) for s in h.every_service) == 0
        # The member is unharmed: the next query runs.
        rows = await drain(await m1.execute(gather_plan("m1", ["m2", "m3"], rows=5)))
        check_rows(rows, expected_gather(["m2", "m3"], rows=5))

    run(scenario, 0)


def test_a_sender_that_ignores_credits_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard against checks that cannot fail: m2 believes it has unlimited credits. The
    receiver refuses the stream (PROTOCOL_ERROR, the query fails) and the flow checker,
    given the meter, reports bytes in flight over the window."""
    from sql_protocol_checkers import check_flow_control

    from shardex.sql.protocol.flow import Outbox

    real_init = Outbox.__init__

    def greedy_init(self, **kwargs):  # type: ignore[no-untyped-def]
        real_init(self, **kwargs)
        if kwargs["sender"] == "m2":
            self.credit.limit = 10**12

    monkeypatch.setattr(Outbox, "__init__", greedy_init)

    async def main(sim: Simulation) -> None:
        h = Harness(sim)
        await h.start("m1", "m2")
        plan = gather_plan("m1", ["m2"], rows=2000, batch_rows=50, pad=20)
        plan.fragments[0].args["delay"] = 0.01
        error = await drain_error(await h.services["m1"].execute(plan))
        assert error.code is ErrorCode.PROTOCOL_ERROR and "exceeded its credits" in error.message
        with pytest.raises(AssertionError, match="over the window"):
            check_flow_control(h.meter)
        await sim.cluster.stop_all()

    run_simulation(main, 0)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_fragment_ending_cancelled_on_its_own_fails_the_query(seed: int) -> None:
    """A CancelledError from inside a fragment (not the execution's stop) ends its task
    cancelled without the end of its stream: the query fails naming the fragment instead
    of waiting on that stream until its timeout."""

    async def scenario(h: Harness) -> None:
        await h.start("m1", "m2", "m3")
        emit = {"rows": 400, "batch_rows": 20, "cancel_on": ["m3"], "fail_after": 2}
        result = await h.services["m1"].execute(chain_plan("m1", "m2", ["m2", "m3"], mod=1, **emit))
        error = await drain_error(result)
        assert error.code is ErrorCode.INTERNAL, error
        assert error.details["reason"] == "fragment_cancelled", error
        assert error.details["member"] == "m3" and error.details["kind"] == "emit"
        check_cancel_messages(h.every_service, participants=3)

    run(scenario, seed)
