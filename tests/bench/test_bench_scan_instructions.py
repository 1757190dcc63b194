"""``bench/diagnostics/scan_instructions.py``: it reads ``perf stat -x,`` output (counts by
event, rows perf could not count as 0, anything else ignored), and its client runner
(``--threads``) has each client scan the queries in turn from its own starting point, a wrong
row count stopping the run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from bench.diagnostics.scan_instructions import _runner, parse_perf_stat


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


@dataclass
class Q:
    case: str
    index: str
    spans: Any
    limit: int
    expected_rows: int


class FakeClient:
    def __init__(self, rows: int = 2) -> None:
        self.rows = rows
        self.seen: list[tuple[str, str]] = []

    def scan(self, keyspace: str, index: str, spans: Any, *, consistency: str, limit: int) -> Any:
        self.seen.append((index, consistency))
        return iter(range(self.rows))


def test_each_client_cycles_the_queries_from_its_own_start() -> None:
    qs = [Q("c", f"i{k}", None, 2, 2) for k in range(10)]
    clients = [FakeClient(), FakeClient()]
    run = _runner(clients, qs, "request_plus")
    run(0, 3)
    run(1, 5)
    assert [i for i, _ in clients[0].seen] == ["i0", "i1", "i2"]
    assert [i for i, _ in clients[1].seen] == ["i7", "i8", "i9", "i0", "i1"]
    assert {c for _, c in clients[0].seen + clients[1].seen} == {"request_plus"}


def test_a_wrong_row_count_stops_the_run() -> None:
    run = _runner([FakeClient(rows=1)], [Q("limit 100", "i", None, 2, 2)], "not_bounded")
    with pytest.raises(RuntimeError, match="limit 100: 1 rows, not 2"):
        run(0, 1)
