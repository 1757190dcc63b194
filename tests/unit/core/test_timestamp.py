"""Timestamp vectors: covers, merge_max, behind, encodings."""

from __future__ import annotations

import json
import pickle

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardex.api.scan import WireTs as Wire
from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.errors import ErrorCode, ShardexError

UUIDS = st.sampled_from([0xA1, 0xB2])
entries = st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 50), UUIDS), max_size=8)
timestamps = entries.map(Timestamp)


def test_covers_same_branch():
    a = Timestamp({0: (5, 1), 1: (3, 1)})
    assert a.covers(Timestamp({0: (5, 1)}))
    assert a.covers(Timestamp({0: (4, 1), 1: (3, 1)}))
    assert not a.covers(Timestamp({0: (6, 1)}))
    assert not a.covers(Timestamp({2: (1, 1)}))  # a partition we have not seen at all
    assert a.covers(Timestamp({2: (0, 9)}))  # seqno 0 asks for nothing


def test_covers_is_false_across_branches():
    assert not Timestamp({0: (9, 1)}).covers(Timestamp({0: (2, 2)}))
    assert Timestamp({0: (9, 1)}).diverged_from(Timestamp({0: (2, 2), 1: (1, 1)})) == [0]


def test_behind_names_each_lagging_partition():
    have = Timestamp({0: (5, 1), 1: (7, 1), 2: (3, 1)})
    want = Timestamp({0: (8, 1), 1: (7, 1), 2: (4, 2), 3: (2, 1)})
    assert have.behind(want) == {0: 3, 2: 4, 3: 2}
    assert have.total_behind(want) == 9


@given(timestamps, timestamps)
def test_merge_max_covers_same_branch_inputs(a, b):
    m = a.merge_max(b)
    for p in set(a) | set(b):
        assert m.seqno(p) == max(a.seqno(p), b.seqno(p))
    # the merge covers each input on every partition where it kept that input's branch
    for src in (a, b):
        same = Timestamp({p: e for p, e in src.items() if m[p].uuid == e.uuid})
        assert m.covers(same)


@given(timestamps, timestamps, timestamps)
def test_covers_is_transitive(a, b, c):
    if a.covers(b) and b.covers(c):
        assert a.covers(c)


@given(timestamps)
def test_covers_is_reflexive_and_behind_is_empty(a):
    assert a.covers(a)
    assert a.behind(a) == {}


@given(timestamps)
def test_json_and_wire_round_trip(a):
    assert Timestamp.from_json(json.loads(json.dumps(a.to_json()))) == a
    assert Timestamp.from_wire(a.to_wire()) == a
    # JSON keys are strings in ascending numeric partition order (stable Spark offsets)
    assert list(a.to_json()) == [str(p) for p in sorted(a)]


def test_malformed_json_and_negative_seqno_are_clear_errors():
    with pytest.raises(ShardexError) as err:
        Timestamp.from_json({"0": "nope"})
    assert err.value.code is ErrorCode.BAD_REQUEST and "hint" in err.value.details
    with pytest.raises(ShardexError):
        Timestamp({0: (-1, 1)})


def test_with_entry_and_mapping_protocol():
    t = Timestamp().with_entry(3, 10, 0xFF)
    assert t[3] == SeqnoEntry(10, 0xFF) and len(t) == 1 and t.seqno(4) == 0


def test_wire_forms_are_checked_and_coerced() -> None:
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode({3: (7, 9), 1: (2, 9)}), type=Wire)
    t = Timestamp.from_wire(decoded)
    assert list(t) == [1, 3] and t[3] == SeqnoEntry(7, 9)  # ascending, whatever came in
    assert Timestamp.from_wire({"3": ["7", 9]}) == Timestamp({3: (7, 9)})  # coerced
    with pytest.raises(ShardexError) as err:
        Timestamp.from_wire({0: (1, 1), 5: (-2, 1)})
    assert err.value.code is ErrorCode.BAD_REQUEST and err.value.details["partition"] == 5


@given(timestamps)
def test_the_mapping_view_pickling_and_hash_agree_with_the_wire_form(a: Timestamp) -> None:
    b = Timestamp.from_wire(a.to_wire())
    assert hash(a) == hash(b) and {a: 1}[b] == 1
    assert pickle.loads(pickle.dumps(a)) == a
    assert dict(a.items()) == {p: SeqnoEntry(s, u) for p, (s, u) in a.to_wire().items()}
    assert list(a.values()) == [a[p] for p in a] and all(p in a for p in a)
    assert a.get(99) is None and a.get(99, SeqnoEntry(0, 0)) == SeqnoEntry(0, 0)
    assert a.seqno(99) == 0 and 99 not in a


def test_to_wire_is_a_copy() -> None:
    t = Timestamp({0: (1, 1)})
    t.to_wire()[0] = (9, 9)
    assert t.seqno(0) == 1


@given(timestamps, timestamps)
def test_seqno_moves_and_updated_follow_the_partitions_of_the_target(a, b):
    # A slice at ``a`` asked to stabilise at ``b``: forward where b's seqno is above a's
    # (absent: 0), refused where it is below; the applied TS it reaches is a with b's
    # entries (uuid too) over every partition b names.
    forward = any(e.seqno > a.seqno(p) for p, e in b.items())
    back = [p for p, e in b.items() if e.seqno < a.seqno(p)]
    assert a.seqno_moves(b) == (forward, back)
    reached = a.updated(b)
    assert list(reached) == sorted(set(a) | set(b))
    for p in set(a) | set(b):
        assert reached[p] == (b[p] if p in b else a[p])


def test_seqno_moves_by_seqno_alone_and_updated_takes_the_new_branch():
    a = Timestamp({0: (5, 1), 2: (3, 1)})
    assert a.seqno_moves(a) == (False, [])
    assert a.seqno_moves(Timestamp({0: (5, 2), 1: (0, 1)})) == (False, [])  # uuid: not a move
    assert a.seqno_moves(Timestamp({0: (4, 1), 1: (1, 1), 2: (3, 1)})) == (True, [0])
    assert a.updated(Timestamp({0: (5, 2), 1: (1, 1)})).to_wire() == {
        0: (5, 2),
        1: (1, 1),
        2: (3, 1),
    }
