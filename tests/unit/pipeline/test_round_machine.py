"""``RoundMachine``: a round's decisions as events in, instructions out (no I/O here; the
driver runs it on the client's loop, ``rounds/sender.py``, and the simulator over a network
with crashes, ``tests/sim/test_rounds_sim.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from shardex.api.delivery import (
    DeliverAndStabilise,
    Delivered,
    DeliverKeyVersions,
    SliceAck,
    Stabilised,
)
from shardex.api.timekeeper import StabilityAdvanced
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.index.keyversion import UPSERT
from shardex.pipeline.rounds.machine import (
    Advanced,
    AdvanceFailed,
    AskTimekeeper,
    Instruction,
    MoreRows,
    NodeFailed,
    NodeReplied,
    RoundDone,
    RoundEnds,
    RoundFailed,
    RoundMachine,
    RoundSpec,
    SendToIndexer,
)

TS = Timestamp({0: (5, 9)})


def rows(n: int, first: int = 0) -> list[tuple[str, int, int, bytes, str, int, int]]:
    return [("ix", 0, UPSERT, b"k%d" % i, f"d{i}", 0, i + 1) for i in range(first, first + n)]


def machine(drop_above: dict[int, int] | None = None) -> RoundMachine:
    return RoundMachine(RoundSpec("ks", 7, drop_above=drop_above, frame_rows=2))


def ends(**kw: Any) -> RoundEnds:
    base: dict[str, Any] = {
        "ts": TS,
        "by_node": {"a": rows(5)},
        "plan": {"a": ["ix"], "b": ["ix"]},
        "index_ids": ["ix"],
        "slices": {"a": {"ix": [0]}, "b": {"ix": [1]}},
    }
    base.update(kw)
    return RoundEnds(**base)


def sends(instructions: list[Instruction]) -> dict[str, DeliverKeyVersions | DeliverAndStabilise]:
    out = {i.node: i.message for i in instructions if isinstance(i, SendToIndexer)}
    assert len(out) == len(instructions)
    return out


def delivered(node: str, incarnation: str, n: int = 2) -> NodeReplied:
    return NodeReplied(node, Delivered(node=node, incarnation=incarnation, accepted=n))


def stabilised(node: str, incarnation: str) -> NodeReplied:
    ack = SliceAck(index_id="ix", partition=0, applied=TS.to_wire(), items_count=1, state="active")
    return NodeReplied(node, Stabilised(node=node, incarnation=incarnation, acks=[ack]))


def test_frames_go_one_after_the_other_naming_the_first_incarnation() -> None:
    m = machine(drop_above={0: 3})
    first = sends(m.handle(ends()))
    assert set(first) == {"a", "b"}  # b has no rows but stabilises
    a1 = first["a"]
    assert isinstance(a1, DeliverKeyVersions) and len(a1.rows) == 2
    assert a1.incarnation == "" and a1.drop_above == {0: 3}
    b1 = first["b"]
    assert isinstance(b1, DeliverAndStabilise) and b1.rows == [] and b1.slices == {"ix": [1]}
    assert b1.drop_above == {0: 3}  # every node's first frame forgets its queue above
    a2 = sends(m.handle(delivered("a", "A1")))["a"]
    assert isinstance(a2, DeliverKeyVersions)
    assert a2.incarnation == "A1" and a2.drop_above is None
    a3 = sends(m.handle(delivered("a", "A1")))["a"]
    assert isinstance(a3, DeliverAndStabilise)
    assert len(a3.rows) == 1 and a3.incarnation == "A1"
    assert a3.ts == TS.to_wire() and a3.index_ids == ["ix"]
    assert m.handle(stabilised("a", "A1")) == []  # b still out
    (ask,) = m.handle(stabilised("b", "B1"))
    assert isinstance(ask, AskTimekeeper)
    assert set(ask.message.stabilised or {}) == {"a", "b"} and ask.message.batch_id == 7
    assert ask.message.index_ids == ["ix"] and ask.message.ts == TS.to_wire()
    reply = StabilityAdvanced(keyspace="ks", ts=TS.to_wire(), published=["ix"], items_count={})
    (done,) = m.handle(Advanced(reply))
    assert isinstance(done, RoundDone) and done.published == ["ix"] and done.ts == TS
    assert m.report.accepted == 4 and m.report.incarnations == {"a": "A1", "b": "B1"}


def test_rows_of_an_open_round_go_out_in_order_before_its_end() -> None:
    """Rows that arrive while the round is open go to an idle node at once and queue behind
    a node's frame that is out; the end's rows and the stabilise follow them. A node that
    took only early rows is stabilised too, alone in its last message."""
    m = machine(drop_above={0: 1})
    (a1,) = m.handle(MoreRows({"a": rows(3)}))
    assert isinstance(a1, SendToIndexer) and a1.message.drop_above == {0: 1}
    assert isinstance(a1.message, DeliverKeyVersions) and len(a1.message.rows) == 2
    # a's frame is out: more rows for a wait; c is idle and gets its own at once
    later = sends(m.handle(MoreRows({"a": rows(1, first=3), "c": rows(1, first=9)})))
    assert set(later) == {"c"} and later["c"].drop_above == {0: 1}
    a2 = sends(m.handle(delivered("a", "A1")))["a"]
    assert [r[6] for r in a2.rows] == [3]  # each arrival is cut into frames of its own
    assert m.handle(delivered("c", "C1", 1)) == []  # open: c waits for more or the end
    at_end = sends(m.handle(ends(by_node={"a": rows(1, first=4)})))
    assert set(at_end) == {"b", "c"}  # a's frame is still out
    assert isinstance(at_end["c"], DeliverAndStabilise) and at_end["c"].rows == []
    assert at_end["c"].incarnation == "C1" and at_end["c"].index_ids == []
    assert at_end["b"].drop_above == {0: 1}
    a3 = sends(m.handle(delivered("a", "A1", 1)))["a"]
    assert isinstance(a3, DeliverKeyVersions) and [r[6] for r in a3.rows] == [4]
    a4 = sends(m.handle(delivered("a", "A1", 1)))["a"]
    assert isinstance(a4, DeliverAndStabilise) and [r[6] for r in a4.rows] == [5]
    assert a4.incarnation == "A1" and a4.drop_above is None
    m.handle(stabilised("a", "A1"))
    m.handle(stabilised("b", "B1"))
    (ask,) = m.handle(stabilised("c", "C1"))
    assert isinstance(ask, AskTimekeeper) and set(ask.message.stabilised or {}) == {"a", "b", "c"}
    with pytest.raises(RuntimeError):
        m.handle(MoreRows({"a": rows(1)}))  # the round ended: no more rows


def test_a_node_failing_while_open_missed_the_round() -> None:
    m = machine()
    m.handle(MoreRows({"a": rows(1)}))
    assert m.handle(NodeFailed("a", NodeUnavailable("a is down"))) == []
    assert m.handle(MoreRows({"a": rows(1)})) == []  # nothing more goes to a
    assert set(sends(m.handle(MoreRows({"b": rows(1)})))) == {"b"}
    m.handle(delivered("b", "B1", 1))
    (last,) = m.handle(ends(by_node={"a": rows(2)}))
    assert last.node == "b" and isinstance(last.message, DeliverAndStabilise)
    (ask,) = m.handle(stabilised("b", "B1"))
    assert isinstance(ask, AskTimekeeper) and set(ask.message.stabilised or {}) == {"b"}
    reply = StabilityAdvanced(
        keyspace="ks",
        ts=TS.to_wire(),
        published=["ix"],
        items_count={},
        dropped_copies={"ix": [(0, "a")]},
    )
    (done,) = m.handle(Advanced(reply))
    assert isinstance(done, RoundDone) and set(done.report.missed) == {"a"}
    assert done.dropped_copies == {"ix": [(0, "a")]} and done.report.incarnations == {"b": "B1"}


def test_a_restarted_indexer_between_frames_fails_the_round_stale() -> None:
    m = machine()
    m.handle(ends(plan={"a": ["ix"]}))
    m.handle(delivered("a", "A1"))
    (failed,) = m.handle(delivered("a", "A2"))
    assert isinstance(failed, RoundFailed) and failed.stale
    assert m.handle(stabilised("a", "A2")) == []  # a late reply: nothing


def test_a_restarted_node_fails_the_round_stale() -> None:
    m = machine()
    m.handle(ends())
    (failed,) = m.handle(NodeFailed("b", ShardexError("restarted", code=ErrorCode.STALE_DELIVERY)))
    assert isinstance(failed, RoundFailed) and failed.stale
    assert m.state == "failed"


@pytest.mark.parametrize(
    "error",
    [
        NodeUnavailable("b is down"),
        ShardexError("no answer", code=ErrorCode.TIMEOUT),
        ShardexError("closed", code=ErrorCode.CONNECTION_CLOSED),
    ],
)
def test_a_node_that_does_not_answer_missed_the_round(error: ShardexError) -> None:
    """The others' replies go to the timekeeper, which decides what it can publish."""
    m = machine()
    m.handle(ends(by_node={}))
    assert m.handle(NodeFailed("b", error)) == []
    assert m.handle(stabilised("b", "B1")) == []  # a late reply of a node that missed it
    (ask,) = m.handle(stabilised("a", "A1"))
    assert isinstance(ask, AskTimekeeper) and set(ask.message.stabilised or {}) == {"a"}
    assert m.report.missed == {"b": error}


def test_a_round_every_node_missed_fails() -> None:
    m = machine()
    m.handle(ends(by_node={}))
    assert m.handle(NodeFailed("a", NodeUnavailable("a is down"))) == []
    (failed,) = m.handle(NodeFailed("b", NodeUnavailable("b is down")))
    assert isinstance(failed, RoundFailed) and not failed.stale and "a is down" in str(failed.error)


def test_a_timekeeper_failure_publishes_nothing() -> None:
    m = machine()
    m.handle(ends(by_node={}, plan={"a": ["ix"]}))
    (ask,) = m.handle(stabilised("a", "A1"))
    assert isinstance(ask, AskTimekeeper)
    (failed,) = m.handle(AdvanceFailed(NodeUnavailable("timekeeper down")))
    assert isinstance(failed, RoundFailed) and not failed.stale
    late = StabilityAdvanced(keyspace="ks", ts=TS.to_wire(), published=["ix"], items_count={})
    assert m.handle(Advanced(late)) == []  # a late answer publishes nothing
    assert m.state == "failed"
