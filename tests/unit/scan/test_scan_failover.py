"""A scan's slice stream continued on another copy after its last entry
(``core.spans.spans_after``, ``scan/failover.py``): the narrowed spans keep exactly the
entries after a key - composite keys, DESC parts, one key shared by several documents - and
a failing stream's replacement is spliced into the merge with no entry twice or missing."""

from __future__ import annotations

import asyncio
import random

import pytest

from shardex.core.keycodec import encode_entry, encode_key
from shardex.core.spans import Span, in_ranges, spans_after, spans_to_ranges
from shardex.errors import ErrorCode, ShardexError
from shardex.scan.failover import Resumable
from shardex.scan.merge import interleave, merge_ordered

# --- spans narrowed after an entry ------------------------------------------------------------


def _entries(desc: list[bool], rng: random.Random) -> list[bytes]:
    """Entries of a two-part index with many repeated keys (several docids per key)."""
    out = set()
    for _ in range(400):
        key = [rng.choice(["a", "b", "c", None, 3, 7.5]), rng.randrange(4)]
        out.add(encode_entry(key, f"d{rng.randrange(60):03}", desc))
    return sorted(out)


def _span(desc: list[bool], rng: random.Random) -> Span:
    def bound() -> bytes | None:
        parts = [rng.choice(["a", "b", "c", 3]), rng.randrange(4)][: rng.randrange(3)]
        return encode_key(parts, desc[: len(parts)]) if parts else None

    return Span(bound(), bound(), rng.random() < 0.5, rng.random() < 0.5)


@pytest.mark.parametrize("desc", [[False, False], [True, False], [False, True], [True, True]])
def test_narrowed_spans_hold_exactly_the_entries_after_the_last_one(desc: list[bool]) -> None:
    rng = random.Random(sum(desc) * 7 + desc[0])
    entries = _entries(desc, rng)
    for _ in range(200):
        spans = None if rng.random() < 0.2 else [_span(desc, rng) for _ in range(rng.randrange(3))]
        wanted = [e for e in entries if in_ranges(e, spans_to_ranges(spans))]
        if not wanted:
            continue
        last = rng.choice(wanted)  # the stream handed on everything up to here
        narrowed = spans_after(spans, last)
        got = [e for e in entries if in_ranges(e, spans_to_ranges(narrowed))]
        assert got == [e for e in wanted if e > last]


def test_a_shared_key_resumes_at_the_next_document() -> None:
    desc = [True, False]
    docs = [encode_entry(["x", 1], d, desc) for d in ("d1", "d2", "d3")]
    later = encode_entry(["w", 0], "d0", desc)  # "w" after "x" on a DESC first part
    assert docs == sorted(docs) and later > docs[-1]
    every = [*docs, later]
    narrowed = spans_after(None, docs[1])
    assert [e for e in every if in_ranges(e, spans_to_ranges(narrowed))] == [docs[2], later]


def test_a_stream_read_to_the_end_of_its_spans_has_nothing_left() -> None:
    below_b = [Span(None, encode_key(["b"]), True, False)]  # keys < "b"
    assert spans_after(below_b, encode_entry(["b"], "d9")) == []
    left = spans_after(below_b, encode_entry(["a"], "d1"))
    assert in_ranges(encode_entry(["a"], "d2"), spans_to_ranges(left))
    assert not in_ranges(encode_entry(["a"], "d1"), spans_to_ranges(left))
    assert not in_ranges(encode_entry(["b"], "d0"), spans_to_ranges(left))


# --- a failing stream replaced --------------------------------------------------------------


class Stream:
    """Blocks of a sorted list of entries; dies with CONNECTION_CLOSED after ``fail_after``."""

    def __init__(self, entries: list[bytes], block: int, fail_after: int | None = None) -> None:
        self.blocks = [entries[i : i + block] for i in range(0, len(entries), block)]
        self.fetched = 0
        self.fail_after = fail_after
        self.cancelled = False

    complete = False

    def take_head(self) -> list[bytes]:
        raise AssertionError

    def ready(self) -> bool:
        return False

    async def next_block(self) -> list[bytes] | None:
        await asyncio.sleep(0)
        if self.fail_after is not None and self.fetched >= self.fail_after:
            raise ShardexError("indexer died", code=ErrorCode.CONNECTION_CLOSED)
        if self.fetched >= len(self.blocks):
            return None
        self.fetched += 1
        return self.blocks[self.fetched - 1]

    async def cancel(self) -> None:
        self.cancelled = True


class Copies:
    """The index's copies: partition -> entries, node -> the partitions it holds (in chain
    order), the nodes that die (after how many blocks) and what ``reopen`` was asked."""

    def __init__(self, parts: dict[int, list[bytes]], chains: dict[int, list[str]]) -> None:
        self.parts = parts
        self.chains = chains
        self.dies: dict[str, int] = {}
        self.too_old: set[str] = set()
        self.avoid: set[str] = set()
        self.asked: list[tuple[str, list[int], bytes | None, int | None]] = []

    def stream(self, node: str, parts: list[int], after: bytes | None, limit: int | None):  # type: ignore[no-untyped-def]
        entries = sorted(e for p in parts for e in self.parts[p] if after is None or e > after)
        return Stream(entries[:limit], 7, self.dies.get(node))

    async def reopen(self, failed: str, parts: list[int], after: bytes | None, limit: int | None):  # type: ignore[no-untyped-def]
        self.asked.append((failed, parts, after, limit))
        self.avoid.add(failed)
        by_node: dict[str, list[int]] = {}
        for p in parts:
            node = next((n for n in self.chains[p] if n not in self.avoid), None)
            if node is None:
                raise ShardexError("no copy", code=ErrorCode.NODE_UNAVAILABLE)
            if node in self.too_old:
                raise ShardexError("released", code=ErrorCode.SNAPSHOT_TOO_OLD)
            by_node.setdefault(node, []).append(p)
        return [(n, ps, self.stream(n, ps, after, limit)) for n, ps in by_node.items()]


def _copies(rng: random.Random) -> Copies:
    every = sorted({rng.randbytes(rng.randrange(2, 6)) for _ in range(600)})
    parts: dict[int, list[bytes]] = {p: [] for p in range(4)}
    for e in every:
        parts[rng.randrange(4)].append(e)
    # a holds 0 and 1 (primaries), b 2 and 3; 0's copy is on c, 1's on d: a's stream is
    # taken over by two nodes, merged
    return Copies(parts, {0: ["a", "c"], 1: ["a", "d"], 2: ["b", "a"], 3: ["b", "c"]})


async def _scan(copies: Copies, ordered: bool, limit: int | None = None) -> list[bytes]:
    sources = []
    for node, ps in (("a", [0, 1]), ("b", [2, 3])):
        r = Resumable(node, ps, copies.stream(node, ps, None, limit), limit)
        r.arm(copies.reopen, 5)
        sources.append(r)
    combined = merge_ordered(sources, 5) if ordered else interleave(sources)
    return [e async for block in combined for e in block]


@pytest.mark.parametrize("ordered", [True, False])
async def test_a_stream_dying_mid_way_is_continued_by_the_other_copies(ordered: bool) -> None:
    copies = _copies(random.Random(1))
    every = sorted(e for es in copies.parts.values() for e in es)
    copies.dies = {"a": 5}
    got = await _scan(copies, ordered)
    assert (got if ordered else sorted(got)) == every
    assert len(got) == len(set(got))
    ((failed, parts, after, _),) = copies.asked
    assert failed == "a" and parts == [0, 1] and after is not None  # after 5 blocks read


async def test_a_replacement_that_dies_too_is_replaced_again() -> None:
    copies = _copies(random.Random(2))
    every = sorted(e for es in copies.parts.values() for e in es)
    # a dies; its partition 0 goes to c, which dies too: then to d, its third copy
    copies.dies = {"a": 4, "c": 2}
    copies.chains[0] = ["a", "c", "d"]
    got = await _scan(copies, ordered=True)
    assert got == every
    assert [(f, ps) for f, ps, _, _ in copies.asked] == [("a", [0, 1]), ("c", [0])]


@pytest.mark.parametrize("why", ["no copy", "too old"])
async def test_without_a_copy_holding_the_ts_the_original_error_ends_the_scan(why: str) -> None:
    copies = _copies(random.Random(3))
    copies.dies = {"b": 2}
    if why == "no copy":
        copies.chains[2] = ["b"]
    else:
        copies.too_old = {"a"}
    with pytest.raises(ShardexError) as err:
        await _scan(copies, ordered=True)
    assert err.value.code is ErrorCode.CONNECTION_CLOSED  # the stream's own error


async def test_the_replacement_reads_only_what_is_left_of_the_limit() -> None:
    copies = _copies(random.Random(4))
    copies.dies = {"a": 2}
    got = await _scan(copies, ordered=True, limit=40)
    ((_, _, _, left),) = copies.asked
    assert left == 40 - 14  # two blocks of 7 read before the failure
    a_entries = sorted(copies.parts[0] + copies.parts[1])[:40]
    b_entries = sorted(copies.parts[2] + copies.parts[3])[:40]
    assert got == sorted(a_entries + b_entries)


async def test_an_unarmed_stream_passes_its_error_on() -> None:
    r = Resumable("a", [0], Stream([b"x"] * 20, 5, fail_after=1), None)
    assert await r.next_block() == [b"x"] * 5
    with pytest.raises(ShardexError) as err:
        await r.next_block()
    assert err.value.code is ErrorCode.CONNECTION_CLOSED
