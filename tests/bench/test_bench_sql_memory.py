"""``bench.sql_memory``'s pure pieces: the RSS reading and sampler, and the row checks that
stand in for storing a million rows (the run itself is by hand: ``python -m bench.sql_memory``)."""

from __future__ import annotations

import os

import pytest

from bench import sql_memory as sm
from shardex.testing.procs import wait_for


def test_rss_is_read_from_proc_and_the_sampler_keeps_the_peak() -> None:
    me = os.getpid()
    before = sm.rss(me)
    assert before > 0
    with sm.RssSampler({"self": me}) as s:
        held = bytearray(64 << 20)  # 64 MiB touched: resident
        for i in range(0, len(held), 4096):
            held[i] = 1
        wanted = s.samples + 3  # three samples after the memory is touched
        wait_for(lambda: s.samples >= wanted, 60, sm.SAMPLE_S / 4, "three more RSS samples")
    assert s.peak["self"] >= before + (60 << 20)
    del held


def test_the_order_check_counts_and_catches_a_row_out_of_order() -> None:
    rows = [{"age": 1, "_id": "b"}, {"age": 2, "_id": "a"}, {"age": 2, "_id": "c"}]
    assert sm._check_order(iter(rows)) == 3
    with pytest.raises(RuntimeError, match="out of order at row 2"):
        sm._check_order(iter([rows[0], rows[1], {"age": 1, "_id": "z"}]))


def test_the_group_check_wants_one_document_per_group() -> None:
    assert sm._check_groups(iter([{"n": 1, "ages": [3]}, {"n": 1, "ages": [None]}])) == 2
    with pytest.raises(RuntimeError, match="a group of one document"):
        sm._check_groups(iter([{"n": 2, "ages": [3, 4]}]))


def test_the_run_fails_when_one_node_went_over_its_allowance() -> None:
    rows = [{"within": True}, {"within": True}]
    assert sm.rss_within({"tables": {"node RSS during budgeted queries": rows}})
    rows.append({"within": False})
    assert not sm.rss_within({"tables": {"node RSS during budgeted queries": rows}})
