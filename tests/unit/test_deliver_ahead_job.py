"""Deliver ahead, the maintenance job's side (``pipeline/rounds/deliver_ahead.py``): rows read ahead
are queued on the indexers once the previous round ended, the batch's round sends only the
rest, and what was delivered early plus what the round sent is exactly the batch's range (no
hole at the boundary, rows beyond the end applied only by a later stabilise). A view change
or an indexer restart between the early delivery and the batch falls back to delivering
everything after the indexers dropped what was queued above the batch's start.

No Spark, no cluster: the offset log is written by the test and the indexers are a model
(per node: queue of (partition, seqno), applied set, incarnation) behind the stubbed calls.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.unit.test_index_move_idle import _view
from tests.unit.test_maintain_tail import _FixedRegistry
from tests.unit.test_read_ahead import Log, _range, batch_end_job, published_all, ts

from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline import batch_steps
from shardex.pipeline.indexers import DeliveryReport
from shardex.pipeline.maintain import MaintenanceJob
from shardex.pipeline.registry import IndexView
from shardex.pipeline.rounds import deliver_ahead
from shardex.pipeline.rounds.read_ahead import ReadAhead


class Indexers:
    """Model indexers: ``queued`` and ``applied`` (partition, seqno) per node; a stabilise at
    E moves what is queued at or below E to applied, as a slice does."""

    def __init__(self) -> None:
        self.queued: dict[str, set[tuple[int, int]]] = {"n1": set(), "n2": set()}
        self.applied: dict[str, set[tuple[int, int]]] = {"n1": set(), "n2": set()}
        self.incarnation = {"n1": "i1", "n2": "i2"}
        self.early: list[set[tuple[int, int]]] = []  # rows of each early delivery
        self.attempts = 0  # early deliveries tried
        self.fail: list[ShardexError] = []  # raised by the next early deliveries
        self.rounds: list[dict[str, Any]] = []  # each round: rows sent, drop, early

    def _check(self, node: str, expected: str) -> None:
        if expected and expected != self.incarnation[node]:
            raise ShardexError("restarted", code=ErrorCode.STALE_DELIVERY)

    def restart(self, node: str) -> None:
        self.incarnation[node] += "'"
        self.queued[node] = set()  # the queue lived in memory

    def deliver_rows(
        self, client: Any, ks: str, batch_id: int, by_node: Any, incarnations: Any
    ) -> DeliveryReport:
        self.attempts += 1
        if self.fail:
            raise self.fail.pop(0)
        for node in by_node:
            self._check(node, incarnations.get(node, ""))
        got = set()
        for node, rows in by_node.items():
            self.queued[node] |= {(r[5], r[6]) for r in rows}
            got |= {(r[5], r[6]) for r in rows}
        self.early.append(got)
        return DeliveryReport()

    def deliver_and_stabilize(
        self, client: Any, ks: str, batch_id: int, end: Timestamp, by_node: Any, plan: Any,
        moving: Any, slices: Any = None, *, early: Any = None, drop_above: Any = None,
        drop_nodes: Any = (),
    ) -> tuple[DeliveryReport, dict[str, Any]]:  # fmt: skip
        nodes = sorted(set(plan) | set(by_node))
        try:
            for node in nodes:
                self._check(node, (early or {}).get(node, ""))
        except ShardexError:
            self.rounds.append({"refused": dict(early or {})})
            raise
        sent = set()
        for node in nodes:
            if drop_above is not None:
                self.queued[node] = {
                    (p, s) for p, s in self.queued[node] if s <= drop_above.get(p, 0)
                }
            rows = {(r[5], r[6]) for r in by_node.get(node, [])}
            sent |= rows
            floor = {x for x in self.queued[node] | rows if x[1] <= end.seqno(x[0])}
            self.applied[node] |= floor
            self.queued[node] = (self.queued[node] | rows) - floor
        self.rounds.append({"sent": sent, "drop": drop_above, "early": dict(early or {})})
        report = DeliveryReport()
        report.incarnations.update({n: self.incarnation[n] for n in nodes})
        return report, {n: "reply" for n in nodes}


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Indexers:
    m = Indexers()
    monkeypatch.setattr(batch_steps, "deliver_and_stabilize", m.deliver_and_stabilize)
    monkeypatch.setattr(batch_steps, "advance_stability", published_all)
    monkeypatch.setattr(deliver_ahead, "deliver_rows", m.deliver_rows)
    return m


def _rows_to_both(defs: Any, start: Timestamp, end: Timestamp, log: Log) -> list[Any]:
    """Log.read with every record's key version in index partition p % 2: rows for both
    nodes (the view's topology puts partition 0 on n1, 1 on n2)."""
    return [(*r[:1], r[5] % 2, *r[2:]) for r in log.read(defs, start, end)]


def _job(tmp_path: Path, log: Log, views: list[IndexView]) -> tuple[MaintenanceJob, Any]:
    registry = _FixedRegistry(views, ts(p0=0, p1=0))
    job = batch_end_job(tmp_path, registry)

    def read(defs: Any, start: Timestamp, end: Timestamp) -> list[Any]:
        return _rows_to_both(defs, start, end, log)

    job._read_and_project = read  # type: ignore[method-assign]
    job.read_ahead = ReadAhead(read, log.latest, max_changes=0)
    (job.checkpoint / "offsets").mkdir(parents=True)
    return job, registry


def _batch(job: MaintenanceJob, b: int, end: Timestamp) -> None:
    offset = json.dumps(end.to_json())
    (job.checkpoint / "offsets" / str(b)).write_text(f"v1\n{{}}\n{offset}\n")
    job.run_batch(None, b)  # type: ignore[arg-type]
    job.tail.join()


def _two_written(tmp_path: Path) -> tuple[Log, MaintenanceJob, Any]:
    """A job over one index whose log holds 2 changes per partition, with 3 more per
    partition landing while the first batch runs (the read-ahead's rows)."""
    log = Log()
    job, registry = _job(tmp_path, log, [_view("a")])
    log.write(0, 2)
    log.write(1, 2)
    log.pending.extend([(0, 3), (1, 3)])
    return log, job, registry


def _first_batch_early(tmp_path: Path, model: Indexers) -> tuple[Log, MaintenanceJob, Any]:
    """``_two_written``, then batch 0 to (2, 2) and its read-ahead's (2, 5] delivered early."""
    log, job, registry = _two_written(tmp_path)
    _batch(job, 0, ts(p0=2, p1=2))
    _wait_early(model, 1)
    return log, job, registry


def _wait_early(model: Indexers, n: int) -> None:
    """Until the read-ahead thread has made its ``n``-th early delivery (bounded)."""
    deadline = time.monotonic() + 10
    while len(model.early) < n:
        assert time.monotonic() < deadline, "no early delivery"
        time.sleep(0.005)


def _applied(model: Indexers) -> set[tuple[int, int]]:
    return model.applied["n1"] | model.applied["n2"]


def test_early_rows_and_the_round_together_are_exactly_the_batch(
    tmp_path: Path, model: Indexers
) -> None:
    log = Log()
    job, _ = _job(tmp_path, log, [_view("a")])
    start = ts(p0=0, p1=0)
    # (writes before the batch's offsets, the batch's end, writes landing during the batch)
    plan = [((3, 2), (3, 2), (4, 4)), ((0, 0), (5, 3), (1, 2)), ((2, 2), (9, 5), (0, 0))]
    for b, ((w0, w1), (e0, e1), (x0, x1)) in enumerate(plan):
        log.write(0, w0)
        log.write(1, w1)
        end = ts(p0=e0, p1=e1)  # may end below what was read (and delivered) ahead
        log.pending.extend([(0, x0), (1, x1)])
        _batch(job, b, end)
        # Every record up to the end is applied, and nothing beyond it (the early rows above
        # the end stay queued until a later stabilise).
        assert _applied(model) == _range(ts(p0=0, p1=0), end), b
        early: set[tuple[int, int]] = set().union(*model.early)
        sent = model.rounds[-1]["sent"]
        batch = _range(start, end)
        if b:
            # The round sent only what was not delivered ahead; both together are the batch
            # (plus, early, rows beyond its end).
            assert job.last[-1].early > 0 and not (sent & early)
            assert batch <= (sent | early) and sent <= batch
        _wait_early(model, b + 1)
        start = end
    # The rows above the last end, delivered early, are still queued, not applied.
    queued = model.queued["n1"] | model.queued["n2"]
    assert queued and all(s > start.seqno(p) for p, s in queued)
    job.close()


def test_a_view_change_between_early_delivery_and_the_batch_falls_back(
    tmp_path: Path, model: Indexers
) -> None:
    _, job, registry = _first_batch_early(tmp_path, model)
    # The index's topology changes (a new version, same nodes) before the next batch.
    v = _view("a")
    moved = IndexView(v.record, Topology(seq_num=2, assignment={0: "n2", 1: "n1"}), {})
    registry._views = {"a": moved}
    _batch(job, 1, ts(p0=5, p1=5))
    r = model.rounds[-1]
    assert job.last[-1].early == 0
    assert r["drop"] == {0: 2, 1: 2}  # the queues were cleared above the batch's start
    assert r["sent"] == _range(ts(p0=2, p1=2), ts(p0=5, p1=5))  # then everything sent
    assert _applied(model) == _range(ts(p0=0, p1=0), ts(p0=5, p1=5))
    job.close()


def test_an_indexer_restarted_after_the_early_delivery_gets_the_whole_batch(
    tmp_path: Path, model: Indexers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_steps.time, "sleep", lambda s: None)  # the retry's back-off
    _, job, _ = _first_batch_early(tmp_path, model)
    model.restart("n1")  # its early rows are gone
    _batch(job, 1, ts(p0=5, p1=5))
    first, retry = model.rounds[-2:]
    assert first == {"refused": {"n1": "i1", "n2": "i2"}}  # STALE_DELIVERY
    assert retry["drop"] == {0: 2, 1: 2} and not retry["early"]
    assert retry["sent"] == _range(ts(p0=2, p1=2), ts(p0=5, p1=5))
    assert job.last[-1].retries == 1 and job.last[-1].early == 0
    assert _applied(model) == _range(ts(p0=0, p1=0), ts(p0=5, p1=5))
    job.close()


def test_a_new_job_drops_what_a_previous_one_may_have_queued_ahead(
    tmp_path: Path, model: Indexers
) -> None:
    log = Log()
    job, _ = _job(tmp_path, log, [_view("a")])
    log.write(0, 1)
    _batch(job, 0, ts(p0=1, p1=0))
    assert model.rounds[0]["drop"] == {0: 0, 1: 0}  # first round of the job: unknown queues
    log.write(0, 1)
    job.read_ahead.discard()
    _batch(job, 1, ts(p0=2, p1=0))
    assert model.rounds[1]["drop"] is None  # nothing was queued ahead since
    job.close()


def test_a_failed_early_delivery_makes_the_next_round_drop_and_send_all(
    tmp_path: Path, model: Indexers
) -> None:
    log, job, _ = _first_batch_early(tmp_path, model)  # (2, 5] delivered early
    log.pending.extend([(0, 2), (1, 2)])
    model.fail.append(ShardexError("down", code=ErrorCode.NODE_UNAVAILABLE))
    _batch(job, 1, ts(p0=4, p1=4))  # (4, 5] carried; (5, 7] read, its delivery fails
    deadline = time.monotonic() + 10
    while model.attempts < 2:
        assert time.monotonic() < deadline, "no second early delivery"
        time.sleep(0.005)
    log.write(0, 1)
    log.write(1, 1)
    _batch(job, 2, ts(p0=8, p1=8))
    # Some node may have queued part of the failed delivery: no record says what, so the
    # round drops above its start and sends everything (the batch's own early send too).
    assert model.attempts == 2 and len(model.early) == 1
    assert model.rounds[-1]["drop"] == {0: 4, 1: 4}
    assert model.rounds[-1]["sent"] == _range(ts(p0=4, p1=4), ts(p0=8, p1=8))
    assert job.last[-1].early == 0
    assert _applied(model) == _range(ts(p0=0, p1=0), ts(p0=8, p1=8))
    job.close()


def test_the_rows_sent_early_and_the_rest_are_the_batch_at_any_boundary() -> None:
    for cut in range(0, 7):
        log = Log()
        log.write(0, 3)
        log.write(1, 3)
        start, ahead_end = ts(p0=0, p1=0), ts(p0=3, p1=3)

        def deliver(ahead: Any, stop: Any, wait: float, cut: int = cut) -> bool:
            # Only the first ``cut`` rows went: sent up to that row's seqno per partition.
            ahead.sent = cut
            upto = {0: 0, 1: 0}
            for r in ahead.rows[:cut]:
                upto[r[5]] = r[6]
            ahead.sent_to, ahead.tag = ts(p0=upto[0], p1=upto[1]), "t"
            return False  # no more deliveries: the thread ends

        ra = ReadAhead(log.read, log.latest, max_changes=0)
        ra.start(["def"], start, deliver)  # type: ignore[list-item]
        assert ra._thread is not None
        ra._thread.join(10)
        log.write(0, 2)  # the batch ends beyond the read-ahead: (3, 5] it reads itself
        end = ts(p0=5, p1=4)
        got = ra.take(["def"], start, end)  # type: ignore[list-item]
        assert got is not None and got.covered == ahead_end
        own = log.read(["def"], got.covered, end)
        skip = deliver_ahead.Skip(len(got.rows), got.sent, {}, None)
        rows = got.rows + own
        sent_early = {(r[5], r[6]) for r in got.rows[:cut]}
        rest = {(r[5], r[6]) for r in skip.rest(rows)}
        assert not (rest & sent_early), cut
        assert rest | sent_early == _range(start, end), cut


def test_rows_taken_but_not_sent_go_ahead_while_the_batch_reads_the_rest(
    tmp_path: Path, model: Indexers
) -> None:
    log, job, _ = _two_written(tmp_path)
    # The round's end waits for the test: the read-ahead's rows are read, not delivered.
    job.read_ahead.rolling = False
    gate = threading.Event()
    real = model.deliver_and_stabilize

    def slow(*a: Any, **kw: Any) -> Any:
        assert gate.wait(10)
        return real(*a, **kw)

    batch_steps.deliver_and_stabilize = slow  # type: ignore[assignment]
    try:
        offset = json.dumps(ts(p0=2, p1=2).to_json())
        (job.checkpoint / "offsets" / "0").write_text(f"v1\n{{}}\n{offset}\n")
        job.run_batch(None, 0)  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while not log.reads or log.reads[-1][0] != ts(p0=2, p1=2):
            assert time.monotonic() < deadline, "no read-ahead"
            time.sleep(0.005)
        job.read_ahead._halt()  # the next batch starts before the early delivery ran
        gate.set()
        job.tail.join()
    finally:
        batch_steps.deliver_and_stabilize = real  # type: ignore[assignment]
    assert model.early == []
    log.write(0, 1)
    log.write(1, 1)
    _batch(job, 1, ts(p0=6, p1=6))
    # Sent at the batch's start, while it read (5, 6]; the round sent only that.
    assert model.early == [_range(ts(p0=2, p1=2), ts(p0=5, p1=5))]
    assert model.rounds[-1]["sent"] == _range(ts(p0=5, p1=5), ts(p0=6, p1=6))
    assert _applied(model) == _range(ts(p0=0, p1=0), ts(p0=6, p1=6))
    job.close()


def test_the_rolling_read_ahead_reads_contiguous_pieces_and_carries_the_rest() -> None:
    log = Log()
    ticks = [0]

    def latest() -> Timestamp:
        ticks[0] += 1
        log.write(ticks[0] % 2, 1)  # a change lands between two looks at the high seqnos
        return log.high

    def deliver(ahead: Any, stop: Any, wait: float) -> bool:
        ahead.sent, ahead.sent_to, ahead.tag = len(ahead.rows), ahead.end, "t"
        return True

    ra = ReadAhead(log.read, latest, max_changes=0, rolling=True, pause=0.001, min_piece=2)
    start = ts(p0=0, p1=0)
    ra.start(["def"], start, deliver)  # type: ignore[list-item]
    deadline = time.monotonic() + 10
    while ra.pieces < 4:
        assert time.monotonic() < deadline, "no rolling pieces"
        time.sleep(0.001)
    ra._halt()
    read_to = log.reads[-1][1]
    assert [s for s, _ in log.reads[1:]] == [e for _, e in log.reads[:-1]]  # no gap, no overlap
    end = ts(p0=read_to.seqno(0) - 1, p1=read_to.seqno(1))  # the batch ends inside
    assert log.reads[0][0] == start
    got = ra.take(["def"], start, end)  # type: ignore[list-item]
    assert got is not None and got.covered == end and got.tag == "t" and got.branch_ok
    assert {(r[5], r[6]) for r in got.rows} == _range(start, end)
    assert got.sent == {0: end.seqno(0), 1: end.seqno(1)}
    # What lies beyond the end (delivered) is carried to the next read-ahead at ``end``.
    carried = ra._carried
    assert carried is not None and carried.start == end and carried.end == read_to
    assert {(r[5], r[6]) for r in carried.rows} == _range(end, read_to)
    assert carried.sent == len(carried.rows) and carried.tag == "t"


def test_rows_queued_by_a_discarded_read_ahead_are_dropped_by_the_next_round(
    tmp_path: Path, model: Indexers
) -> None:
    log, job, _ = _first_batch_early(tmp_path, model)  # (2, 5] queued early
    job.read_ahead.discard()  # as a batch read by Spark's workers does: the record is gone
    log.pending.extend([(0, 1), (1, 1)])
    _batch(job, 1, ts(p0=3, p1=3))
    assert model.rounds[-1]["drop"] == {0: 2, 1: 2}  # the rows above 3 went too
    _wait_early(model, 2)  # the next read-ahead's rows, (3, 6], delivered anew
    _batch(job, 2, ts(p0=6, p1=6))
    assert _applied(model) == _range(ts(p0=0, p1=0), ts(p0=6, p1=6))
    job.close()
