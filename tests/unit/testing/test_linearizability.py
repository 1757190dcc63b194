"""The linearizability checker on hand-written histories of document registers: each case is
known linearizable or known not, including Porcupine's register tests re-expressed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from shardex.errors import ShardexError
from shardex.testing.history import CAS_MISMATCH, History, Operation, OpId
from shardex.testing.linearizability import Verdict, check

INF = None  # an ambiguous operation has no return


class Rows:
    """Operations with explicit times: ``rows.ok(p, "read", at=(0, 10), result=1)``."""

    def __init__(self) -> None:
        self.ops: list[Operation] = []

    def add(
        self,
        process: Any,
        op: str,
        value: Any = None,
        *,
        at: tuple[int, int | None],
        status: str | None = "ok",
        result: Any = None,
        key: str = "k",
    ) -> Rows:
        start, end = at
        if status is None or end is None:
            end = None if status is None else start
        self.ops.append(
            Operation(OpId(len(self.ops)), process, key, op, value, start, status, result, end)
        )
        return self

    def ok(self, process: Any, op: str, value: Any = None, **kw: Any) -> Rows:
        return self.add(process, op, value, **kw)

    def info(self, process: Any, op: str, value: Any = None, *, at: int, **kw: Any) -> Rows:
        # an ambiguous call: completed with info some time after its call (the time is not used)
        return self.add(process, op, value, at=(at, at), status="info", **kw)

    def fail(self, process: Any, op: str, value: Any = None, **kw: Any) -> Rows:
        return self.add(process, op, value, status="fail", **kw)


def _verdict(rows: Rows, **kw: Any) -> Verdict:
    return check(rows.ops, **kw).verdict


# -- Porcupine's register tests (initial value 0 there, absent here) ---------------------------


def test_porcupine_register_linearizable() -> None:
    rows = (
        Rows()
        .ok(0, "write", 100, at=(0, 100))
        .ok(1, "read", at=(25, 75), result=100)
        .ok(2, "read", at=(30, 60), result=None)
    )
    assert _verdict(rows) is Verdict.LINEARIZABLE


def test_porcupine_register_not_linearizable() -> None:
    rows = (
        Rows()
        .ok(0, "write", 200, at=(0, 100))
        .ok(1, "read", at=(10, 30), result=200)
        .ok(2, "read", at=(40, 90), result=None)
    )
    result = check(rows.ops)
    assert result.verdict is Verdict.VIOLATION
    (bad,) = result.violations()
    assert bad.blocked is not None and bad.blocked.id == 2
    assert [op.id for op in bad.linearization] == [0, 1]


def test_porcupine_zero_duration_operations_touching_overlap() -> None:
    ok = (
        Rows()
        .ok(0, "write", 100, at=(0, 100))
        .ok(1, "read", at=(25, 75), result=100)
        .ok(2, "read", at=(30, 30), result=None)
        .ok(3, "read", at=(30, 30), result=None)
    )
    assert _verdict(ok) is Verdict.LINEARIZABLE
    bad = (
        Rows()
        .ok(0, "write", 200, at=(0, 100))
        .ok(1, "read", at=(10, 10), result=200)
        .ok(2, "read", at=(10, 10), result=200)
        .ok(3, "read", at=(40, 90), result=None)
    )
    assert _verdict(bad) is Verdict.VIOLATION


def test_a_read_returning_at_the_instant_a_write_is_called_may_see_it() -> None:
    # Porcupine's tie rule: a call sorts before a return at the same time, so they overlap
    rows = Rows().ok(0, "write", 1, at=(10, 20)).ok(1, "read", at=(0, 10), result=1)
    assert _verdict(rows) is Verdict.LINEARIZABLE


# -- stale and lost ----------------------------------------------------------------------------


def test_stale_read_after_a_completed_write() -> None:
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .ok(0, "write", 2, at=(20, 30))
        .ok(1, "read", at=(40, 50), result=1)
    )
    result = check(rows.ops)
    assert not result.ok
    text = result.describe()
    assert "key 'k': not linearizable" in text
    assert "returned 1, but the value was 2" in text
    assert "value after it: 2" in text


def test_a_read_concurrent_with_the_overwrite_may_still_see_the_old_value() -> None:
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .ok(0, "write", 2, at=(20, 30))
        .ok(1, "read", at=(25, 50), result=1)
        .ok(1, "read", at=(60, 70), result=2)
    )
    assert _verdict(rows) is Verdict.LINEARIZABLE


def test_a_lost_acknowledged_write() -> None:
    rows = Rows().ok(0, "write", {"v": 1}, at=(0, 10)).ok(1, "read", at=(20, 30), result=None)
    assert _verdict(rows) is Verdict.VIOLATION


def test_a_read_of_a_value_never_written() -> None:
    rows = Rows().ok(0, "write", 1, at=(0, 10)).ok(1, "read", at=(0, 30), result=7)
    result = check(rows.ops)
    assert result.verdict is Verdict.VIOLATION
    assert "returned 7" in result.describe()


def test_documents_compare_as_json_whatever_their_key_order() -> None:
    rows = (
        Rows()
        .ok(0, "write", {"a": 1, "b": [1, {"c": 2}]}, at=(0, 10))
        .ok(1, "read", at=(20, 30), result={"b": [1, {"c": 2}], "a": 1})
    )
    assert _verdict(rows) is Verdict.LINEARIZABLE


# -- concurrent writes, readers that disagree --------------------------------------------------


def _two_writes_and_readers(second_reader: tuple[int, int]) -> Rows:
    first, then = second_reader
    return (
        Rows()
        .ok("w1", "write", 1, at=(0, 100))
        .ok("w2", "write", 2, at=(0, 100))
        .ok("r1", "read", at=(10, 20), result=1)
        .ok("r1", "read", at=(30, 40), result=2)
        .ok("r2", "read", at=(10, 20), result=first)
        .ok("r2", "read", at=(30, 40), result=then)
    )


def test_readers_agreeing_on_the_order_of_two_concurrent_writes() -> None:
    assert _verdict(_two_writes_and_readers((1, 2))) is Verdict.LINEARIZABLE
    assert _verdict(_two_writes_and_readers((2, 2))) is Verdict.LINEARIZABLE


def test_readers_seeing_two_concurrent_writes_in_opposite_orders() -> None:
    assert _verdict(_two_writes_and_readers((2, 1))) is Verdict.VIOLATION


# -- cas ---------------------------------------------------------------------------------------


def test_a_cas_that_succeeded_on_a_stale_value() -> None:
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .ok(0, "write", 2, at=(20, 30))
        .ok(1, "cas", (1, 3), at=(40, 50))
    )
    result = check(rows.ops)
    assert result.verdict is Verdict.VIOLATION
    assert "expected 1, but the value was 2" in result.describe()


def test_a_cas_on_the_current_value_then_a_read_of_it() -> None:
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .ok(1, "cas", (1, 3), at=(20, 30))
        .ok(2, "read", at=(40, 50), result=3)
    )
    assert _verdict(rows) is Verdict.LINEARIZABLE


def test_two_cas_from_one_value_cannot_both_succeed() -> None:
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .ok(1, "cas", (1, 2), at=(20, 30))
        .ok(2, "cas", (1, 3), at=(20, 30))
    )
    assert _verdict(rows) is Verdict.VIOLATION


def test_an_insert_as_cas_from_absent() -> None:
    rows = Rows().ok(0, "cas", (None, 1), at=(0, 10)).ok(1, "read", at=(20, 30), result=1)
    assert _verdict(rows) is Verdict.LINEARIZABLE


def test_a_mismatch_is_a_check_that_the_value_differed() -> None:
    matched = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .fail(1, "cas", (1, 2), at=(20, 30), result=CAS_MISMATCH)
    )
    result = check(matched.ops)
    assert result.verdict is Verdict.VIOLATION
    assert "failed as a mismatch, but the value was 1" in result.describe()
    differed = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .fail(1, "cas", (5, 2), at=(20, 30), result=CAS_MISMATCH)
    )
    assert _verdict(differed) is Verdict.LINEARIZABLE
    # a concurrent write explains the mismatch: the value was 9 at some instant of the cas
    raced = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .ok(2, "write", 9, at=(15, 25))
        .ok(2, "write", 1, at=(26, 28))
        .fail(1, "cas", (1, 2), at=(20, 30), result=CAS_MISMATCH)
    )
    assert _verdict(raced) is Verdict.LINEARIZABLE


def test_a_cas_failed_for_another_reason_is_dropped() -> None:
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .fail(1, "cas", (1, 2), at=(20, 30), result="DURABILITY_IMPOSSIBLE")
    )
    result = check(rows.ops)
    assert result.ok
    assert result.keys["k"].dropped == 1


# -- failed and ambiguous ----------------------------------------------------------------------


def test_a_failed_write_took_no_effect() -> None:
    never = Rows().fail(0, "write", 1, at=(0, 10)).ok(1, "read", at=(5, 30), result=1)
    assert _verdict(never) is Verdict.VIOLATION
    absent = Rows().fail(0, "write", 1, at=(0, 10)).ok(1, "read", at=(5, 30), result=None)
    assert _verdict(absent) is Verdict.LINEARIZABLE


def _ambiguous_write_then_reads(*seen: Any) -> Rows:
    rows = Rows().ok(0, "write", 1, at=(0, 10)).info(1, "write", 2, at=20)
    for n, value in enumerate(seen):
        rows.ok(2, "read", at=(30 + 20 * n, 40 + 20 * n), result=value)
    return rows


@pytest.mark.parametrize(
    ("seen", "verdict"),
    [
        ((2,), Verdict.LINEARIZABLE),  # took effect
        ((1,), Verdict.LINEARIZABLE),  # did not (yet)
        ((1, 2), Verdict.LINEARIZABLE),  # took effect late, long after the caller gave up
        ((1, 1, 2, 2), Verdict.LINEARIZABLE),
        ((2, 1), Verdict.VIOLATION),  # took effect, then was undone
        ((2, 2, 1), Verdict.VIOLATION),
    ],
)
def test_an_ambiguous_write_takes_effect_once_or_never(seen: tuple, verdict: Verdict) -> None:
    assert _verdict(_ambiguous_write_then_reads(*seen)) is verdict


def test_an_ambiguous_write_cannot_take_effect_before_its_call() -> None:
    rows = Rows().ok(0, "read", at=(0, 10), result=2).info(1, "write", 2, at=20)
    assert _verdict(rows) is Verdict.VIOLATION


def test_a_pending_call_counts_as_ambiguous() -> None:
    rows = (
        Rows()
        .add(1, "write", 2, at=(20, None), status=None)
        .ok(2, "read", at=(30, 40), result=2)
        .ok(2, "read", at=(50, 60), result=2)
    )
    assert _verdict(rows) is Verdict.LINEARIZABLE


def test_an_ambiguous_cas_takes_effect_only_from_its_expected_value() -> None:
    took = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .info(1, "cas", (1, 2), at=20)
        .ok(2, "read", at=(30, 40), result=2)
    )
    assert _verdict(took) is Verdict.LINEARIZABLE
    could_not = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .info(1, "cas", (9, 2), at=20)
        .ok(2, "read", at=(30, 40), result=2)
    )
    assert _verdict(could_not) is Verdict.VIOLATION


def test_an_ambiguous_delete() -> None:
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .info(1, "delete", at=20)
        .ok(2, "read", at=(30, 40), result=1)
        .ok(2, "read", at=(50, 60), result=None)
    )
    assert _verdict(rows) is Verdict.LINEARIZABLE
    rows.ok(2, "read", at=(70, 80), result=1)
    assert _verdict(rows) is Verdict.VIOLATION


def test_ambiguous_reads_and_unobserved_ambiguous_writes_are_dropped() -> None:
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .info(1, "write", 2, at=20)
        .info(3, "read", at=20)
        .info(4, "cas", (1, 5), at=20)
        .ok(2, "read", at=(30, 40), result=1)
    )
    result = check(rows.ops)
    assert result.ok
    assert (result.keys["k"].checked, result.keys["k"].dropped) == (2, 3)


def test_a_mismatch_after_an_ambiguous_call_is_not_checked() -> None:
    # the ambiguous write of 2 could explain the mismatch (and here it does not even have to)
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .info(1, "write", 2, at=50)
        .fail(2, "cas", (1, 3), at=(30, 60), result=CAS_MISMATCH)
    )
    result = check(rows.ops)
    assert result.ok
    assert result.keys["k"].dropped == 2  # the mismatch and the unobserved write
    # returned before the ambiguous call: checked
    rows.ops[2] = replace(rows.ops[2], invoke_ns=20, complete_ns=40)
    assert _verdict(rows) is Verdict.VIOLATION


def test_an_ambiguous_write_expires_once_its_readers_are_placed() -> None:
    # the read of 2 is explained by the ambiguous write or by the ok one, so the search tries
    # both; then ten concurrent writes and a final read no write explains. Once the read of 2
    # is placed, an unplaced ambiguous write must not double the states among the ten.
    def history(ambiguous: bool) -> list[Operation]:
        rows = Rows().ok(0, "write", 1, at=(0, 10))
        if ambiguous:
            rows.info(1, "write", 2, at=20)
        rows.ok(3, "write", 2, at=(30, 40)).ok(2, "read", at=(50, 60), result=2)
        for p in range(10):
            rows.ok(f"w{p}", "write", 10 + p, at=(70, 1000))
        return rows.ok(2, "read", at=(2000, 2001), result=-1).ops

    without = check(history(False)).keys["k"]
    key = check(history(True)).keys["k"]
    assert key.verdict is without.verdict is Verdict.VIOLATION
    assert key.checked == without.checked + 1
    # an open ambiguous write would more than double the states among the ten writes
    assert key.steps < 1.5 * without.steps


def test_a_read_that_returned_before_an_ambiguous_call_does_not_observe_it() -> None:
    rows = (
        Rows()
        .ok(0, "write", 2, at=(0, 10))
        .ok(1, "read", at=(20, 30), result=2)
        .info(1, "write", 2, at=40)
        .ok(0, "write", 3, at=(50, 60))
    )
    result = check(rows.ops)
    assert result.ok
    assert result.keys["k"].dropped == 1


# -- delete ------------------------------------------------------------------------------------


def test_delete_leaves_the_document_absent() -> None:
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 10))
        .ok(0, "delete", at=(20, 30))
        .ok(1, "read", at=(40, 50), result=None)
    )
    assert _verdict(rows) is Verdict.LINEARIZABLE
    rows.ok(1, "read", at=(60, 70), result=1)
    assert _verdict(rows) is Verdict.VIOLATION


# -- keys, results, budgets --------------------------------------------------------------------


def test_keys_are_checked_apart_and_only_the_bad_one_is_named() -> None:
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 10), key="a")
        .ok(1, "read", at=(0, 10), result=None, key="b")
        .ok(1, "read", at=(20, 30), result=1, key="b")  # b was never written 1
        .ok(0, "read", at=(20, 30), result=1, key="a")
    )
    result = check(rows.ops)
    assert result.keys["a"].verdict is Verdict.LINEARIZABLE
    assert [k.key for k in result.violations()] == ["b"]
    assert "key 'b'" in result.describe() and "key 'a'" not in result.describe()
    with pytest.raises(AssertionError, match="key 'b': not linearizable"):
        result.assert_linearizable()


def test_a_linearizable_key_gives_its_order() -> None:
    rows = (
        Rows()
        .ok(0, "write", 1, at=(0, 100))
        .ok(1, "write", 2, at=(0, 100))
        .ok(2, "read", at=(10, 20), result=2)
        .ok(2, "read", at=(30, 40), result=1)
    )
    key = check(rows.ops).keys["k"]
    assert [op.id for op in key.linearization] == [1, 2, 0, 3]
    assert key.value_after == 1


def test_a_history_object_and_its_replay_give_the_same_verdict(tmp_path) -> None:
    h = History()
    w = h.invoke("p1", "k", "write", 1)
    h.complete(w, "ok")
    r = h.invoke("p2", "k", "read")
    h.complete(r, "ok", None)
    assert check(h).verdict is Verdict.VIOLATION
    h.dump(tmp_path / "h.jsonl")
    assert check(History.load(tmp_path / "h.jsonl")).verdict is Verdict.VIOLATION


def _many_concurrent_writes(n: int) -> Rows:
    # every write overlaps every other and the last read sees a value no write made: the
    # search must try many orders before it can say no
    rows = Rows()
    for p in range(n):
        rows.ok(p, "write", p, at=(0, 1000))
    return rows.ok("r", "read", at=(2000, 2001), result=-1)


def test_the_step_budget_gives_unknown_instead_of_running_on() -> None:
    result = check(_many_concurrent_writes(12).ops, max_steps=50)
    assert result.verdict is Verdict.UNKNOWN
    (key,) = result.unknown()
    assert "step budget of 50 spent" in key.reason
    assert "unknown (budget exceeded)" in result.describe()
    with pytest.raises(AssertionError, match="unknown"):
        result.assert_linearizable()


def test_the_time_budget_gives_unknown_for_keys_not_reached() -> None:
    result = check(_many_concurrent_writes(3).ops, time_budget_s=-1.0)
    assert result.verdict is Verdict.UNKNOWN
    assert "time budget spent" in result.keys["k"].reason


def test_memoization_keeps_many_concurrent_writes_small() -> None:
    # 12 writes concurrent with each other: 12! orders, but only 2^12 x 13 (set, value) pairs
    result = check(_many_concurrent_writes(12).ops)
    assert result.verdict is Verdict.VIOLATION
    assert result.keys["k"].steps < 12 * 2**12 * 13


def test_a_bad_budget_is_refused() -> None:
    with pytest.raises(ShardexError, match="max_steps must be positive"):
        check([], max_steps=0)


def test_an_empty_history_is_linearizable() -> None:
    assert check([]).ok
    assert check(History()).describe().startswith("history linearizable: 0 keys")
