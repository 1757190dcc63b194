"""The scan read path's cheap forms against their plain references (issue 6, CPU per scan):

* ``DocumentOps.partition_seqnos``: what ``high_seqnos`` says, for the partitions asked;
* ``scan_server.take_first``: the first block ``take_block`` would take (cut by rows or
  bytes) and every entry after it, none lost or repeated;
* ``spans._limited`` on raw entries: every key in order, cut at the limit, nothing read
  past it;
* ``scan_wait.common_snapshot_ts`` with its shortcut for slices whose newest TSs agree;
* ``scan_ts.one_object_per_ts``: equal TSs of a scan's nodes become one object.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.core.keycodec import decode_entry, encode_entry
from shardex.core.timestamp import Timestamp
from shardex.data import DataEngine, partition_of
from shardex.errors import ErrorCode, ShardexError
from shardex.index.scan_server import take_block, take_first
from shardex.index.scan_wait import common_snapshot_ts
from shardex.index.spans import _limited
from shardex.scan.scan_ts import one_object_per_ts


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


def _reference(entries: list[bytes], n: int, max_bytes: int) -> tuple[list[bytes], list[bytes]]:
    gen = iter(entries)
    block = take_block(gen, n, max_bytes)
    return block, list(gen)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), max_size=30),
    n=st.integers(1, 12),
    max_bytes=st.integers(1, 120),
)
def test_take_first_is_take_blocks_first_block_and_keeps_the_rest(
    sizes: list[int], n: int, max_bytes: int
) -> None:
    entries = [bytes([i % 251]) * s for i, s in enumerate(sizes)]
    block, rest = take_first(iter(entries), n, max_bytes)
    want_block, want_rest = _reference(entries, n, max_bytes)
    assert block == want_block
    assert (list(rest) if rest is not None else []) == want_rest
    if not want_rest:  # the reply says "done" exactly when nothing is left
        assert rest is None or list(rest) == []
    if rest is None:
        assert want_rest == []


def _counted(pairs: list[tuple[bytes, bytes]], read: list[int]) -> Iterator[tuple[bytes, bytes]]:
    for pair in pairs:
        read.append(1)
        yield pair


@pytest.mark.parametrize("limit", [None, -1, 0, 1, 3, 5, 9])
def test_raw_limited_yields_keys_in_order_and_reads_nothing_past_the_limit(
    limit: int | None,
) -> None:
    runs = [
        [(encode_entry([i], f"a{i}"), b"") for i in range(3)],
        [],
        [(encode_entry([10 + i], f"b{i}"), b"") for i in range(4)],
    ]
    read: list[int] = []
    got = list(_limited([_counted(r, read) for r in runs], limit, True, None))
    keys = [k for r in runs for k, _ in r]
    want = keys if limit is None else keys[: max(limit, 0)]
    assert got == want
    assert len(read) == len(want)
    # The decoded form agrees on which entries it yields.
    read2: list[int] = []
    decoded = list(_limited([_counted(r, read2) for r in runs], limit, False, None))
    assert decoded == [decode_entry(k) for k in want]


def test_take_first_on_an_exactly_full_block_looks_one_entry_ahead() -> None:
    gen = iter([b"x"] * 4)
    block, rest = take_first(gen, 4, 100)
    assert block == [b"x"] * 4 and rest is None
    gen2 = itertools.chain([b"x"] * 5)
    block2, rest2 = take_first(gen2, 4, 100)
    assert block2 == [b"x"] * 4 and rest2 is not None and list(rest2) == [b"x"]


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


def test_equal_timestamps_of_a_scans_nodes_become_one_object() -> None:
    local = _ts(3)
    older = _ts(2).to_wire()
    opened = [
        ("n1", local, "s1"),
        ("n2", _ts(3).to_wire(), "s2"),  # the same snapshot, read elsewhere
        ("n3", older, "s3"),
        ("n4", dict(older), "s4"),
        ("n5", None, "s5"),
    ]
    out = one_object_per_ts(opened)
    assert [(n, s) for n, _, s in out] == [(n, s) for n, _, s in opened]
    got = [ts for _, ts, _ in out]
    assert got[0] is local and got[1] is local
    assert got[2] == _ts(2) and got[3] is got[2]
    assert got[4] is None
    # Without a local TS the first wire one is converted and the equal ones share it.
    remote = one_object_per_ts([("a", older, 1), ("b", dict(older), 2)])
    assert remote[0][1] == _ts(2) and remote[1][1] is remote[0][1]
