"""The client's row decoding (``shardex.client.scan._EntryRows``) against the key codec's own
``decode_entry``, for any keys: its shortcuts (a key shared with the previous entry, a key of
ASC strings split in one call, the docid body taken whole) must give the same rows."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.api.scan import IndexScanStarted
from shardex.client.rows import EntryRows as _EntryRows
from shardex.client.rows import _plain_key
from shardex.client.rows import string_entry as _string_entry
from shardex.client.scan import ScanResult
from shardex.client.scan_page import _rows as _page_rows
from shardex.core.keycodec import decode_entry, encode_entry
from shardex.core.values import MISSING
from shardex.errors import ErrorCode, ShardexError
from shardex.scan.paging_store_spec import PageScanReply
from tests.unit.core.test_keycodec import docids, json_values, same, strings

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


@settings(max_examples=300, deadline=None)
@given(blocks(), st.randoms(use_true_random=False))
def test_rows_of_an_unordered_block_equal_the_codecs(
    block: tuple[list[bool], list[bytes]], rnd: Any
) -> None:
    """``ordered=False`` scans hand over slices' entries concatenated: a key's run is found
    by bisection only where the block is sorted, and checked."""
    desc, entries = block
    entries = entries[:]
    rnd.shuffle(entries)
    got = _EntryRows(desc, covering=True).of(entries)
    want = expected(entries, desc)
    assert [r["docid"] for r in got] == [d for _, d in want]
    assert all(same(r["key"], k) for r, (k, _) in zip(got, want, strict=True))


def test_unsorted_runs_of_one_key_are_not_mixed_up() -> None:
    # Two slices' entries, each sorted: the bisection of the first run would reach past
    # entries of other keys.
    a = [encode_entry([1], f"a{i}") for i in range(3)]
    b = [encode_entry([0], "b0"), encode_entry([1], "b1"), encode_entry([2], "b2")]
    entries = a + b + a
    got = _EntryRows([False], covering=True).of(entries)
    assert [(r["key"], r["docid"]) for r in got] == [(k, d) for k, d in expected(entries, [False])]


ascii_text = st.text(st.characters(min_codepoint=1, max_codepoint=0x10FFFF), max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.data())
def test_a_block_of_string_keys_is_decoded_whole(width: int, data: st.DataObject) -> None:
    """Keys of ASC strings without NUL: the block path answers (no per-entry fallback) and
    agrees with the codec, covering or not."""
    keys = data.draw(st.lists(st.lists(ascii_text, min_size=width, max_size=width), min_size=1))
    ids = data.draw(st.lists(ascii_text, min_size=len(keys), max_size=len(keys)))
    entries = sorted({encode_entry(k, d) for k, d in zip(keys, ids, strict=True)})
    want = expected(entries, [False] * width)
    rows = _EntryRows([False] * width, covering=True)._string_block(entries)
    assert rows is not None
    assert [(r["key"], r["docid"]) for r in rows] == [(k, d) for k, d in want]
    bare = _EntryRows([False] * width, covering=False)._string_block(entries)
    assert bare == [{"docid": d} for _, d in want]


def test_the_block_path_refuses_what_it_cannot_prove() -> None:
    rows = _EntryRows([False, False], covering=True)
    ok = [encode_entry(["a", "b"], "d1"), encode_entry(["a", "c"], "d2")]
    assert rows._string_block(ok) is not None
    # an escaped NUL, a number part, one part too few or too many
    assert rows._string_block([*ok, encode_entry(["a\x00", "b"], "d3")]) is None
    assert rows._string_block([*ok, encode_entry(["b", 1], "d3")]) is None
    assert rows._string_block([encode_entry(["a"], "d1")]) is None
    assert rows._string_block([encode_entry(["a", "b", "c"], "d1")]) is None
    # Malformed entries whose concatenation reads as two good ones: the first carries the
    # second's tag, the second starts without one.
    first, second = encode_entry(["x", "y"], "d1"), encode_entry(["z", "w"], "d2")
    assert rows._string_block([first + second[:1], second[1:]]) is None
    # and the rows of such blocks still come out right, one entry at a time
    block = [*ok, encode_entry(["a\x00", "b"], "d3"), encode_entry(["b", "\udc80"], "d4")]
    got = _EntryRows([False, False], covering=True).of(block)
    assert [(r["key"], r["docid"]) for r in got] == [
        (k, d) for k, d in expected(block, [False, False])
    ]


def test_string_bodies_that_look_like_tags_and_separators() -> None:
    keys = [["\x01P", "\x02"], ["P", "\x01\x01P"], ["\x02\x01", "P\x02"]]
    entries = sorted(encode_entry(k, d) for k, d in zip(keys, ["\x01", "\x02P", "P"], strict=True))
    rows = _EntryRows([False, False], covering=True)._string_block(entries)
    assert rows is not None
    assert [(r["key"], r["docid"]) for r in rows] == [
        (k, d) for k, d in expected(entries, [False, False])
    ]


class _Stream:
    """The ``InStream`` surface ``ScanResult`` reads without a loop: blocks from the reply."""

    def __init__(self, blocks: list[list[bytes]]) -> None:
        self.blocks = blocks
        self.done = False
        self.complete = True

    def poll(self) -> tuple[bool, list[bytes] | None]:
        if self.blocks:
            return True, self.blocks.pop(0)
        self.done = True
        return True, None


def test_a_scan_result_yields_its_blocks_rows_once() -> None:
    entries = sorted(encode_entry(["k", i], f"d{i}") for i in range(5))
    started = IndexScanStarted(scan_id=1, index_id="ix", desc=[False, False])

    def run(coro: Any) -> Any:
        raise AssertionError("a scan answered in its reply needs no trip to the loop")

    result = ScanResult(run, _Stream([entries[:2], entries[2:]]), started, covering=True)  # type: ignore[arg-type]
    rows = list(result)
    assert rows == [{"docid": d, "key": k} for k, d in expected(entries, [False, False])]
    with pytest.raises(ShardexError) as info:
        iter(result)
    assert info.value.code is ErrorCode.BAD_REQUEST


@pytest.mark.parametrize(
    "key",
    [
        ["Oslo", 30],
        ["Oslo", -1024],
        ["Oslo", 4095],
        [7, "a", -3],
        ["", 1],
        ["Oslo", 0],
        [None, True, False],
    ],
)
def test_keys_of_strings_and_small_ints_are_read_in_one_loop(key: list[Any]) -> None:
    entry = encode_entry(key, "doc")
    got = _plain_key(entry)
    assert got is not None
    assert got == (key, len(encode_entry(key, "doc")) - len(b"\x02doc\x00\x01"))


@pytest.mark.parametrize(
    "key",
    [["Oslo", 4096], ["Oslo", -1025], ["Oslo", 2.5], ["a\x00", 1], [[1]], [{}], [MISSING]],
)
def test_other_keys_are_left_to_the_codec_by_the_loop(key: list[Any]) -> None:
    assert _plain_key(encode_entry(key, "doc")) is None
    entries = sorted(encode_entry(key, f"d{i}") for i in range(3))
    got = _EntryRows([False] * len(key), covering=True).of(entries)
    assert [(r["key"], r["docid"]) for r in got] == [
        (k, d) for k, d in expected(entries, [False] * len(key))
    ]


@settings(max_examples=200, deadline=None)
@given(blocks(), st.randoms(use_true_random=False))
def test_a_pages_rows_equal_the_codecs(block: tuple[list[bool], list[bytes]], rnd: Any) -> None:
    """``scan_page`` decodes a page's entries (shards concatenated: any order) the same way."""
    desc, entries = block
    entries = entries[:]
    rnd.shuffle(entries)
    reply = PageScanReply(entries=entries, continuation=None, primary=False, desc=desc)
    got = _page_rows(reply)
    want = expected(entries, desc)
    assert [r["docid"] for r in got] == [d for _, d in want]
    assert all(same(r["key"], k) for r, (k, _) in zip(got, want, strict=True))
    primary = PageScanReply(entries=[b"a", "\u00e9".encode()], continuation=None, primary=True)
    assert _page_rows(primary) == [{"docid": "a", "key": ["a"]}, {"docid": "é", "key": ["é"]}]


def test_a_large_blocks_rows_are_built_with_the_collector_paused() -> None:
    """Building a large block's rows sets off no collection (each would walk and promote
    every row built so far); the collector runs again afterwards, as it was."""
    import gc

    from shardex.client.rows import GC_PAUSE_ROWS

    block = sorted(encode_entry(["city", i // 10], f"d{i:06}") for i in range(20 * GC_PAUSE_ROWS))
    started: list[int] = []
    rows: list[Any] = []

    def probe(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and not rows:  # before ``of`` returned
            started.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(probe)
    try:
        rows = _EntryRows([False, False], True).of(block)
    finally:
        gc.callbacks.remove(probe)
    assert len(rows) == len(block) and rows[-1] == {"docid": "d006999", "key": ["city", 699]}
    # One young collection at most: the one the collector owes when it resumes.
    assert started in ([], [0])
    assert gc.isenabled()
