"""The voter rules (``Replica``) and the coordinator checker, without a network."""

from __future__ import annotations

import pytest

from shardex.api.coordinator import StateGather, StateReplicate
from shardex.manager.replica import Replica
from shardex.meta.state import KeyspaceMeta, MemoryStateStore, StateContext
from shardex.testing.checkers_coordinator import check_coordinator


def st(epoch: int, cas: int, tag: str = "") -> StateContext:
    meta = KeyspaceMeta(name=tag or "k", num_partitions=1, uuid=tag, created_cas=cas)
    return StateContext(cas=cas, epoch=epoch, master="m", keyspaces={meta.name: meta})


def rep(name: str = "r", store: MemoryStateStore | None = None) -> Replica:
    return Replica(name, store or MemoryStateStore())


def reload(r: Replica) -> Replica:
    assert isinstance(r.store, MemoryStateStore)
    return Replica(r.name, r.store)


def test_promises_only_rise_and_are_persisted() -> None:
    r = rep()
    ok = r.on_gather(StateGather(epoch=3, candidate="a"))
    assert ok.ok and ok.state == StateContext() and (r.promised_epoch, r.leader) == (3, "a")
    for epoch in (3, 2):
        no = r.on_gather(StateGather(epoch=epoch, candidate="b"))
        assert not no.ok and no.state is None and (no.promised_epoch, no.leader) == (3, "a")
    back = reload(r)
    assert (back.promised_epoch, back.leader) == (3, "a")


def test_replicate_from_a_deposed_master_is_refused() -> None:
    r = rep()
    r.on_gather(StateGather(epoch=2, candidate="b"))
    reply, took = r.on_replicate(StateReplicate(epoch=1, leader="a", state=st(1, 5)))
    assert not reply.ok and not took and reply.promised_epoch == 2 and r.state.cas == 0


def test_newer_state_is_taken_persisted_and_acknowledged() -> None:
    r = rep()
    reply, took = r.on_replicate(StateReplicate(epoch=1, leader="a", state=st(1, 4)))
    assert reply.ok and took and (reply.epoch, reply.cas) == (1, 4)
    assert (r.promised_epoch, r.leader) == (1, "a")  # a replicate of a newer term promises it
    assert reload(r).state == st(1, 4)


def test_retry_and_overtaken_replicates_are_acknowledged_without_change() -> None:
    r = rep()
    r.on_replicate(StateReplicate(epoch=1, leader="a", state=st(1, 4)))
    saves = r.store.saves  # type: ignore[attr-defined]
    again, took = r.on_replicate(StateReplicate(epoch=1, leader="a", state=st(1, 4)))
    assert again.ok and not took
    older, took = r.on_replicate(StateReplicate(epoch=1, leader="a", state=st(1, 3)))
    assert older.ok and not took and (older.epoch, older.cas) == (1, 4)
    assert r.store.saves == saves  # type: ignore[attr-defined]


def test_newer_term_at_a_used_cas_is_refused_with_the_floor() -> None:
    """The node kept a change of term 1 at cas 5 that was never committed. Term 2's state at
    cas 5 must not replace it in place (a node never holds two states at one cas); the reply
    names cas 5 so the master commits above it."""
    r = rep()
    r.on_replicate(StateReplicate(epoch=1, leader="a", state=st(1, 5, "lost")))
    reply, took = r.on_replicate(StateReplicate(epoch=2, leader="b", state=st(2, 5, "new")))
    assert not reply.ok and not took
    assert (reply.promised_epoch, reply.cas) == (2, 5) and r.leader == "b"
    reply, took = r.on_replicate(StateReplicate(epoch=2, leader="b", state=st(2, 6, "new")))
    assert reply.ok and took and r.state == st(2, 6, "new")


def test_master_local_apply_guards() -> None:
    r = rep("m")
    r.promise_self(1)
    r.apply_local(st(1, 1))
    with pytest.raises(ValueError):
        r.apply_local(st(1, 1))  # cas must grow
    with pytest.raises(ValueError):
        r.apply_local(st(2, 2))  # only under the promised term
    with pytest.raises(ValueError):
        r.promise_self(1)
    assert r.observe(5, "x") and (r.promised_epoch, r.leader) == (5, "x")
    assert not r.observe(4, "y")


def test_failed_write_changes_nothing() -> None:
    class Failing(MemoryStateStore):
        def save(self, record: object) -> None:
            raise OSError("disk full")

    r = Replica("r", Failing())
    with pytest.raises(OSError):
        r.on_replicate(StateReplicate(epoch=1, leader="a", state=st(1, 1)))
    assert r.state == StateContext() and r.promised_epoch == 0


# --- the checker catches what it promises to catch ----------------------------------------


def good() -> dict:  # type: ignore[type-arg]
    return {
        "commits": [("a", (1, 1, "d1")), ("a", (1, 2, "d2"))],
        "applies": {"a": [(1, 1, "d1"), (1, 2, "d2")], "b": [(1, 2, "d2")]},
        "finals": {"a": (1, 2, "d2"), "b": (1, 2, "d2")},
        "acked": {"x": "x@2"},
        "final_ops": {"x": ["x@2"]},
        "issued": ["x"],
    }


def test_checker_accepts_a_good_history() -> None:
    check_coordinator(**good())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"commits": [("a", (1, 1, "d1")), ("b", (2, 1, "dx"))]}, "two different states"),
        (
            {"applies": {"a": [(1, 1, "d1"), (1, 2, "d2")], "b": [(1, 2, "d2"), (2, 2, "d9")]}},
            "strictly increase",
        ),
        ({"finals": {"a": (1, 2, "d2"), "b": (1, 1, "d1")}}, "did not converge"),
        ({"final_ops": {"x": ["x@2", "x@3"]}}, "applied 2 times"),
        ({"final_ops": {}}, "acknowledged"),
        ({"final_ops": {"x": ["x@2"], "y": ["y@1"]}}, "never issued"),
        ({"finals": {"a": (1, 1, "d1"), "b": (1, 1, "d1")}}, "below committed"),
    ],
)
def test_checker_catches_violations(change: dict, message: str) -> None:  # type: ignore[type-arg]
    history = good()
    history.update(change)
    with pytest.raises(AssertionError, match=message):
        check_coordinator(**history)
