"""The read-ahead (``pipeline/rounds/read_ahead.py``): a batch gets exactly the key versions of its
range whether they were read ahead, partly read ahead or read by the batch; a read-ahead on
another branch (uuid), from another start or for other definitions is not used."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from shardex.api.timekeeper import StabilityAdvanced
from shardex.core.timestamp import Timestamp
from shardex.index.keyversion import UPSERT, KeyVersion
from shardex.pipeline import batch_steps
from shardex.pipeline.maintain import MaintenanceJob
from shardex.pipeline.rounds.machine import DeliveryReport
from shardex.pipeline.rounds.read_ahead import ReadAhead
from tests.unit.pipeline.round_stub import round_of
from tests.unit.pipeline.test_index_move_idle import _view
from tests.unit.pipeline.test_maintain_tail import _FixedRegistry

UUID = 7


def ts(**seqnos: int) -> Timestamp:
    return Timestamp({int(p[1:]): (s, UUID) for p, s in seqnos.items()})


class Log:
    """A change log of two partitions: one key version per record; reads are counted."""

    def __init__(self) -> None:
        self.high = ts(p0=0, p1=0)
        self.reads: list[tuple[Timestamp, Timestamp]] = []
        self.pending: list[tuple[int, int]] = []  # writes landing while a batch runs

    def latest(self) -> Timestamp:
        for p, n in self.pending:
            self.write(p, n)
        self.pending.clear()
        return self.high

    def write(self, p: int, n: int) -> None:
        e = self.high.get(p)
        seqno = (e.seqno if e else 0) + n
        self.high = Timestamp({**dict(self.high.items()), p: (seqno, UUID)})

    def read(self, defs: Any, start: Timestamp, end: Timestamp) -> list[KeyVersion]:
        self.reads.append((start, end))
        return [
            ("a", 0, UPSERT, b"k", f"d{p}", p, s)
            for p, e in end.items()
            for s in range(start.seqno(p) + 1, e.seqno + 1)
        ]


def published_all(client: Any, keyspace: str, at: Timestamp, ids: list[str], **kw: Any) -> Any:
    """A timekeeper stand-in (``advance_stability``) that publishes ``at`` for every index."""
    return StabilityAdvanced(
        keyspace=keyspace, ts=dict(at.to_wire()), published=list(ids), items_count={}
    )


def batch_end_job(tmp_path: Path, registry: Any) -> MaintenanceJob:
    """A job without Spark or a client (the tests replace its reads and calls) that
    stabilises at batch ends (no rounds between batches), from (0, 0)."""
    return MaintenanceJob(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        registry,
        {},
        tmp_path / "ckpt",
        starting=ts(p0=0, p1=0),
        stabilise_ahead=False,
    )


def _range(start: Timestamp, end: Timestamp) -> set[tuple[int, int]]:
    return {(p, s) for p, e in end.items() for s in range(start.seqno(p) + 1, e.seqno + 1)}


def test_take_keeps_what_lies_in_the_batch_and_says_what_it_covers() -> None:
    log = Log()
    ra = ReadAhead(log.read, lambda: log.high, max_changes=0)
    start = ts(p0=2, p1=5)
    log.high = ts(p0=6, p1=9)
    ra.start(["def"], start)  # type: ignore[list-item]
    got = ra.take(["def"], start, ts(p0=4, p1=12))  # type: ignore[list-item]
    assert got is not None
    rows, covered = got.rows, got.covered
    assert covered == ts(p0=4, p1=9)  # p0: the batch ends first; p1: read ahead to 9
    assert {(r[5], r[6]) for r in rows} == _range(start, covered)
    assert ra.take(["def"], start, ts(p0=4, p1=12)) is None  # consumed


def test_another_branch_start_or_definitions_is_not_used() -> None:
    log = Log()
    ra = ReadAhead(log.read, lambda: log.high, max_changes=0)
    start = ts(p0=2, p1=5)
    log.high = ts(p0=6, p1=9)
    ra.start(["def"], start)  # type: ignore[list-item]
    failover = Timestamp({0: (6, UUID), 1: (9, UUID + 1)})  # p1 is on a new branch
    got = ra.take(["def"], start, failover)  # type: ignore[list-item]
    assert got is not None
    rows, covered = got.rows, got.covered
    assert covered == Timestamp({0: (6, UUID), 1: (5, UUID)})  # p1 read in full by the batch
    assert {r[5] for r in rows} == {0}
    ra.start(["def"], start)  # type: ignore[list-item]
    assert ra.take(["other"], start, ts(p0=6, p1=9)) is None  # type: ignore[list-item]
    ra.start(["def"], start)  # type: ignore[list-item]
    assert ra.take(["def"], ts(p0=3, p1=5), ts(p0=6, p1=9)) is None  # type: ignore[list-item]
    assert ra.misses == 2 and ra.hits == 1


def test_the_read_ahead_is_capped_like_a_batch_and_never_behind_the_start() -> None:
    log = Log()
    ra = ReadAhead(log.read, lambda: log.high, max_changes=4)
    log.high = ts(p0=1, p1=10)  # p0 is behind the stream's start (it moved, say)
    ra.start(["def"], ts(p0=3, p1=0))  # type: ignore[list-item]
    ra.discard()
    assert len(log.reads) == 1
    start, end = log.reads[0]
    assert end.seqno(0) == 3 and sum(e.seqno - start.seqno(p) for p, e in end.items()) == 4


def test_batches_get_exactly_their_range_with_the_read_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log()
    delivered: list[set[tuple[int, int]]] = []

    def deliver(
        client: Any, ks: str, batch_id: int, end: Any, by_node: Any, plan: Any, mv: Any, **kw: Any
    ):
        delivered.append({(r[5], r[6]) for rows in by_node.values() for r in rows})
        return DeliveryReport(), {}

    monkeypatch.setattr(batch_steps, "run_round", round_of(deliver, published_all))
    registry = _FixedRegistry([_view("a")], ts(p0=0, p1=0))
    job = batch_end_job(tmp_path, registry)
    job.steps.read_and_project = log.read  # type: ignore[method-assign]
    job.read_ahead = ReadAhead(log.read, log.latest, max_changes=0)
    (job.checkpoint / "offsets").mkdir(parents=True)
    prev = ts(p0=0, p1=0)
    for b, (w0, w1, extra) in enumerate([(3, 2, 1), (4, 0, 2), (0, 5, 3), (2, 2, 0)]):
        log.write(0, w0)
        log.write(1, w1)
        end = log.high
        offset = json.dumps(end.to_json())
        (job.checkpoint / "offsets" / str(b)).write_text(f"v1\n{{}}\n{offset}\n")
        log.pending.append((0, extra))  # lands while the batch runs: read ahead
        job.run_batch(None, b)  # type: ignore[arg-type]
        job.tail.join()
        log.latest()
        assert delivered[-1] == _range(prev, end), b
        prev = end
    job.close()
    # Batches 1-3 started where a read-ahead did: each took its rows and read the rest.
    assert job.read_ahead.hits == 3 and [s.read_ahead for s in job.last] == [0, 1, 2, 3]


def test_the_read_ahead_runs_on_its_own_thread() -> None:
    seen: list[str] = []
    log = Log()
    ra = ReadAhead(
        lambda d, s, e: seen.append(threading.current_thread().name) or [], lambda: log.high, 0
    )  # type: ignore[func-returns-value]
    log.high = ts(p0=1, p1=1)
    ra.start(["def"], ts(p0=0, p1=0))  # type: ignore[list-item]
    ra.discard()
    assert seen == ["read-ahead"]


def test_a_rolling_read_ahead_reads_a_backlog_in_pieces_of_at_most_max_piece() -> None:
    """With rounds between batches each round takes what was read while the last one ran:
    pieces of at most ``max_piece`` keep a backlog's reads beside the rounds (one piece of
    the whole cap would leave nothing to read until its round ended)."""
    log = Log()
    ra = ReadAhead(
        log.read, lambda: log.high, 20, rolling=True, min_piece=1, pause=0.001, max_piece=6
    )
    log.high = ts(p0=10, p1=10)  # a backlog of 20 changes
    done = threading.Event()

    def deliver(ahead: Any, stop: threading.Event, wait: float) -> bool:
        del ahead.rows[:]  # a round took (and applied) what was read so far
        ahead.start = ahead.end
        if ahead.end == log.high:
            done.set()
        return True

    ra.start(["def"], ts(p0=0, p1=0), deliver)  # type: ignore[list-item]
    assert done.wait(10)
    ra.discard()
    sizes = [sum(e.seqno - s.seqno(p) for p, e in end.items()) for s, end in log.reads]
    assert sum(sizes) == 20 and max(sizes) <= 6, sizes
    assert all(a[1] == b[0] for a, b in zip(log.reads, log.reads[1:], strict=False))  # dense
