"""``pipeline/batch_range.py`` without Spark: a batch's range from Spark's offset log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.batch_range import logged_range, read_offset

TS = Timestamp({0: (5, 11), 1: (7, 12)})
TS2 = Timestamp({0: (9, 11), 1: (7, 12)})


def _j(ts: Timestamp) -> str:
    return json.dumps(ts.to_json())


def test_read_offset_reads_the_third_line_and_refuses_a_short_entry(tmp_path: Path) -> None:
    assert read_offset(tmp_path, 3) is None
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text(f"v1\n{{}}\n{_j(TS)}\n")
    assert read_offset(tmp_path, 3) == TS
    (tmp_path / "offsets" / "4").write_text("v1\n")
    with pytest.raises(ShardexError) as e:
        read_offset(tmp_path, 4)
    assert e.value.code == ErrorCode.INTERNAL


def test_logged_range_is_the_previous_entry_to_this_one(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text(f"v1\n{{}}\n{_j(TS)}\n")
    (tmp_path / "offsets" / "1").write_text(f"v1\n{{}}\n{_j(TS2)}\n")
    assert logged_range(tmp_path, 0) == (None, TS)  # batch 0 starts at the initial offset
    assert logged_range(tmp_path, 1) == (TS, TS2)
    with pytest.raises(ShardexError) as e:
        logged_range(tmp_path, 2)
    assert e.value.code == ErrorCode.INTERNAL
