"""Index moves on an idle keyspace: the maintenance job runs an empty stabilise round, naming
the move's target, at the stream's position when no batch has routed one to it
(``pipeline/rounds/moves.py``); never during a batch, never twice for one move, never for an
index whose applied TS is ahead of the stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardex.api.timekeeper import StabilityAdvanced
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.index import make_definition
from shardex.meta.index_state import ACTIVE, IndexRecord
from shardex.pipeline import maintain
from shardex.pipeline.maintain import MaintenanceJob
from shardex.pipeline.registry import IndexRegistry, IndexView
from shardex.pipeline.rounds.moves import MoveRounds

P5 = Timestamp({0: (5, 1), 1: (7, 1)})


def _view(index_id: str, moving: dict[int, str] | None = None) -> IndexView:
    d = make_definition(
        id=index_id, name=f"ix_{index_id}", keyspace="ks", keys=["k"],
        partition_by=["META().id"], num_partition=2,
    )  # fmt: skip
    topo = Topology(seq_num=1, assignment={0: "n1", 1: "n2"})
    return IndexView(IndexRecord(definition=d, state=ACTIVE), topo, moving or {})


def test_pending_names_unconfirmed_moves_once_and_forgets_finished_ones() -> None:
    rounds = MoveRounds()
    applied = {"a": P5, "b": P5, "c": Timestamp({0: (9, 1)})}.__getitem__
    views = [_view("a", {1: "n3"}), _view("b"), _view("c", {0: "n3"})]
    # c is ahead of the stream in partition 0: a round at P5 would move it backwards.
    assert rounds.pending(views, P5, applied) == {"a": {1: "n3"}}
    rounds.confirmed({"a": {1: "n3"}})
    assert rounds.pending(views, P5, applied) == {}
    # Another partition of the same index starts moving: only the index's new move is due,
    # and the round names the index's whole moving map (a repeat is a no-op on the target).
    views[0] = _view("a", {1: "n3", 0: "n3"})
    assert rounds.pending(views, P5, applied) == {"a": {1: "n3", 0: "n3"}}
    rounds.confirmed({"a": {1: "n3", 0: "n3"}})
    # The moves finish; a later move of the same partition to the same node needs a round.
    assert rounds.pending([_view("a")], P5, applied) == {}
    assert rounds.pending([_view("a", {1: "n3"})], P5, applied) == {"a": {1: "n3"}}


class _Registry(IndexRegistry):
    """The registry's own bookkeeping with views set by the test (no coordinator to read)."""

    def __init__(self, views: list[IndexView], applied: Timestamp) -> None:
        super().__init__(client=None, keyspace="ks")  # type: ignore[arg-type]
        self._views = {v.id: v for v in views}
        self._joined = {v.id: applied for v in views}
        self._fetched_at = float("inf")  # refresh() keeps these views
        self.timekeeper = "n1"


def _job(tmp_path: Path, registry: IndexRegistry, starting: Timestamp | None) -> MaintenanceJob:
    return MaintenanceJob(None, None, registry, {}, tmp_path / "ckpt", starting=starting)  # type: ignore[arg-type]


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The AdvanceStability requests the job sends (the timekeeper's side has its own tests:
    ``test_index_rebalance.py``, ``test_timekeeper*.py``)."""
    sent: list[dict[str, Any]] = []

    def advance(client: Any, keyspace: str, ts: Timestamp, index_ids: list[str], **kw: Any):
        sent.append({"ts": ts, "index_ids": list(index_ids), **kw})
        return StabilityAdvanced(
            keyspace=keyspace, ts=dict(ts.to_wire()), published=index_ids, items_count={}
        )

    monkeypatch.setattr(maintain, "advance_stability", advance)
    return sent


def _commit(ckpt: Path, batch_id: int, end: Timestamp) -> None:
    (ckpt / "offsets").mkdir(parents=True, exist_ok=True)
    (ckpt / "commits").mkdir(parents=True, exist_ok=True)
    (ckpt / "offsets" / str(batch_id)).write_text(f"v1\n{{}}\n{json.dumps(end.to_json())}\n")
    (ckpt / "commits" / str(batch_id)).write_text("v1\n{}\n")


def test_idle_round_at_the_checkpoints_position_names_the_target_once(
    tmp_path: Path, rounds: list[dict[str, Any]]
) -> None:
    registry = _Registry([_view("a", {1: "n3"}), _view("b")], P5)
    job = _job(tmp_path, registry, starting=Timestamp({}))
    _commit(job.checkpoint, 0, Timestamp({0: (2, 1)}))
    _commit(job.checkpoint, 1, P5)  # the stream's next batch starts at P5
    assert job.idle_round() == ["a"]
    assert rounds == [
        {"ts": P5, "index_ids": ["a"], "timekeeper": "n1", "moving": {"a": {1: "n3"}}}
    ]
    assert job.idle_round() == [] and len(rounds) == 1  # the target has its E1


def test_idle_round_waits_for_a_running_batch_and_follows_the_last_batch(
    tmp_path: Path, rounds: list[dict[str, Any]]
) -> None:
    registry = _Registry([_view("a", {1: "n3"})], P5)
    job = _job(tmp_path, registry, starting=P5)
    with job._batch_lock:  # a batch is running: it routes to the target and carries the round
        assert job.idle_round() == []
    assert rounds == []
    later = Timestamp({0: (6, 1), 1: (7, 1)})
    job.steps.stable = later  # the last batch this job stabilised, before any checkpoint commit
    registry.advanced(["a"], later)
    assert job.idle_round() == ["a"]
    assert rounds[0]["ts"] == later


def test_a_batch_that_routed_the_move_makes_the_idle_round_unneeded(
    tmp_path: Path, rounds: list[dict[str, Any]]
) -> None:
    registry = _Registry([_view("a", {1: "n3"})], P5)
    job = _job(tmp_path, registry, starting=P5)
    job.steps.move_rounds.confirmed({"a": {1: "n3"}})  # what ``_attempt`` records after its round
    assert job.idle_round() == [] and rounds == []
