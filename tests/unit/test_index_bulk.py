"""``bulk.sorted_load_rows``: what an initial build's LoadFinish writes into a slice."""

from __future__ import annotations

import random

from shardex.core.keycodec import encode_entry
from shardex.index.bulk import sorted_load_rows
from shardex.index.keyversion import DELETE, UPSERT, UPSERT_DELETION
from shardex.index.records import decode_back


def row(docid: str, key: object, seqno: int, kind: int = UPSERT, part: int = 3) -> tuple:
    entry = encode_entry([key], docid) if kind == UPSERT else b""
    return ("ix", 0, kind, entry, docid, part, seqno)


def test_unique_docids_are_sorted_by_key_and_by_docid() -> None:
    rng = random.Random(5)
    rows = [row(f"d{i}", rng.choice(["b", "a", 7, None]), i + 1) for i in range(200)]
    rng.shuffle(rows)
    entries, back = sorted_load_rows([*rows, row("gone", "z", 999, UPSERT_DELETION)])
    assert entries == sorted(r[3] for r in rows)
    assert [k for k, _ in back] == sorted(r[4].encode() for r in rows)
    by_id = {r[4]: r for r in rows}
    for k, v in back:
        b = decode_back(v)
        r = by_id[k.decode()]
        assert (b.partition, b.seqno, b.entry) == (r[5], r[6], r[3])


def test_a_docid_given_twice_keeps_its_highest_seqno() -> None:
    rows = [
        row("a", "old", 4),
        row("b", "x", 2),
        row("a", "new", 9),
        row("c", "y", 3, DELETE),
        row("a", "older", 1),
    ]
    entries, back = sorted_load_rows(rows)
    assert entries == sorted([row("a", "new", 9)[3], row("b", "x", 2)[3]])
    assert [(k, decode_back(v).seqno) for k, v in back] == [(b"a", 9), (b"b", 2)]
