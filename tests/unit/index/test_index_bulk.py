"""``bulk.sorted_load_rows`` and ``LoadSession``: what an initial build's LoadFinish writes."""

from __future__ import annotations

import random

from shardex.core.keycodec import encode_entry
from shardex.core.timestamp import Timestamp
from shardex.index.bulk import sorted_load_rows
from shardex.index.keyversion import DELETE, UPSERT, UPSERT_DELETION
from shardex.index.load_session import LoadSession
from shardex.index.records import decode_back


def row(docid: str, key: object, seqno: int, kind: int = UPSERT, part: int = 3) -> tuple:
    entry = encode_entry([key], docid) if kind == UPSERT else b""
    return ("ix", 0, kind, entry, docid, part, seqno)


def test_unique_docids_are_sorted_by_key_and_by_docid() -> None:
    rng = random.Random(5)
    rows = [row(f"d{i}", rng.choice(["b", "a", 7, None]), i + 1) for i in range(200)]
    rng.shuffle(rows)
    entries, keys, values = sorted_load_rows([*rows, row("gone", "z", 999, UPSERT_DELETION)])
    assert entries == sorted(r[3] for r in rows)
    assert keys == sorted(r[4].encode() for r in rows)
    by_id = {r[4]: r for r in rows}
    for k, v in zip(keys, values, strict=True):
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
    entries, keys, values = sorted_load_rows(rows)
    assert entries == sorted([row("a", "new", 9)[3], row("b", "x", 2)[3]])
    assert [(k, decode_back(v).seqno) for k, v in zip(keys, values, strict=True)] == [
        (b"a", 9),
        (b"b", 2),
    ]


def test_back_keys_follow_utf8_byte_order_for_any_docid() -> None:
    # the back index sorts docid strings: code-point order must equal UTF-8 byte order
    ids = ["z", "é", "a", "\U0001f600", "\uffef", "ab", "A", "\u00ff", "\u0800"]
    _, keys, _ = sorted_load_rows([row(d, 1, i + 1) for i, d in enumerate(ids)])
    assert keys == sorted(d.encode("utf-8") for d in ids)


def test_a_load_session_holds_the_same_rows_as_sorted_load_rows() -> None:
    # columns and rows, repeated chunks, a docid twice in one chunk, superseded rows
    rng = random.Random(11)
    seqnos = rng.sample(range(1, 10_000), 300)  # distinct: no tie to break
    rows = [row(f"d{rng.randrange(60)}", rng.randrange(5), s) for s in seqnos]
    s = LoadSession(Timestamp())
    for i in range(0, len(rows), 70):
        chunk = rows[i : i + 70]
        if i % 140:
            s.add_rows(chunk)
        else:
            s.add_columns(*([r[c] for r in chunk] for c in (3, 4, 5, 6)))
    s.add_rows(rows[:50])  # a retried chunk adds nothing
    assert len(s.rows) == len({r[4] for r in rows})
    assert s.sorted_load() == sorted_load_rows(rows)


def test_a_load_session_fast_path_keeps_every_row() -> None:
    s = LoadSession(Timestamp())
    first = [row(f"d{i}", i, i + 1) for i in range(10)]
    second = [row(f"e{i}", i, i + 1) for i in range(10)]
    s.add_columns(*([r[c] for r in first] for c in (3, 4, 5, 6)))
    s.add_columns(*([r[c] for r in second] for c in (3, 4, 5, 6)))
    assert s.sorted_load() == sorted_load_rows(first + second)
