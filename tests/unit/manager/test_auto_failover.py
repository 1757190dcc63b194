"""The automatic failover's decision (a pure function of the managers' views) and how a view's
row becomes "seen down for so long"."""

from __future__ import annotations

from shardex.manager.auto_failover import Decision, decide, down_for
from shardex.meta.member_list import DOWN, UP, MemberView

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
