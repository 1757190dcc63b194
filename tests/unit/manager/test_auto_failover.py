"""The automatic failover's decision (a pure function of the managers' views) and how a view's
row becomes "seen down for so long"."""

from __future__ import annotations

from typing import Any

from shardex.api.membership import MembersReply
from shardex.manager.auto_failover import (
    AutoFailover,
    AutoFailoverSettings,
    Decision,
    decide,
    down_for,
)
from shardex.meta.member_list import DOWN, UP, MemberView
from shardex.meta.state import StateContext
from tests.unit.manager import coordinator_fakes as fakes

MANAGERS = ["m1", "m2", "m3"]


def run(
    views: dict[str, dict[str, float]],
    candidates: list[str],
    *,
    managers: list[str] = MANAGERS,
    failed_over: int = 0,
    max_count: int = 1,
) -> Decision:
    return decide(
        managers=managers,
        candidates=candidates,
        views=views,
        timeout=5.0,
        failed_over=failed_over,
        max_count=max_count,
    )


def test_a_majority_of_managers_seeing_it_down_long_enough_fails_it_over() -> None:
    d = run({"m1": {"d1": 6.0}, "m2": {"d1": 5.0}, "m3": {}}, ["d1"])
    assert d.fail_over == {"d1": ["m1", "m2"]} and d.needed == 2


def test_too_short_or_too_few_is_not_enough() -> None:
    d = run({"m1": {"d1": 6.0}, "m2": {"d1": 4.9}, "m3": {}}, ["d1"])
    assert d.fail_over == {} and d.unconfirmed == {"d1": ["m1"]}


def test_only_managers_of_the_current_list_count() -> None:
    views = {"m1": {"d1": 9.0}, "old": {"d1": 9.0}, "d2": {"d1": 9.0}}
    d = run(views, ["d1"])
    assert d.fail_over == {} and d.unconfirmed == {"d1": ["m1"]}


def test_a_manager_that_did_not_answer_does_not_agree() -> None:
    five = ["m1", "m2", "m3", "m4", "m5"]
    views = {"m1": {"d1": 9.0}, "m2": {"d1": 9.0}}  # m3..m5 silent
    assert run(views, ["d1"], managers=five).fail_over == {}
    views["m4"] = {"d1": 9.0}
    assert run(views, ["d1"], managers=five).fail_over == {"d1": ["m1", "m2", "m4"]}


def test_max_count_caps_nodes_failed_over_and_not_recovered() -> None:
    views = {m: {"d1": 9.0, "d2": 9.0} for m in MANAGERS}
    d = run(views, ["d2", "d1"], max_count=1)
    assert list(d.fail_over) == ["d1"] and list(d.over_limit) == ["d2"]
    d = run(views, ["d1", "d2"], max_count=2, failed_over=1)
    assert list(d.fail_over) == ["d1"] and list(d.over_limit) == ["d2"]
    d = run(views, ["d1", "d2"], max_count=1, failed_over=1)
    assert d.fail_over == {} and list(d.over_limit) == ["d1", "d2"]
    d = run(views, ["d1", "d2"], max_count=2)
    assert list(d.fail_over) == ["d1", "d2"]


def row(state: str, age: float | None) -> MemberView:
    return MemberView(
        member_id="id",
        name="d1",
        address="d1:1",
        services=("data",),
        incarnation=1,
        state=state,
        last_heartbeat_age=age,
    )


def test_down_for_reads_the_age_or_counts_from_first_seen() -> None:
    assert down_for(row(UP, 0.2), None, 100.0) is None
    assert down_for(row(DOWN, 7.5), None, 100.0) == 7.5
    # never heard: from the first time the loop saw that report, a lower bound
    assert down_for(row(DOWN, None), 96.0, 100.0) == 4.0
    assert down_for(row(DOWN, None), None, 100.0) is None


# --- one tick against a fake master -------------------------------------------------------


def view_of(observer: str, d3_age: float | None) -> MembersReply:
    rows = [
        MemberView(
            member_id=f"id-{n}",
            name=n,
            address=f"{n}:1",
            services=("data", "manager"),
            incarnation=1,
            state=DOWN if n == "n3" else UP,
            last_heartbeat_age=d3_age if n == "n3" else 0.1,
        )
        for n in ("n1", "n2", "n3")
    ]
    return MembersReply(
        observer=observer,
        observer_id=f"id-{observer}",
        observer_is_manager=True,
        version=3,
        digest="x",
        heartbeat_interval=0.5,
        failure_timeout=3.0,
        members=rows,
    )


class FakeMaster:
    """The coordinator as the loop uses it: n1 is master of term 4 and sees n3 down 9 s."""

    epoch = 4
    voter_names = ("n1", "n2", "n3")

    def __init__(self, n2_age: float | None) -> None:
        membership = fakes.FakeMembership(
            {"n1": True, "n2": True, "n3": False}, ("data", "manager")
        )
        membership.view = lambda: view_of("n1", 9.0)  # type: ignore[attr-defined]
        self.membership = membership
        self.ctx: Any = fakes.FakeCtx(StateContext(), membership, iter(()))
        self.state = self.ctx.state
        self.n2_age = n2_age
        self.ran: list[str] = []

        async def request(address: str, msg: Any, timeout: float) -> Any:
            return view_of("n2", self.n2_age)

        self.pool = type("Pool", (), {"request": staticmethod(request)})()

    async def exclusive(self, epoch: int, fn: Any) -> Any:
        assert epoch == self.epoch
        self.ctx.epoch = epoch
        try:
            return await fn(self.ctx)
        finally:
            self.ran.append("failover")


async def test_tick_fails_over_when_a_majority_confirms() -> None:
    master = FakeMaster(n2_age=8.0)
    await AutoFailover(master, AutoFailoverSettings(timeout=5.0)).tick(4)
    assert master.ran == ["failover"]
    assert "n3" in master.ctx.state.failed_over  # no keyspace: nothing to promote, nothing lost


async def test_tick_does_nothing_without_confirmation() -> None:
    master = FakeMaster(n2_age=2.0)  # n2 has heard n3 recently
    await AutoFailover(master, AutoFailoverSettings(timeout=5.0)).tick(4)
    assert master.ran == [] and master.ctx.state.failed_over == {}
