"""``pipeline/batch_range.py`` without Spark: the async-progress options, the offset log
reader, and ``ExecutionRanges`` against stand-ins for the JVM execution context (the real
one is exercised in ``tests/spark/test_batch_range.py``)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.batch_range import ExecutionRanges, async_progress_options, read_offset
from shardex.pipeline.maintain import MaintenanceJob

TS = Timestamp({0: (5, 11), 1: (7, 12)})
TS2 = Timestamp({0: (9, 11), 1: (7, 12)})


class _Offset:
    def __init__(self, text: str) -> None:
        self.text = text

    def json(self) -> str:
        return self.text


class _Seq:
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def head(self) -> Any:
        return self.items[0]


class _Map:
    def __init__(self, offsets: list[str]) -> None:
        self.offsets = [_Offset(o) for o in offsets]

    def size(self) -> int:
        return len(self.offsets)

    def values(self) -> _Seq:
        return _Seq(self.offsets)


class _Progress:
    def __init__(self, offsets: list[str]) -> None:
        self.map = _Map(offsets)

    def baseMap(self) -> _Map:  # the JVM names (camelCase) from here on
        return self.map


class _Context:
    def __init__(self, batch_id: int, start: list[str], end: list[str]) -> None:
        self.batch_id, self.start, self.end = batch_id, _Progress(start), _Progress(end)

    def batchId(self) -> int:
        return self.batch_id

    def startOffsets(self) -> _Progress:
        return self.start

    def endOffsets(self) -> _Progress:
        return self.end


class _Query:
    """``StreamingQuery`` -> ``_jsq.streamingQuery()`` -> ``getLatestExecutionContext()``."""

    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx
        self._jsq = self

    def streamingQuery(self) -> _Query:
        return self

    def getLatestExecutionContext(self) -> _Context:
        return self.ctx


def _j(ts: Timestamp) -> str:
    return json.dumps(ts.to_json())


def test_async_options_override_the_sink_check_and_refuse_a_negative_interval() -> None:
    opts = async_progress_options(250)
    assert opts["asyncProgressTrackingEnabled"] == "true"
    assert opts["asyncProgressTrackingCheckpointIntervalMs"] == "250"
    assert opts["_asyncProgressTrackingOverrideSinkSupportCheck"] == "true"
    with pytest.raises(ValueError, match=">= 0"):
        async_progress_options(-1)


def test_read_offset_reads_the_third_line_and_refuses_a_short_entry(tmp_path: Path) -> None:
    assert read_offset(tmp_path, 3) is None
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text(f"v1\n{{}}\n{_j(TS)}\n")
    assert read_offset(tmp_path, 3) == TS
    (tmp_path / "offsets" / "4").write_text("v1\n")
    with pytest.raises(ShardexError) as e:
        read_offset(tmp_path, 4)
    assert e.value.code == ErrorCode.INTERNAL


def test_ranges_come_from_the_execution_context() -> None:
    r = ExecutionRanges()
    r.attach(_Query(_Context(4, [_j(TS)], [_j(TS2)])))  # type: ignore[arg-type]
    assert r.range(4) == (TS, TS2)
    assert r.raw_range(4) == (_j(TS), _j(TS2))
    # The checkpoint's first batch: Spark plans it from the source's initial offset.
    r.attach(_Query(_Context(0, [], [_j(TS)])))  # type: ignore[arg-type]
    assert r.range(0) == (None, TS)


@pytest.mark.parametrize(
    ("ctx", "match"),
    [
        (_Context(5, [], ["{}"]), "at batch 5, not 4"),
        (_Context(4, [], []), "no end offset"),
        (_Context(4, ["{}", "{}"], ["{}"]), "2 start offsets"),
    ],
)
def test_a_context_that_is_not_the_batch_is_refused(ctx: _Context, match: str) -> None:
    r = ExecutionRanges()
    r.attach(_Query(ctx))  # type: ignore[arg-type]
    with pytest.raises(ShardexError, match=match) as e:
        r.range(4)
    assert e.value.code == ErrorCode.INTERNAL


def test_a_batch_waits_for_the_query_to_be_attached() -> None:
    r = ExecutionRanges(attach_timeout=0.05)
    with pytest.raises(ShardexError, match="no query was attached"):
        r.range(0)
    r = ExecutionRanges(attach_timeout=30)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(r.range(0)))
    t.start()
    r.attach(_Query(_Context(0, [], [_j(TS)])))  # type: ignore[arg-type]
    t.join(30)
    assert got == [(None, TS)]
    r.detach()
    r.attach_timeout = 0.05
    with pytest.raises(ShardexError, match="no query was attached"):
        r.range(0)


def test_the_job_takes_the_range_from_the_context_with_async_progress(tmp_path: Path) -> None:
    """With async progress the offset log is not read (it may lag); without, it is."""
    job = MaintenanceJob.__new__(MaintenanceJob)
    job.checkpoint = tmp_path
    job.starting = TS
    job.ranges = ExecutionRanges(attach_timeout=0.05)
    job.ranges.attach(_Query(_Context(0, [], [_j(TS2)])))  # type: ignore[arg-type]
    job.async_progress_ms = 0
    assert job.batch_range(0) == (TS, TS2)  # no start: the pinned first start
    job.async_progress_ms = None
    with pytest.raises(ShardexError, match="no offset log entry"):
        job.batch_range(0)
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text(f"v1\n{{}}\n{_j(TS2)}\n")
    assert job.batch_range(0) == (TS, TS2)
