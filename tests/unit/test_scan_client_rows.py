"""The client's row decoding (``shardex.client.scan._EntryRows``) against the key codec's own
``decode_entry``, for any keys: its shortcuts (a key shared with the previous entry, a key of
ASC strings split in one call, the docid body taken whole) must give the same rows."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_keycodec import docids, json_values, same, strings

from shardex.client.scan import _EntryRows, _string_entry
from shardex.core.keycodec import decode_entry, encode_entry

# Strings with NULs and the bytes around the escape, which the one-call split must undo.
tricky = st.one_of(strings, st.sampled_from(["", "\x00", "a\x00", "\x00\x01", "\x01", "\xff"]))
parts = st.one_of(tricky, json_values)


@st.composite
def blocks(draw: st.DrawFn) -> tuple[list[bool], list[bytes]]:
    """Sorted entries of one index (1-3 parts, some DESC), keys often repeated."""
    width = draw(st.integers(1, 3))
    desc = draw(st.lists(st.booleans(), min_size=width, max_size=width))
    keys = draw(st.lists(st.lists(parts, min_size=width, max_size=width), min_size=1, max_size=4))
    rows = draw(st.lists(st.tuples(st.sampled_from(keys), docids), min_size=1, max_size=12))
    entries = sorted({encode_entry(k, d, desc) for k, d in rows})
    return desc, entries


def expected(entries: list[bytes], desc: list[bool]) -> list[tuple[list[Any], str]]:
    return [decode_entry(e, desc) for e in entries]


@settings(max_examples=400, deadline=None)
@given(blocks(), st.integers(1, 5))
def test_rows_equal_the_codecs_decoding(block: tuple[list[bool], list[bytes]], cut: int) -> None:
    desc, entries = block
    rows = _EntryRows(desc, covering=True)
    got: list[dict[str, Any]] = []
    for i in range(0, len(entries), cut):  # the state carries across blocks
        got.extend(rows.of(entries[i : i + cut]))
    want = expected(entries, desc)
    assert [r["docid"] for r in got] == [d for _, d in want]
    assert all(same(r["key"], k) for r, (k, _) in zip(got, want, strict=True))


@settings(max_examples=400, deadline=None)
@given(st.lists(tricky, min_size=1, max_size=3), docids)
def test_a_key_of_strings_is_split_in_one_call(key: list[str], docid: str) -> None:
    entry = encode_entry(key, docid)
    split = _string_entry(entry)
    assert split is not None
    assert split[:2] == (key, docid)
    assert entry[split[2] : split[2] + 1] == b"\x02"


@given(st.lists(json_values, min_size=1, max_size=3), docids)
def test_other_keys_are_left_to_the_codec(key: list[Any], docid: str) -> None:
    split = _string_entry(encode_entry(key, docid))
    if split is not None:  # only ever for strings, and then exact
        assert all(isinstance(v, str) for v in key)
        assert split[:2] == (key, docid)
