"""``RoundMachine``: a round's decisions as events in, instructions out (no I/O here; the
simulator drives it over a network with crashes in ``tests/sim/test_rounds_sim.py``)."""

from __future__ import annotations

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
    NodeFailed,
    NodeReplied,
    RoundDone,
    RoundFailed,
    RoundMachine,
    RoundSpec,
    SendToIndexer,
)

TS = Timestamp({0: (5, 9)})


def rows(n: int) -> list[tuple[str, int, int, bytes, str, int, int]]:
    return [("ix", 0, UPSERT, b"k%d" % i, f"d{i}", 0, i + 1) for i in range(n)]


def spec(**kw: object) -> RoundSpec:
    base: dict[str, object] = {
        "keyspace": "ks",
        "batch_id": 7,
        "ts": TS,
        "index_ids": ["ix"],
        "by_node": {"a": rows(5)},
        "plan": {"a": ["ix"], "b": ["ix"]},
        "slices": {"a": {"ix": [0]}, "b": {"ix": [1]}},
        "frame_rows": 2,
    }
    base.update(kw)
    return RoundSpec(**base)  # type: ignore[arg-type]


def stabilised(node: str, incarnation: str) -> Stabilised:
    ack = SliceAck(index_id="ix", partition=0, applied=TS.to_wire(), items_count=1, state="active")
    return Stabilised(node=node, incarnation=incarnation, acks=[ack])


def test_frames_go_one_after_the_other_naming_the_first_incarnation() -> None:
    m = RoundMachine(spec(drop_above={0: 3}))
    first = m.start()
    by_node = {i.node: i for i in first if isinstance(i, SendToIndexer)}
    assert set(by_node) == {"a", "b"}  # b has no rows but stabilises
    a1 = by_node["a"].message
    assert isinstance(a1, DeliverKeyVersions) and len(a1.rows) == 2
    assert a1.incarnation == "" and a1.drop_above == {0: 3}
    b1 = by_node["b"].message
    assert isinstance(b1, DeliverAndStabilise) and b1.rows == [] and b1.slices == {"ix": [1]}
    assert b1.drop_above == {0: 3}  # every node's first frame forgets its queue above
    (a2,) = m.handle(NodeReplied("a", Delivered(node="a", incarnation="A1", accepted=2)))
    assert isinstance(a2, SendToIndexer) and isinstance(a2.message, DeliverKeyVersions)
    assert a2.message.incarnation == "A1" and a2.message.drop_above is None
    (a3,) = m.handle(NodeReplied("a", Delivered(node="a", incarnation="A1", accepted=2)))
    assert isinstance(a3, SendToIndexer) and isinstance(a3.message, DeliverAndStabilise)
    assert len(a3.message.rows) == 1 and a3.message.incarnation == "A1"
    assert a3.message.ts == TS.to_wire() and a3.message.index_ids == ["ix"]
    assert m.handle(NodeReplied("a", stabilised("a", "A1"))) == []  # b still out
    (ask,) = m.handle(NodeReplied("b", stabilised("b", "B1")))
    assert isinstance(ask, AskTimekeeper)
    assert ask.message.incarnations == {"a": "A1", "b": "B1"}
    assert set(ask.message.stabilised or {}) == {"a", "b"} and ask.message.batch_id == 7
    reply = StabilityAdvanced(keyspace="ks", ts=TS.to_wire(), published=["ix"], items_count={})
    (done,) = m.handle(Advanced(reply))
    assert isinstance(done, RoundDone) and done.published == ["ix"] and done.ts == TS
    assert m.report.accepted == 4


def test_a_restarted_indexer_between_frames_fails_the_round_stale() -> None:
    m = RoundMachine(spec(plan={"a": ["ix"]}))
    m.start()
    m.handle(NodeReplied("a", Delivered(node="a", incarnation="A1")))
    (failed,) = m.handle(NodeReplied("a", Delivered(node="a", incarnation="A2")))
    assert isinstance(failed, RoundFailed) and failed.stale
    assert m.handle(NodeReplied("a", stabilised("a", "A2"))) == []  # a late reply: nothing


def test_early_deliveries_pin_the_incarnation() -> None:
    m = RoundMachine(spec(by_node={}, plan={"a": ["ix"]}, early={"a": "A0"}))
    (send,) = m.start()
    assert isinstance(send, SendToIndexer) and send.message.incarnation == "A0"
    (failed,) = m.handle(NodeReplied("a", stabilised("a", "A9")))
    assert isinstance(failed, RoundFailed) and failed.stale


@pytest.mark.parametrize(
    "event",
    [
        NodeFailed("b", NodeUnavailable("b is down")),
        NodeFailed("b", ShardexError("restarted", code=ErrorCode.STALE_DELIVERY)),
    ],
)
def test_a_node_failure_fails_the_round(event: NodeFailed) -> None:
    m = RoundMachine(spec())
    m.start()
    (failed,) = m.handle(event)
    assert isinstance(failed, RoundFailed)
    assert failed.stale is (event.error.code is ErrorCode.STALE_DELIVERY)
    assert m.state == "failed"


def test_a_timekeeper_failure_publishes_nothing() -> None:
    m = RoundMachine(spec(by_node={}, plan={"a": ["ix"]}))
    m.start()
    (ask,) = m.handle(NodeReplied("a", stabilised("a", "A1")))
    assert isinstance(ask, AskTimekeeper)
    (failed,) = m.handle(AdvanceFailed(NodeUnavailable("timekeeper down")))
    assert isinstance(failed, RoundFailed) and not failed.stale
    with pytest.raises(RuntimeError):
        m.start()


def test_drop_only_nodes_are_best_effort_and_left_out_of_the_check() -> None:
    m = RoundMachine(
        spec(by_node={}, plan={"a": ["ix"]}, drop_above={0: 2}, drop_nodes=["a", "c", "d"])
    )
    sends = {i.node: i.message for i in m.start() if isinstance(i, SendToIndexer)}
    assert set(sends) == {"a", "c", "d"}
    assert all(msg.drop_above == {0: 2} for msg in sends.values())
    assert sends["c"].index_ids == [] and sends["c"].rows == []
    assert m.handle(NodeFailed("c", NodeUnavailable("c is down"))) == []  # not a failure
    m2 = RoundMachine(
        spec(by_node={}, plan={}, drop_above={0: 2}, drop_nodes=["e"], early={"e": "E0"})
    )
    m2.start()
    (ask2,) = m2.handle(NodeReplied("e", stabilised("e", "E1")))  # restarted: no matter
    assert isinstance(ask2, AskTimekeeper) and ask2.message.stabilised == {}
    assert m.handle(NodeReplied("d", stabilised("d", "D1"))) == []
    (ask,) = m.handle(NodeReplied("a", stabilised("a", "A1")))
    assert isinstance(ask, AskTimekeeper) and set(ask.message.stabilised or {}) == {"a"}


def test_drop_nodes_without_a_drop_send_nothing() -> None:
    m = RoundMachine(spec(by_node={}, plan={"a": ["ix"]}, drop_nodes=["c"]))
    assert [i.node for i in m.start() if isinstance(i, SendToIndexer)] == ["a"]
