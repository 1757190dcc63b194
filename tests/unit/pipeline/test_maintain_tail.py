"""The stabilise round of a micro-batch runs beside Spark's commit (``pipeline/rounds/tail.py``):
``run_batch`` returns once the batch is delivered; the next batch (and an idle round) waits
for the round first; a round that failed leaves the registry behind, so a later batch
catches the lost range up from the slices' applied TS. No Spark, no cluster: the offset log
is written by the test and the indexer calls are stubbed."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from shardex.api.timekeeper import StabilityAdvanced
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.keyversion import UPSERT
from shardex.pipeline import batch_steps
from shardex.pipeline.maintain import MaintenanceJob
from shardex.pipeline.rounds.machine import DeliveryReport
from shardex.pipeline.rounds.tail import BatchTail
from shardex.pipeline.source.plan import plan_ranges
from tests.unit.pipeline.round_stub import round_of
from tests.unit.pipeline.test_index_move_idle import _Registry, _view

T0 = Timestamp({0: (0, 1), 1: (0, 1)})


def _ts(a: int, b: int) -> Timestamp:
    return Timestamp({0: (a, 1), 1: (b, 1)})


def _offset(ckpt: Path, batch_id: int, end: Timestamp) -> None:
    (ckpt / "offsets").mkdir(parents=True, exist_ok=True)
    (ckpt / "offsets" / str(batch_id)).write_text(f"v1\n{{}}\n{json.dumps(end.to_json())}\n")


class Calls:
    """The stubbed indexer side: what was delivered and stabilised, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.gate: threading.Event | None = None  # a stabilise waits for it when set
        self.entered = threading.Event()
        self.fail: list[ShardexError] = []  # raised by the next stabilise calls
        self.reads: list[Any] = []  # catch-up ranges read

    def deliver(
        self, client: Any, keyspace: str, batch_id: int, ts: Timestamp, by_node: Any, plan: Any,
        moving: Any, slices: Any = None, **kw: Any,
    ) -> tuple[DeliveryReport, dict[str, Any]]:  # fmt: skip
        self.log.append(("deliver", batch_id))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail:
            raise self.fail.pop(0)
        assert plan == {"n1": ["a"], "n2": ["a"]} and set(by_node) <= set(plan)
        return DeliveryReport(), {n: "reply" for n in plan}

    def advance(self, client: Any, keyspace: str, ts: Timestamp, ids: list[str], **kw: Any):
        assert kw["stabilised"] == {"n1": "reply", "n2": "reply"}
        self.log.append(("stabilise", ts))
        return StabilityAdvanced(
            keyspace=keyspace, ts=dict(ts.to_wire()), published=list(ids), items_count={}
        )


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    c = Calls()
    monkeypatch.setattr(batch_steps, "run_round", round_of(c.deliver, c.advance))

    def read_and_project(client: Any, keyspace: str, defs: Any, start: Any, end: Any) -> list:
        ranges = plan_ranges(keyspace, start, end)
        c.reads.append([(r.partition, r.start_seqno, r.end_seqno) for r in ranges])
        return []

    monkeypatch.setattr(batch_steps, "read_and_project", read_and_project)
    return c


class _FixedRegistry(_Registry):
    def refresh(self, *, force: bool = False) -> dict[str, Any]:
        return self.views()  # a retry's forced refresh too: no coordinator here


def _job(tmp_path: Path, **kw: Any) -> tuple[MaintenanceJob, _Registry]:
    registry = _FixedRegistry([_view("a")], T0)
    job = MaintenanceJob(None, None, registry, {}, tmp_path / "ckpt", starting=T0, **kw)  # type: ignore[arg-type]
    one = ("a", 0, UPSERT, b"k", "d1", 0, 1)

    def project(defs: Any, start: Timestamp, end: Timestamp) -> list[Any]:
        return [one]

    job.steps.read_and_project = project  # type: ignore[method-assign]
    return job, registry


def test_run_batch_returns_before_its_round_and_the_next_batch_waits_for_it(
    tmp_path: Path, calls: Calls
) -> None:
    job, registry = _job(tmp_path)
    _offset(job.checkpoint, 0, _ts(3, 2))
    _offset(job.checkpoint, 1, _ts(5, 4))
    calls.gate = threading.Event()
    job.run_batch(None, 0)  # type: ignore[arg-type]
    assert calls.entered.wait(10)
    assert job.tail.busy() and calls.log == [("deliver", 0)]
    assert registry.applied("a") == T0  # not published yet
    assert job.idle_round() == []  # a round is in flight: no idle round meanwhile
    second = threading.Thread(target=job.run_batch, args=(None, 1))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # batch 1 waits for batch 0's round before anything else
    assert calls.log == [("deliver", 0)]
    calls.gate.set()
    second.join(10)
    job.close()
    assert calls.log == [
        ("deliver", 0),
        ("stabilise", _ts(3, 2)),
        ("deliver", 1),
        ("stabilise", _ts(5, 4)),
    ]
    assert registry.applied("a") == _ts(5, 4) and job.steps.stable == _ts(5, 4)
    assert [s.batch_id for s in job.last] == [0, 1] and calls.reads == []
    # Batch 1's wait for batch 0's round is counted apart (it was held >= 0.3 s above).
    assert job.last[1].wait_round >= 0.3 > job.last[0].wait_round


def test_a_failed_round_fails_the_next_batch_and_its_rerun_catches_the_range_up(
    tmp_path: Path, calls: Calls
) -> None:
    job, registry = _job(tmp_path, retry_for=0.0)
    _offset(job.checkpoint, 0, _ts(3, 2))
    _offset(job.checkpoint, 1, _ts(5, 4))
    calls.fail = [ShardexError("refused", code=ErrorCode.BAD_REQUEST, details={})]
    job.run_batch(None, 0)  # type: ignore[arg-type]
    # Spark would commit batch 0 now; its round fails: batch 1 fails (the query restarts).
    with pytest.raises(ShardexError, match="refused"):
        job.run_batch(None, 1)  # type: ignore[arg-type]
    assert registry.applied("a") == T0 and job.steps.stable is None
    # Spark runs batch 1 again (same offsets): the range of batch 0, applied nowhere, is
    # read again from the slices' applied TS (catch-up) and delivered with batch 1.
    job.run_batch(None, 1)  # type: ignore[arg-type]
    job.close()
    assert calls.reads == [[(0, 0, 3), (1, 0, 2)]]
    assert calls.log[-2:] == [("deliver", 1), ("stabilise", _ts(5, 4))]
    assert registry.applied("a") == _ts(5, 4)


def test_a_retryable_failure_of_the_round_delivers_again(tmp_path: Path, calls: Calls) -> None:
    job, registry = _job(tmp_path)
    _offset(job.checkpoint, 0, _ts(3, 2))
    stale = ShardexError("indexer restarted", code=ErrorCode.STALE_DELIVERY, details={})
    calls.fail = [stale]
    job.run_batch(None, 0)  # type: ignore[arg-type]
    job.close()
    assert calls.log == [("deliver", 0), ("deliver", 0), ("stabilise", _ts(3, 2))]
    assert job.last[-1].retries == 1 and registry.applied("a") == _ts(3, 2)


def test_without_overlap_the_round_ends_inside_run_batch(tmp_path: Path, calls: Calls) -> None:
    job, _ = _job(tmp_path, overlap_stabilise=False)
    _offset(job.checkpoint, 0, _ts(3, 2))
    job.run_batch(None, 0)  # type: ignore[arg-type]
    assert not job.tail.busy()
    assert calls.log == [("deliver", 0), ("stabilise", _ts(3, 2))]


def test_batch_tail_reraises_once_and_refuses_a_second_start() -> None:
    tail = BatchTail("t")
    gate = threading.Event()

    def fail() -> None:
        gate.wait(10)
        raise ZeroDivisionError

    tail.start(fail)
    with pytest.raises(RuntimeError, match="not joined"):
        tail.start(lambda: None)
    with pytest.raises(TimeoutError):
        tail.join(0.05)
    assert tail.busy()
    gate.set()
    with pytest.raises(ZeroDivisionError):
        tail.join(10)
    tail.join()  # forgotten after it was raised once
    assert not tail.busy()
