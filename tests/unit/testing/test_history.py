"""The history recorder: invocations and completions, the clock, bad input, dump and load."""

from __future__ import annotations

import io
import itertools
import threading

import pytest

from shardex.errors import ErrorCode
from shardex.testing.history import CAS_MISMATCH, History, HistoryError, Operation, OpId


def _ticking() -> History:
    ticks = itertools.count(10, 10)
    return History(clock=lambda: next(ticks))


def test_records_calls_and_outcomes_with_the_injected_clock() -> None:
    h = _ticking()
    w = h.invoke("p1", "k", "write", {"a": 1})
    r = h.invoke("p2", "k", "read")
    h.complete(r, "ok", {"a": 1})
    h.complete(w, "ok")
    ops = h.operations()
    assert [(o.id, o.op, o.invoke_ns, o.complete_ns, o.status) for o in ops] == [
        (0, "write", 10, 40, "ok"),
        (1, "read", 20, 30, "ok"),
    ]
    assert ops[1].result == {"a": 1}
    assert len(h) == 2


def test_a_pending_operation_counts_as_ambiguous() -> None:
    h = _ticking()
    h.invoke("p1", "k", "write", 1)
    (op,) = h.operations()
    assert op.status is None
    assert op.outcome == "info"
    assert "pending" in op.describe()


def test_a_process_is_sequential_until_its_call_completes() -> None:
    h = _ticking()
    first = h.invoke("p1", "k", "write", 1)
    with pytest.raises(HistoryError, match="while #0 is pending") as caught:
        h.invoke("p1", "k", "read")
    assert caught.value.code is ErrorCode.BAD_REQUEST
    h.complete(first, "info")  # ambiguous: the process may go on
    h.invoke("p1", "k", "read")


@pytest.mark.parametrize(
    ("op", "value", "message"),
    [
        ("upsert", 1, "unknown operation 'upsert'"),
        ("cas", 1, r"cas takes \(expected, new\)"),
        ("cas", (1, None), "use delete|new is None"),
        ("write", None, "write of None"),
        ("write", {1, 2}, "not a JSON value"),
        ("write", float("nan"), "not a JSON value"),
        ("read", 3, "read takes no value"),
    ],
)
def test_bad_invocations_are_refused_with_a_hint(op: str, value: object, message: str) -> None:
    with pytest.raises(HistoryError, match=message):
        History().invoke("p", "k", op, value)  # type: ignore[arg-type]


def test_bad_completions_are_refused() -> None:
    h = History()
    op = h.invoke("p", "k", "read")
    with pytest.raises(HistoryError, match="unknown status 'error'"):
        h.complete(op, "error")  # type: ignore[arg-type]
    with pytest.raises(HistoryError, match="no operation #7"):
        h.complete(OpId(7), "ok")
    h.complete(op, "ok", None)
    with pytest.raises(HistoryError, match="completed twice"):
        h.complete(op, "fail")


def test_concurrent_recorders_get_distinct_ids_and_lose_nothing() -> None:
    h = History()

    def run(process: int) -> None:
        for n in range(200):
            op = h.invoke(process, f"k{n % 3}", "write", [process, n])
            h.complete(op, "ok")

    threads = [threading.Thread(target=run, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ops = h.operations()
    assert sorted(o.id for o in ops) == list(range(800))
    assert all(o.status == "ok" and o.complete_ns >= o.invoke_ns for o in ops)


def test_dump_and_load_keep_every_field(tmp_path) -> None:
    h = _ticking()
    a = h.invoke(1, "k", "cas", (None, {"x": [1, 2]}))
    b = h.invoke(("client", 2), "k", "write", "v")
    c = h.invoke(3, "other", "delete")
    h.complete(a, "fail", CAS_MISMATCH)
    h.complete(b, "info")
    h.invoke(4, "k", "read")  # left pending
    h.complete(c, "ok")
    path = tmp_path / "history.jsonl"
    h.dump(path)
    loaded = History.load(path)
    assert loaded.operations() == h.operations()
    assert loaded.operations()[0].value == (None, {"x": [1, 2]})
    buffer = io.StringIO()
    loaded.dump(buffer)
    assert buffer.getvalue() == path.read_text()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"not": "a history"}\n', "not a shardex history"),
        ('{"format": "shardex-history", "version": 1}\n{oops\n', "line 2 is not JSON"),
        ('{"format": "shardex-history", "version": 1}\n{"id": 0}\n', "line 2 is not an op"),
    ],
)
def test_loading_a_bad_file_names_the_line(text: str, message: str) -> None:
    with pytest.raises(HistoryError, match=message):
        History.load(io.StringIO(text))


def test_operations_built_by_hand_are_checked() -> None:
    with pytest.raises(HistoryError, match="completed at 5, invoked at 9"):
        History.from_operations([Operation(OpId(0), "p", "k", "read", None, 9, "ok", None, 5)])
    ok = History.from_operations([Operation(OpId(3), "p", "k", "cas", [1, 2], 0, "ok", None, 1)])
    assert ok.operations()[0].value == (1, 2)
    assert ok.operations()[0].id == 0
