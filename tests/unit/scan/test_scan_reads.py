"""The scan read path's cheap forms against their plain references (CPU per scan):

* ``DocumentOps.partition_seqnos``: what ``high_seqnos`` says, for the partitions asked;
* ``scan_blocks.EntryBlocks``: over any chunking, the blocks a per-entry cut by rows and
  bytes takes, none lost or repeated, and ``exhausted`` exactly when nothing is left;
* ``sorted_runs.limit_chunks`` / ``spans.scan_ranges``: every key in order, cut at the
  limit, no chunk pulled past it;
* ``scan_wait.common_snapshot_ts`` with its shortcut for slices whose newest TSs agree;
* ``Timestamp.packed``: canonical (equal TSs, equal bytes: the scan coordinator compares
  its slices' TSs as bytes), the bytes of the plain wire field; ``scan_ts.oldest_packed``
  picks the TS to pin among encoded ones and ``scan_ts.covers_seqnos`` checks one against
  the high seqnos; ``SlicesOpened.ts`` frames are unchanged.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.api.scan import NO_TS, SlicesOpened, packed_ts, ts_of
from shardex.core.keycodec import encode_entry
from shardex.core.sorted_runs import limit_chunks
from shardex.core.timestamp import Timestamp
from shardex.data.engine import DataEngine
from shardex.errors import ErrorCode, ShardexError
from shardex.index.scan_blocks import EntryBlocks
from shardex.index.scan_wait import common_snapshot_ts
from shardex.meta.partitioning import partition_of
from shardex.net.messages import Envelope, Kind, decode_frame, encode_frame
from shardex.scan.scan_ts import covers_seqnos, oldest_packed


def test_partition_seqnos_are_high_seqnos_of_the_partitions_asked(tmp_path: Path) -> None:
    with DataEngine(tmp_path / "db") as eng:
        eng.create_keyspace("ks", 4)
        for p in (0, 1, 3):  # partition 2 is not held here
            eng.create_partition("ks", p)
        for i in range(40):
            if partition_of(f"d{i}", 4) != 2:
                eng.upsert("ks", f"d{i}", {"i": i})
        wire = eng.high_seqnos("ks").to_wire()
        assert eng.partition_seqnos("ks", [0, 1, 2, 3]) == {p: wire[p] for p in (0, 1, 3)}
        assert eng.partition_seqnos("ks", [3]) == {3: wire[3]}
        assert eng.partition_seqnos("ks", []) == {}
        assert all(s > 0 for s, _ in eng.partition_seqnos("ks", [0, 1, 3]).values())
        with pytest.raises(ShardexError) as err:
            eng.partition_seqnos("nope", [0])
        assert err.value.code is ErrorCode.KEYSPACE_NOT_FOUND


def _take_block(entries: Iterator[bytes], n: int, max_bytes: int) -> list[bytes]:
    """The reference cut: up to ``n`` entries, stopping after the one that brings the
    block's size to ``max_bytes``."""
    out: list[bytes] = []
    size = 0
    for entry in itertools.islice(entries, n):
        out.append(entry)
        size += len(entry)
        if size >= max_bytes:
            break
    return out


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=8),
    takes=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 120)), min_size=1, max_size=8),
)
def test_entry_blocks_take_what_a_per_entry_cut_takes(
    sizes: list[int], cuts: list[int], takes: list[tuple[int, int]]
) -> None:
    entries = [bytes([i % 251]) * s for i, s in enumerate(sizes)]
    bounds = sorted({0, len(entries), *(min(c, len(entries)) for c in cuts)})
    chunks = [entries[a:b] for a, b in itertools.pairwise(bounds)]  # empty lists too
    frozen = [list(c) for c in chunks]
    blocks = EntryBlocks(iter(chunks))
    ref = iter(entries)
    taken = 0
    for k, (n, max_bytes) in enumerate(takes):
        if k % 2:  # a peek says whether anything is left and changes nothing after it
            assert blocks.exhausted() == (taken == len(entries))
        block = blocks.take(n, max_bytes)
        assert block == _take_block(ref, n, max_bytes)
        taken += len(block)
    assert blocks.take(len(entries) + 1, 10**9) == list(ref)
    assert blocks.exhausted() and blocks.take(5) == []
    assert chunks == frozen  # the storage lists handed in are not changed


@pytest.mark.parametrize("limit", [None, -1, 0, 1, 3, 5, 9])
def test_limited_chunks_yield_keys_in_order_and_pull_nothing_past_the_limit(
    limit: int | None,
) -> None:
    runs = [
        [encode_entry([i], f"a{i}") for i in range(3)],
        [],
        [encode_entry([10 + i], f"b{i}") for i in range(4)],
    ]
    keys = [k for r in runs for k in r]
    want = keys if limit is None else keys[: max(limit, 0)]
    pulled: list[int] = []

    def counted() -> Iterator[list[bytes]]:
        for r in runs:
            pulled.append(len(r))
            yield r

    chunks = counted() if limit is None else limit_chunks(counted(), limit)
    assert [k for c in chunks for k in c] == want
    # Chunks pulled: none for no entry, else up to the one that reached the limit.
    reach = {None: 3, -1: 0, 0: 0, 1: 1, 3: 1, 5: 3, 9: 3}[limit]
    assert len(pulled) == reach


class _Ring:
    """A slice as ``common_snapshot_ts`` sees it: its snapshot TSs, oldest first."""

    def __init__(self, *seqnos: int) -> None:
        # Each slice holds its own TS objects, equal in value to the other slices' ones.
        self.tss = [Timestamp({0: (s, 7), 1: (s, 9)}) for s in seqnos]

    def snapshot_timestamps(self) -> list[Timestamp]:
        return list(self.tss)


def test_common_snapshot_ts_is_the_newest_ts_every_slice_holds() -> None:
    assert common_snapshot_ts([_Ring(1, 2, 3), _Ring(2, 3), _Ring(3)]) == _ts(3)
    # A slice a round behind: the newest TS they all hold is older than some's newest.
    assert common_snapshot_ts([_Ring(1, 2, 3), _Ring(1, 2), _Ring(2, 3)]) == _ts(2)
    assert common_snapshot_ts([_Ring(1, 2), _Ring(3, 4)]) is None
    assert common_snapshot_ts([_Ring(1, 2), _Ring()]) is None
    assert common_snapshot_ts([_Ring(5)]) == _ts(5)
    assert common_snapshot_ts([_Ring()]) is None


def _ts(s: int) -> Timestamp:
    return Timestamp({0: (s, 7), 1: (s, 9)})


_WIRE = st.dictionaries(
    st.integers(0, 1023),
    st.tuples(st.integers(0, 2**63 - 1), st.integers(-(2**63), 2**64 - 1)),
    max_size=70,
)


@given(_WIRE, _WIRE, st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_packed_timestamps_are_equal_exactly_when_the_timestamps_are(
    a: dict[int, tuple[int, int]], b: dict[int, tuple[int, int]], rnd: Any
) -> None:
    # Built from the same entries in another order (a wire dict as the nodes' answers
    # arrive): the same bytes, those of the plain ``WireTs`` field, decoded back to it.
    shuffled = list(a.items())
    rnd.shuffle(shuffled)
    ta, tb, same = Timestamp(a), Timestamp(b), Timestamp.from_wire(dict(shuffled))
    assert ta.packed() == same.packed() == msgspec.msgpack.encode(ta.to_wire())
    assert ta.packed() is ta.packed()  # encoded once per TS object
    assert (ta.packed() == tb.packed()) == (ta == tb)
    assert Timestamp.from_packed(ta.packed()) == ta
    assert Timestamp.from_packed(msgspec.msgpack.encode(dict(shuffled))) == ta
    # A sorted high-seqno dict encodes as the TS's own bytes (the request_plus hit).
    assert msgspec.msgpack.encode(dict(sorted(shuffled))) == ta.packed()


def test_a_malformed_packed_timestamp_is_a_bad_request() -> None:
    for bad in (msgspec.msgpack.encode({1: (-1, 2)}), b"\x92\x01", b"\xc1"):
        with pytest.raises(ShardexError) as err:
            Timestamp.from_packed(bad)
        assert err.value.code is ErrorCode.BAD_REQUEST


def test_the_oldest_of_packed_timestamps_is_one_of_them() -> None:
    newer, older = _ts(3).packed(), Timestamp(_ts(2).to_wire()).packed()
    packed, pin = oldest_packed([newer, older, newer, bytes(older)])
    assert pin == _ts(2) and packed == older
    assert oldest_packed([newer]) == (newer, _ts(3))
    # Diverged branches: the fewest seqnos, as ``oldest_common``.
    other = Timestamp({0: (1, 8), 1: (1, 9)})
    assert oldest_packed([newer, other.packed()]) == (other.packed(), other)
    with pytest.raises(ValueError):
        oldest_packed([])


def test_a_packed_snapshot_ts_covers_the_high_seqnos_by_the_timestamp_rule() -> None:
    ts = _ts(3)
    assert covers_seqnos(ts.packed(), ts.to_wire())  # caught up: the same bytes
    assert covers_seqnos(ts.packed(), _ts(2).to_wire())  # ahead
    assert covers_seqnos(ts.packed(), {0: (3, 7)})  # a partition not asked for
    assert covers_seqnos(ts.packed(), {1: (3, 9), 0: (3, 7)})  # out of order: decoded
    assert covers_seqnos(ts.packed(), {**ts.to_wire(), 2: (0, 5)})  # nothing seen there
    assert not covers_seqnos(ts.packed(), _ts(4).to_wire())  # behind
    assert not covers_seqnos(ts.packed(), {0: (1, 8), 1: (1, 9)})  # another branch
    assert not covers_seqnos(ts.packed(), {**ts.to_wire(), 2: (1, 5)})
    assert not covers_seqnos(None, ts.to_wire())  # the tips: no TS to cover anything
    with pytest.raises(ShardexError) as err:
        covers_seqnos(b"\xc1", ts.to_wire())
    assert err.value.code is ErrorCode.BAD_REQUEST


def test_slices_opened_carries_the_packed_ts_as_the_plain_field_did() -> None:
    ts = Timestamp({p: (100 + p, 9_000_000_000 + p) for p in range(64)})
    for packed, wire in ((ts.packed(), ts.to_wire()), (None, None)):
        raw = NO_TS if packed is None else msgspec.Raw(packed)
        new = SlicesOpened(scan_id=1, node="n1", ts=raw, done=True)
        # What a peer that sends the plain field writes (the field was ``WireTs | None``).
        old = SlicesOpened(scan_id=1, node="n1", ts=wire, done=True)  # type: ignore[arg-type]
        frame = encode_frame(Envelope(Kind.RESPONSE, 7, new))
        assert frame == encode_frame(Envelope(Kind.RESPONSE, 7, old))
        got = decode_frame(frame).body
        assert isinstance(got, SlicesOpened) and packed_ts(got.ts) == packed
        assert ts_of(got.ts) == wire
