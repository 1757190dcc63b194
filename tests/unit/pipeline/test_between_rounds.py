"""Stability rounds between Spark's micro-batches (``pipeline/rounds/between.py``): after a
batch's round, the read-ahead's pieces are stabilised and published in rounds of their own
(ahead of Spark's next batch); the next batch leaves out what they applied and stabilises at
F = max(its end, what any round attempted), so a slice is never asked to go back, and a round
that failed half way is repaired by the batch. A restarted registry reads the highest applied
TS of the slices too.

No Spark, no cluster: the offset log is written by the test and the indexers are a model
(per node: queue, applied records and applied TS; a stabilise that would move a node's TS
back in one partition and forward in another is refused, as a slice does).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardex.api.index import SliceInfo
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.records import STATE_ACTIVE
from shardex.pipeline import batch_steps
from shardex.pipeline import registry as registry_mod
from shardex.pipeline.maintain import MaintenanceJob
from shardex.pipeline.registry import IndexRegistry
from shardex.pipeline.rounds.between import not_applied, on_branch, stabilise_ts
from shardex.pipeline.rounds.machine import DeliveryReport
from shardex.pipeline.rounds.read_ahead import ReadAhead
from tests.unit.pipeline.round_stub import round_of
from tests.unit.pipeline.test_index_move_idle import _view
from tests.unit.pipeline.test_maintain_tail import _FixedRegistry
from tests.unit.pipeline.test_read_ahead import UUID, Log, _range, published_all, ts

NODES = ("n1", "n2")


class Indexers:
    """Model indexers (index partition p on node n{p+1}): a stabilise at T applies what is
    queued at or below T and sets the node's applied TS; one below the node's TS in some
    partition and above in another is refused (BAD_REQUEST), one at or below it is a no-op."""

    def __init__(self) -> None:
        self.queued: dict[str, set[tuple[int, int]]] = {n: set() for n in NODES}
        self.applied: dict[str, set[tuple[int, int]]] = {n: set() for n in NODES}
        self.at: dict[str, dict[int, int]] = {n: {0: 0, 1: 0} for n in NODES}
        self.rounds: list[dict[str, Any]] = []  # every stabilise: its TS, rows sent per node
        self.fail_round: int | None = None  # round number whose delivery n2 never gets

    def deliver_and_stabilise(
        self, client: Any, ks: str, batch_id: int, end: Timestamp, by_node: Any, plan: Any,
        moving: Any, slices: Any = None, *, drop_above: Any = None,
    ) -> tuple[DeliveryReport, dict[str, Any]]:  # fmt: skip
        sent = {n: {(r[5], r[6]) for r in by_node.get(n, [])} for n in NODES}
        failing = "n2" if self.fail_round == len(self.rounds) else None
        self.rounds.append({"ts": end, "sent": sent})
        for node in NODES:
            if node == failing:
                continue  # it never got the message
            self.queued[node] |= sent[node]
            at = self.at[node]
            back = any(end.seqno(p) < s for p, s in at.items())
            forward = any(end.seqno(p) > s for p, s in at.items())
            if back and forward:
                raise ShardexError(f"{node}: stabilise moves back", code=ErrorCode.BAD_REQUEST)
            if not forward:
                continue
            done = {x for x in self.queued[node] if x[1] <= end.seqno(x[0])}
            # Every record of (applied, end] must be there: (P1) of the indexer's argument.
            need = {(p, s) for p in at for s in range(at[p] + 1, end.seqno(p) + 1)}
            mine = {x for x in need if x[0] % 2 == NODES.index(node)}
            assert mine <= done | self.applied[node], f"{node} lacks {mine - done}"
            self.applied[node] |= done
            self.queued[node] -= done
            self.at[node] = {p: max(s, end.seqno(p)) for p, s in at.items()}
        if failing is not None:
            raise ShardexError(f"{failing} is down", code=ErrorCode.NODE_UNAVAILABLE)
        report = DeliveryReport()
        report.incarnations.update({n: "i" for n in NODES})
        return report, {n: "reply" for n in NODES}


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Indexers:
    m = Indexers()
    monkeypatch.setattr(batch_steps, "run_round", round_of(m.deliver_and_stabilise, published_all))
    return m


def _job(tmp_path: Path, log: Log) -> tuple[MaintenanceJob, _FixedRegistry]:
    registry = _FixedRegistry([_view("a")], ts(p0=0, p1=0))
    job = MaintenanceJob(
        None, None, registry, {}, tmp_path / "ckpt", starting=ts(p0=0, p1=0),  # type: ignore[arg-type]
        stabilise_ahead=True, retry_for=5.0,
    )  # fmt: skip

    def read(defs: Any, start: Timestamp, end: Timestamp) -> list[Any]:
        # record (p, s) in index partition p: partition 0's rows on n1, 1's on n2
        return [(*r[:1], r[5] % 2, *r[2:]) for r in log.read(defs, start, end)]

    job.steps.read_and_project = read  # type: ignore[method-assign]
    job.read_ahead = ReadAhead(read, log.latest, 0, rolling=True, min_piece=1, pause=0.01)
    job.read_ahead.on_end = job.between.ended.set
    job.rest_while_rounds = 0.0  # a batch left to the rounds returns at once (tested apart)
    (job.checkpoint / "offsets").mkdir(parents=True)
    return job, registry


def _backlog(tmp_path: Path) -> tuple[Log, MaintenanceJob, _FixedRegistry]:
    """A job over a log of two records per partition, and three more each written while
    its first batch (0, 2] runs (``Log.pending``)."""
    log = Log()
    job, registry = _job(tmp_path, log)
    log.write(0, 2)
    log.write(1, 2)
    log.pending.extend([(0, 3), (1, 3)])
    return log, job, registry


def _batch(job: MaintenanceJob, b: int, end: Timestamp) -> None:
    (job.checkpoint / "offsets" / str(b)).write_text(f"v1\n{{}}\n{json.dumps(end.to_json())}\n")
    job.run_batch(None, b)  # type: ignore[arg-type]
    job.tail.join()


def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _applied(model: Indexers) -> set[tuple[int, int]]:
    return model.applied["n1"] | model.applied["n2"]


def test_a_round_between_batches_publishes_ahead_of_spark_then_the_batch_takes_over(
    tmp_path: Path, model: Indexers
) -> None:
    log, job, registry = _backlog(tmp_path)
    _batch(job, 0, ts(p0=2, p1=2))
    assert model.rounds[0]["ts"] == ts(p0=2, p1=2)
    # The read-ahead's piece (2, 5] gets a round of its own, published before any batch.
    _until(lambda: job.steps.stable == ts(p0=5, p1=5), "no round between batches")
    assert model.rounds[1]["ts"] == ts(p0=5, p1=5)
    assert model.rounds[1]["sent"]["n1"] == {(0, 3), (0, 4), (0, 5)}
    assert registry.applied("a") == ts(p0=5, p1=5) and _applied(model) == _range(
        ts(p0=0, p1=0), ts(p0=5, p1=5)
    )
    assert job.between.stats.rounds == 1
    # Spark's next batch ends below what was published (its latestOffset came first): the
    # rounds between batches are healthy and route by the same views, so the batch leaves
    # its range to them: no round of its own, nothing sent again, no slice asked to go back.
    n = len(model.rounds)
    _batch(job, 1, ts(p0=4, p1=3))
    assert len(model.rounds) == n and job.last[-1].between
    # Writes go on: the rounds publish them with no batch at all, then a batch ending past
    # the last round is left to them too (their next round covers it).
    log.write(0, 2)
    log.write(1, 1)
    _until(lambda: job.steps.stable == ts(p0=7, p1=6), "no second round between batches")
    log.write(0, 1)
    _batch(job, 2, ts(p0=8, p1=6))
    assert job.last[-1].between
    _until(lambda: job.steps.stable == ts(p0=8, p1=6), "no round past the batch's end")
    assert _applied(model) == _range(ts(p0=0, p1=0), ts(p0=8, p1=6))
    assert {x for r in model.rounds for x in r["sent"]["n1"] | r["sent"]["n2"]} == _range(
        ts(p0=0, p1=0), ts(p0=8, p1=6)
    )  # every record sent, each once: len(rounds' rows) == len(range)
    assert sum(len(r["sent"]["n1"]) + len(r["sent"]["n2"]) for r in model.rounds) == 14
    # An index joins (built at T0 = (8, 6)): the views changed, so the next batch halts the
    # rounds and takes over, stabilising both at F = max(its end, what was attempted).
    registry._views["b"] = _view("b")
    registry._joined["b"] = ts(p0=8, p1=6)
    log.write(1, 1)
    _until(lambda: job.steps.stable == ts(p0=8, p1=7), "no round for (6, 7] of p1")
    n = len(model.rounds)
    _batch(job, 3, ts(p0=8, p1=7))
    assert not job.last[-1].between and model.rounds[n]["ts"] == ts(p0=8, p1=7)
    assert not (model.rounds[n]["sent"]["n1"] | model.rounds[n]["sent"]["n2"])  # applied
    assert registry.applied("b") == ts(p0=8, p1=7)
    # And the rounds go on by the new views; the next batch leaves its range to them.
    log.write(0, 1)
    _until(lambda: job.steps.stable == ts(p0=9, p1=7), "no round by the new views")
    _batch(job, 4, ts(p0=9, p1=7))
    assert job.last[-1].between
    job.close()


def test_a_round_between_batches_that_failed_half_way_is_repaired_by_the_batch(
    tmp_path: Path, model: Indexers
) -> None:
    log, job, registry = _backlog(tmp_path)
    # The round between batches (the 2nd round) reaches n1 (applied at 5), not n2 (at 2).
    model.fail_round = 1
    _batch(job, 0, ts(p0=2, p1=2))
    _until(lambda: job.between.stats.failed == 1, "the round between batches did not fail")
    assert model.at == {"n1": {0: 5, 1: 5}, "n2": {0: 2, 1: 2}}
    # Not published, so not applied in the registry; but attempted: the ahead TS has it.
    assert registry.applied("a") == ts(p0=2, p1=2)
    assert registry.ahead("a") == ts(p0=5, p1=5)
    # No more rounds until the next batch (more writes come, nothing is stabilised).
    log.write(0, 1)
    # The read-ahead (still rolling) reads that write; with its rounds stopped it must not
    # stabilise it.
    _until(
        lambda: (a := job.read_ahead._ahead) is not None and a.end.seqno(0) >= 6,
        "the read-ahead did not read the new write",
    )
    assert len(model.rounds) == 2
    # Spark's next batch ends at (4, 4), below n1's applied TS: stabilising there would be
    # refused by n1 (back in both partitions, forward on n2). The batch stabilises at
    # F = (5, 5) with every record of (2, 5] (n1 drops what it has), and publishes.
    _batch(job, 1, ts(p0=4, p1=4))
    assert model.rounds[2]["ts"] == ts(p0=5, p1=5)
    assert model.rounds[2]["sent"]["n2"] == {(1, 3), (1, 4), (1, 5)}
    assert registry.applied("a").covers(ts(p0=5, p1=5))
    # And the rounds between batches go on from there (the write above: (5, 6] of p0).
    _until(lambda: job.steps.stable == ts(p0=6, p1=5), "no round after the repair")
    assert model.at == {"n1": {0: 6, 1: 5}, "n2": {0: 6, 1: 5}}
    assert _applied(model) == _range(ts(p0=0, p1=0), ts(p0=6, p1=5))
    job.close()


def test_without_the_attempted_ts_the_batch_would_move_a_slice_back(model: Indexers) -> None:
    """What the repair above guards against: the model refuses the batch's own end."""
    model.at["n1"] = {0: 5, 1: 5}
    with pytest.raises(ShardexError) as err:
        model.deliver_and_stabilise(None, "ks", 1, ts(p0=4, p1=6), {}, {}, {})
    assert err.value.code is ErrorCode.BAD_REQUEST


def test_the_batch_ts_and_the_branch_rule() -> None:
    end = ts(p0=4, p1=7)
    assert stabilise_ts(end, [ts(p0=5, p1=2), ts(p0=1, p1=8)]) == ts(p0=5, p1=8)
    assert on_branch(end, ts(p0=2, p1=1), ts(p0=9, p1=1))
    other = Timestamp({0: (9, UUID + 1), 1: (1, UUID)})
    # A rollback or failover between: a slice past the end on another branch, left out;
    # below the end, the applied TS decides as before (``end.covers(applied)``).
    assert not on_branch(end, ts(p0=2, p1=1), other)
    assert on_branch(end, ts(p0=2, p1=1), Timestamp({0: (3, UUID + 1)}))
    assert not on_branch(end, Timestamp({0: (3, UUID + 1)}), ts(p0=3))
    assert on_branch(end, Timestamp({0: (0, UUID + 1)}), ts())  # nothing seen there
    rows = [("a", 0, 0, b"k", "d", 0, s) for s in (3, 4, 5)] + [("b", 0, 0, b"k", "d", 0, 4)]
    assert not_applied(rows, {"a": ts(p0=4), "b": ts(p0=3)}) == [rows[2], rows[3]]


def test_a_restarted_registry_reads_the_highest_applied_ts_of_the_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = _view("a")

    def slices(client: Any, nodes: Any, index_id: str) -> list[SliceInfo]:
        return [
            SliceInfo(index_id="a", name="ix_a", keyspace="ks", partition=0,
                      state=STATE_ACTIVE, applied={0: (5, UUID), 1: (2, UUID)}),
            SliceInfo(index_id="a", name="ix_a", keyspace="ks", partition=1,
                      state=STATE_ACTIVE, applied={0: (3, UUID), 1: (4, UUID)}),
        ]  # fmt: skip

    monkeypatch.setattr(registry_mod, "list_slices", slices)
    registry = IndexRegistry(None, "ks")  # type: ignore[arg-type]
    registry._inspect_new({"a": view})
    assert registry.applied("a") == ts(p0=3, p1=2)  # where the stream continues from
    assert registry.ahead("a") == ts(p0=5, p1=4)  # what a batch must stabilise at least at
    registry.attempted(["a"], ts(p0=4, p1=6))
    assert registry.ahead("a") == ts(p0=5, p1=6)
    registry.advanced(["a"], ts(p0=6, p1=6))
    assert registry.ahead("a") == ts(p0=6, p1=6) == registry.applied("a")


def test_a_batch_arriving_while_a_round_runs_leaves_its_range_to_the_rounds(
    tmp_path: Path, model: Indexers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round in flight is no reason to take over (it started after one that published
    every index): the batch neither waits for it nor sends anything."""
    log = Log()
    job, _ = _job(tmp_path, log)
    gate = threading.Event()
    entered = threading.Event()
    real = model.deliver_and_stabilise

    def held(*a: Any, **kw: Any) -> Any:
        if len(model.rounds) == 1:  # the first round between batches waits for the test
            entered.set()
            assert gate.wait(10)
        return real(*a, **kw)

    monkeypatch.setattr(batch_steps, "run_round", round_of(held, published_all))
    log.write(0, 2)
    log.write(1, 2)
    log.pending.extend([(0, 3), (1, 3)])
    _batch(job, 0, ts(p0=2, p1=2))
    assert entered.wait(10)  # the round for (2, 5] is in flight
    _batch(job, 1, ts(p0=4, p1=4))
    assert job.last[-1].between and len(model.rounds) == 1
    gate.set()
    _until(lambda: job.steps.stable == ts(p0=5, p1=5), "the round in flight did not end")
    assert _applied(model) == _range(ts(p0=0, p1=0), ts(p0=5, p1=5))
    job.close()


def test_a_batch_left_to_the_rounds_rests_until_they_stop(tmp_path: Path, model: Indexers) -> None:
    """Spark's batches only move the checkpoint while the rounds carry the stream: one left
    to them holds the next back until they stop (here a failed round, then ``stop_rounds``),
    not for its whole rest, and rounds go on meanwhile."""
    log, job, _registry = _backlog(tmp_path)
    job.rest_while_rounds = 60.0
    _batch(job, 0, ts(p0=2, p1=2))
    _until(lambda: job.steps.stable == ts(p0=5, p1=5), "no round between batches")

    def left(b: int, end: Timestamp) -> threading.Thread:
        (job.checkpoint / "offsets" / str(b)).write_text(f"v1\n{{}}\n{json.dumps(end.to_json())}\n")
        t = threading.Thread(target=job.run_batch, args=(None, b), daemon=True)
        t.start()
        return t

    resting = left(1, ts(p0=5, p1=5))
    _until(lambda: len(job.last) == 2 and job.last[-1].between, "batch 1 not left to rounds")
    log.write(0, 1)
    _until(lambda: job.steps.stable == ts(p0=6, p1=5), "no round while the batch rests")
    assert resting.is_alive()  # still resting: the rounds carry on
    model.fail_round = len(model.rounds)  # the next round fails: the rounds stop
    log.write(1, 1)
    resting.join(10)
    assert not resting.is_alive() and job.between.stats.failed == 1
    # A batch takes over and the rounds resume; the next one left to them rests again
    # until the query is being stopped.
    _batch(job, 2, ts(p0=6, p1=6))
    log.write(0, 1)
    _until(lambda: job.steps.stable == ts(p0=7, p1=6), "no round after the repair")
    resting = left(3, ts(p0=7, p1=6))
    _until(lambda: len(job.last) == 4 and job.last[-1].between, "batch 3 not left to rounds")
    assert resting.is_alive()
    job.stop_rounds()
    resting.join(10)
    assert not resting.is_alive()
    job.close()
