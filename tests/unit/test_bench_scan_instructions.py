"""``bench/scan_instructions.py`` reads ``perf stat -x,`` output: counts by event, rows
perf could not count as 0, anything else (comments, blank lines) ignored."""

from __future__ import annotations

from bench.scan_instructions import parse_perf_stat


def test_perf_stat_csv_gives_counts_by_event() -> None:
    text = (
        "# started on Thu Nov 26\n"
        "\n"
        "287751,,instructions:u,12082204,100.00,,\n"
        "886350,,instructions:k,12082204,100.00,,\n"
    )
    assert parse_perf_stat(text) == {"instructions:u": 287751.0, "instructions:k": 886350.0}


def test_rows_perf_could_not_count_are_zero_and_junk_is_ignored() -> None:
    text = "<not counted>,,instructions:u,0,0.00,,\n<not supported>,,instructions:k,,,,\nhello\n"
    assert parse_perf_stat(text) == {"instructions:u": 0.0, "instructions:k": 0.0}
