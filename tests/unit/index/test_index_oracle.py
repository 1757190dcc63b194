"""The oracle itself: it must fail, readably, on each kind of wrong index."""

from __future__ import annotations

import msgspec
import pytest

from shardex.core.keycodec import encode_entry
from shardex.index import make_definition
from shardex.index.oracle import check_back_index, check_index, expected_entries
from shardex.testing.index import FakeKeyspace

D = make_definition(
    id="o", name="o", keyspace="ks", keys=["k"], where="k > 0", partition_by=["k"], num_partition=3
)
DOCS = {"a": {"k": 1}, "b": {"k": 2}, "c": {"k": -1}, "d": {"j": 1}}


def good() -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {p: [] for p in range(3)}
    for p, e in expected_entries(D, DOCS):
        out[p].append(e)
    return out


def test_expected_entries_follow_the_rules() -> None:
    got = {e for _, e in expected_entries(D, DOCS)}
    assert got == {encode_entry([1], "a"), encode_entry([2], "b")}
    check_index(D, good(), DOCS)
    # JSON bytes are accepted as documents (what a change log holds)
    check_index(D, good(), {k: msgspec.json.encode(v) for k, v in DOCS.items()})


def other_slice(p: int) -> int:
    return (p + 1) % 3


def first(s: dict[int, list[bytes]]) -> int:
    return next(p for p in sorted(s) if s[p])


def drop_one(s):
    s[first(s)].pop()


def add_unknown(s):
    s[0].append(encode_entry([9], "zz"))


def add_filtered(s):
    s[0].append(encode_entry([-1], "c"))  # k > 0 is false for c


def copy_to_other_slice(s):
    p = first(s)
    s[other_slice(p)].append(s[p][0])


def list_twice(s):
    p = first(s)
    s[p].append(s[p][0])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (drop_one, "missing"),
        (add_unknown, "extra"),
        (add_filtered, "extra"),
        (copy_to_other_slice, "more than one entry"),
        (list_twice, "listed twice"),
    ],
)
def test_check_index_reports(mutate, message: str) -> None:
    slices = good()
    mutate(slices)
    with pytest.raises(AssertionError, match=message):
        check_index(D, slices, DOCS)


def test_wrong_slice_is_named() -> None:
    slices = good()
    p = next(p for p in slices if slices[p])
    slices[other_slice(p)].append(slices[p].pop())
    with pytest.raises(AssertionError, match="wrong slice"):
        check_index(D, slices, DOCS)


def test_check_back_index() -> None:
    e = encode_entry([1], "a")
    check_back_index([e], {"a": (0, 1, e), "gone": (0, 2, b"")})
    with pytest.raises(AssertionError, match="not in the slice"):
        check_back_index([], {"a": (0, 1, e)})
    with pytest.raises(AssertionError, match="no back row"):
        check_back_index([e], {})
    with pytest.raises(AssertionError, match="another document"):
        check_back_index([e], {"b": (0, 1, e)})


def test_fake_keyspace_documents_as_of() -> None:
    ks = FakeKeyspace(num_partitions=2)
    ks.upsert("a", {"k": 1})
    t1 = ks.ts()
    ks.upsert("a", {"k": 2})
    ks.delete("a")
    assert ks.documents_at(t1) == {"a": b'{"k":1}'}
    assert ks.documents_at(ks.ts()) == {}
    assert len(ks.changes(t1, ks.ts())) == 2
