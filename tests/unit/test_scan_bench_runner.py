"""``bench.scan_instructions``'s client runner (``--threads``): each client scans the
queries in turn from its own starting point, and a wrong row count stops the run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from bench.scan_instructions import _runner


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
