"""The rebalance record's pure rules: planning, move transitions, publishing a move into the
topology history, and how an unknown hand-over outcome is resolved."""

from __future__ import annotations

import msgspec
import pytest

from shardex.core.topology import Topology, balanced_assignment
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.rebalance_state import (
    CANCELLED,
    DONE,
    FAILED,
    MOVING,
    PLANNED,
    RUNNING,
    UNRESOLVED,
    finish,
    in_flight,
    new_record,
    plan_moves,
    publish,
    resolution,
    with_move,
)
from shardex.meta.state import StateContext, decode_state, encode_state

TWO = Topology(seq_num=1, assignment=balanced_assignment(16, ["n1", "n2"]))


def test_plan_balances_every_keyspace_over_the_up_nodes() -> None:
    three = Topology(seq_num=4, assignment=balanced_assignment(6, ["n1", "n2", "n3"]))
    plan = plan_moves(
        {"a": ("ua", TWO), "b": ("ub", three)}, ["n1", "n2", "n3"], ["n1", "n2", "n3"]
    )
    assert all(ks == "a" for ks, *_ in plan)  # b is balanced already
    targets = {p: dst for _ks, _u, p, _src, dst, _seq in plan}
    assert set(targets.values()) == {"n3"} and len(targets) == 5  # 16 = 6 + 5 + 5
    for _ks, uuid, p, src, _dst, seq in plan:
        assert (uuid, seq, src) == ("ua", 1, TWO.assignment[p])
    after = TWO.with_moves(targets)
    counts = sorted(len(after.partitions_of(n)) for n in ("n1", "n2", "n3"))
    assert counts == [5, 5, 6]


def test_plan_refuses_when_an_owner_is_down() -> None:
    with pytest.raises(ShardexError) as info:
        plan_moves({"a": ("ua", TWO)}, ["n1", "n2", "n3"], ["n1", "n3"])
    assert info.value.code == ErrorCode.NODE_UNAVAILABLE and info.value.details["down"] == ["n2"]
    with pytest.raises(ShardexError):
        plan_moves({"a": ("ua", TWO)}, ["n1"], [])


def record(n: int = 3):
    plan = [("a", "ua", p, "n1", "n3", 1) for p in range(n)]
    return new_record("r1", "rebalance", plan, [f"m{p}" for p in range(n)], 100.0)


def test_move_transitions_and_finish() -> None:
    rec = record()
    assert rec.state == RUNNING and [m.status for m in rec.moves] == [PLANNED] * 3
    rec = with_move(rec, "m0", status=MOVING)
    rec = with_move(rec, "m1", status=UNRESOLVED, error="n1 unreachable")
    assert set(in_flight(rec)) == {("a", 0), ("a", 1)}
    rec = with_move(rec, "m0", status=DONE, pause_ms=12.5)
    rec = with_move(rec, "m1", status=FAILED)
    rec = with_move(rec, "m2", status=CANCELLED)
    assert in_flight(rec) == {} and rec.move("m0").pause_ms == 12.5
    done = finish(rec, 101.0)
    assert done.state == FAILED and done.finished_at == 101.0 and "2 of 3" in done.message
    ok = finish(with_move(with_move(rec, "m1", status=DONE), "m2", status=DONE), 102.0)
    assert ok.state == DONE
    assert new_record("r2", "rebalance", [], [], 5.0).state == DONE  # nothing to move
    with pytest.raises(KeyError):
        rec.move("nope")


def test_record_survives_the_state_encoding() -> None:
    state = StateContext(cas=3, rebalance=with_move(record(), "m1", status=MOVING))
    back = decode_state(encode_state(state))
    assert back == state and back.rebalance is not None and back.rebalance.moves[1].status == MOVING
    old = msgspec.msgpack.encode({"cas": 1})  # a state written before rebalances existed
    assert decode_state(old).rebalance is None


def test_publish_appends_one_topology_and_is_idempotent() -> None:
    move = record().moves[0]
    hist, topo = publish([TWO], move)
    assert [t.seq_num for t in hist] == [1, 2] and topo.assignment[0] == "n3"
    assert {p: n for p, n in topo.assignment.items() if p != 0} == {
        p: n for p, n in TWO.assignment.items() if p != 0
    }
    again, same = publish(hist, move)  # a roll-forward repeated after a failover
    assert again == hist and same == topo
    moved_away = TWO.with_moves({0: "n2"})
    with pytest.raises(ShardexError) as info:
        publish([TWO, moved_away], move)
    assert info.value.code == ErrorCode.STALE_TOPOLOGY


@pytest.mark.parametrize(
    ("source", "published", "sent", "action"),
    [
        ("released", False, True, "roll_forward"),  # past the point of no return
        ("active", False, True, "abort"),  # still serving at the source (now fenced)
        (None, False, True, "retry"),  # nobody can know: keep the target's copy
        (None, False, False, "abort"),  # no release was ever sent: it cannot have happened
        ("absent", False, True, "abort"),  # keyspace gone at the source
        ("released", True, True, "done"),
        (None, True, True, "done"),
        ("absent", True, False, "done"),
    ],
)
def test_resolution(source: str | None, published: bool, sent: bool, action: str) -> None:
    assert resolution(source, published, sent) == action
