"""``bench.pipeline``'s row of the read-ahead's pieces (the drain's and the freshness part's)."""

from __future__ import annotations

from bench.pipeline.maintain import pieces_row


def test_pieces_row_counts_sizes_and_read_times() -> None:
    reads = [(500, 0.020), (300, 0.010), (700, 0.060)]
    assert pieces_row("3 freshness (read-ahead pieces)", reads) == {
        "part": "3 freshness (read-ahead pieces)",
        "pieces": 3,
        "changes/piece p50": 500,
        "read ms p50": 20.0,
        "read us/change": 60.0,  # 90 ms over 1,500 changes
    }
    assert pieces_row("2 drain (read-ahead pieces)", []) is None
