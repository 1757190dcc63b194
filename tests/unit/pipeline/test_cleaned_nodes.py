"""A node that enters a round's plan after the first round is cleaned like the first round's
nodes (``CleanedNodes``, ``pipeline/rounds/cleaned.py``).

A previous driver may have queued rows on a node that no round of this query has named yet
(a round's earlier frames, then the round failed; its slices had switched away, a rollback's
``RollbackSlices`` did not reach it). Those rows may be of a lost branch, and a queued
version wins over a re-delivered one with the same seqno, so the first round that names the
node must drop above its start there before its rows are queued; else the stale versions
are stabilised.

No Spark, no cluster: the offset log is written by the test, and the indexers are a model
whose queues keep the first version of a (partition, seqno), as a slice's queue does.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.pipeline import batch_steps
from shardex.pipeline.maintain import MaintenanceJob
from shardex.pipeline.registry import IndexView
from shardex.pipeline.rounds.cleaned import CleanedNodes
from shardex.pipeline.rounds.machine import DeliveryReport
from shardex.pipeline.rounds.plan import plan_nodes, views_key
from shardex.pipeline.rounds.read_ahead import ReadAhead
from tests.unit.pipeline.round_stub import round_of
from tests.unit.pipeline.test_index_move_idle import _Registry, _view
from tests.unit.pipeline.test_read_ahead import Log, _range, batch_end_job, published_all, ts

Key = tuple[int, int]  # (data partition, seqno)
LOST = "lost branch"  # queued by a previous driver, before a rollback it never saw
BATCH = "batch"


class Queues:
    """Model indexers n1-n3: per node a queue (partition, seqno) -> origin in which the
    version queued first wins, and what stabilises moved to ``applied`` with its origin."""

    def __init__(self) -> None:
        self.queued: dict[str, dict[Key, str]] = {n: {} for n in ("n1", "n2", "n3")}
        self.applied: dict[str, dict[Key, str]] = {n: {} for n in ("n1", "n2", "n3")}
        self.rounds: list[dict[str, Any]] = []

    def _queue(self, node: str, rows: Any) -> None:
        for r in rows:
            self.queued[node].setdefault((r[5], r[6]), BATCH)

    def deliver_and_stabilise(
        self, client: Any, ks: str, batch_id: int, end: Timestamp, by_node: Any, plan: Any,
        moving: Any, slices: Any = None, *, drop_above: Any = None,
    ) -> tuple[DeliveryReport, dict[str, Any]]:  # fmt: skip
        nodes = sorted(set(plan) | set(by_node))
        report = DeliveryReport()
        dropped_on = []
        for node in nodes:
            q = self.queued[node]
            if drop_above is not None:  # first, in the same engine call
                for k in [k for k in q if k[1] > drop_above.get(k[0], 0)]:
                    del q[k]
                dropped_on.append(node)
            report.incarnations[node] = f"i-{node}"
            self._queue(node, by_node.get(node, []))
            for k in [k for k in q if k[1] <= end.seqno(k[0])]:
                self.applied[node][k] = q.pop(k)
        sent = {(r[5], r[6]) for rows in by_node.values() for r in rows}
        self.rounds.append({"drop": drop_above, "dropped_on": dropped_on, "sent": sent})
        return report, {n: "reply" for n in nodes}


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Queues:
    m = Queues()
    monkeypatch.setattr(batch_steps, "run_round", round_of(m.deliver_and_stabilise, published_all))
    return m


class _Fixed(_Registry):
    def refresh(self, *, force: bool = False) -> dict[str, Any]:
        return self.views()


def _job(tmp_path: Path, log: Log) -> tuple[MaintenanceJob, _Fixed]:
    """One index, partition 0 on n1 and 1 on n2; every record's key version goes to index
    partition (data partition % 2)."""
    registry = _Fixed([_view("a")], ts(p0=0, p1=0))
    job = batch_end_job(tmp_path, registry)

    def read(defs: Any, start: Timestamp, end: Timestamp) -> list[Any]:
        return [(*r[:1], r[5] % 2, *r[2:]) for r in log.read(defs, start, end)]

    job.steps.read_and_project = read  # type: ignore[method-assign]
    job.read_ahead = ReadAhead(read, log.latest, max_changes=0)
    (job.checkpoint / "offsets").mkdir(parents=True)
    return job, registry


def _offset(job: MaintenanceJob, b: int, end: Timestamp) -> None:
    (job.checkpoint / "offsets" / str(b)).write_text(f"v1\n{{}}\n{json.dumps(end.to_json())}\n")


def _batch(job: MaintenanceJob, b: int, end: Timestamp) -> None:
    _offset(job, b, end)
    job.run_batch(None, b)  # type: ignore[arg-type]
    job.tail.join()


def _switch(registry: _Fixed, assignment: dict[int, str], moving: dict[int, str]) -> None:
    v = _view("a")
    registry._views = {"a": IndexView(v.record, Topology(seq_num=2, assignment=assignment), moving)}


def _stale_on_n3(model: Queues) -> None:
    """A previous driver queued (3, 4] of partition 0 on n3 (a round's earlier frames), on a
    branch a rollback then cut off; this job's first round does not name n3."""
    model.queued["n3"] = {(0, 3): LOST, (0, 4): LOST}


def _origins(model: Queues) -> set[str]:
    return {o for applied in model.applied.values() for o in applied.values()}


def test_a_move_target_entering_a_later_round_drops_what_it_holds_above_the_start(
    tmp_path: Path, model: Queues
) -> None:
    log = Log()
    job, registry = _job(tmp_path, log)
    _stale_on_n3(model)
    log.write(0, 2)
    log.write(1, 2)
    _batch(job, 0, ts(p0=2, p1=2))
    assert model.rounds[0]["dropped_on"] == ["n1", "n2"]  # the first round's nodes only
    # Partition 0 starts moving to n3: the round routes its rows to n1 and n3.
    _switch(registry, {0: "n1", 1: "n2"}, {0: "n3"})
    log.write(0, 3)
    log.write(1, 3)
    _batch(job, 1, ts(p0=5, p1=5))
    r = model.rounds[-1]
    assert r["drop"] == {0: 2, 1: 2} and "n3" in r["dropped_on"]
    assert model.applied["n3"] == {(0, s): BATCH for s in (3, 4, 5)}
    assert _origins(model) == {BATCH}  # no version of the lost branch was stabilised
    # n3 is cleaned now: the next round with the same plan needs no drop.
    log.write(0, 1)
    _batch(job, 2, ts(p0=6, p1=5))
    assert model.rounds[-1]["drop"] is None
    job.close()


def test_a_new_owner_entering_a_later_round_drops_what_it_holds_above_the_start(
    tmp_path: Path, model: Queues
) -> None:
    log = Log()
    job, registry = _job(tmp_path, log)
    _stale_on_n3(model)
    log.write(0, 2)
    log.write(1, 2)
    log.pending.extend([(0, 3), (1, 3)])  # written while batch 0 runs: read ahead
    # Batch 0's round ends only once the read-ahead has read (2, 5] and stopped: the next
    # batch takes those rows and sends them in its round.
    gate = threading.Event()
    real = batch_steps.run_round

    def slow(*a: Any, **kw: Any) -> Any:
        assert gate.wait(10)
        return real(*a, **kw)

    batch_steps.run_round = slow
    try:
        _offset(job, 0, ts(p0=2, p1=2))
        job.run_batch(None, 0)  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while not log.reads or log.reads[-1][0] != ts(p0=2, p1=2):
            assert time.monotonic() < deadline, "no read-ahead"
            time.sleep(0.005)
        job.read_ahead._halt()
        gate.set()
        job.tail.join()
    finally:
        batch_steps.run_round = real
    # Partition 0 switches to n3 before batch 1.
    _switch(registry, {0: "n3", 1: "n2"}, {})
    log.write(0, 1)
    log.write(1, 1)
    _batch(job, 1, ts(p0=6, p1=6))
    r = model.rounds[-1]
    assert r["drop"] == {0: 2, 1: 2} and r["dropped_on"] == ["n2", "n3"]
    assert r["sent"] == _range(ts(p0=2, p1=2), ts(p0=6, p1=6))
    assert model.applied["n3"] == {(0, s): BATCH for s in (3, 4, 5, 6)}
    assert _origins(model) == {BATCH}
    job.close()


def test_a_node_is_cleaned_by_a_dropping_round_and_a_new_query_trusts_nobody() -> None:
    cleaned = CleanedNodes()
    key = views_key([_view("a")])
    start, end = ts(p0=2, p1=2), ts(p0=5, p1=5)
    assert plan_nodes(key) == {"n1", "n2"}
    assert cleaned.drop_above(start, end, ["n1", "n2"]) == {0: 2, 1: 2}  # first round
    cleaned.round_done(key, {"n1": "i-n1", "n2": "i-n2"}, dropped=True)
    assert cleaned.drop_above(start, end, ["n1", "n2"]) is None
    assert cleaned.drop_above(start, end, ["n2", "n3"]) == {0: 2, 1: 2}  # n3 enters the plan
    # A round that did not drop cleans nobody, though n3 answered it.
    n3_too = Topology(seq_num=2, assignment={0: "n2", 1: "n3"})
    moved = views_key([IndexView(_view("a").record, n3_too, {})])
    cleaned.round_done(moved, {"n2": "i-n2", "n3": "i-n3"}, dropped=False)
    assert cleaned.nodes == {"n1", "n2"}
    cleaned.round_done(moved, {"n2": "i-n2", "n3": "i-n3"}, dropped=True)
    assert cleaned.drop_above(start, end, ["n2", "n3"]) is None
    cleaned.restart()
    assert cleaned.drop_above(start, end, ["n2"]) == {0: 2, 1: 2}
