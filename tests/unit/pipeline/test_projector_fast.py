"""The projector's fast path (``project/columnar.py``) against its general path.

The property: for any batch of changes (random documents with odd types, missing fields,
nulls, nested values, NULs in strings, oversized keys, bodies that are not JSON or not an
object, deletions) and each index set the fast path accepts, both paths give identical
key versions, error counts, samples and document counts. Plus which sets it accepts.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardex.meta.index_definition import make_definition
from shardex.pipeline.project.projector import OP_DELETE, OP_UPSERT, Projector, ProjectResult


def _d(i: int, keys: list[Any], **kw: Any) -> Any:
    return make_definition(id=f"ix{i}", name=f"ix{i}", keyspace="ks", keys=keys, **kw)


# Index sets the fast path takes: the bench's pair, DESC parts, a moving partition key,
# META().id keys and partitions, numeric and mirrored comparisons, a bare-path WHERE shared
# with a key, three-step paths, quoted names.
FAST_SETS: dict[str, list[Any]] = {
    "bench": [
        _d(1, ["address.city", "age"], partition_by=["META().id"], num_partition=4),
        _d(2, ["email"], where="status = 'active'"),
    ],
    "desc_moving": [
        _d(1, [("age", True), "address.city"], partition_by=["address.city"], num_partition=3),
        _d(2, ["META().id", ("email", True)], where="age > 30"),
    ],
    "mirrored_bare": [
        _d(1, ["verified", "a.b.c"], where="verified", partition_by=["META().id"], num_partition=5),
        _d(2, ["`odd name`"], where="30 <= age"),
        _d(3, ["status"], where="status != 'active'"),
        _d(4, ["age"], where="age = 40"),
        _d(5, ["META().id"], where="tags < 'm'"),
    ],
}

SLOW_SETS: dict[str, list[Any]] = {
    "function": [_d(1, ["LOWER(email)"])],
    "array_position": [_d(1, ["tags[0]"])],
    "and": [_d(1, ["email"], where="status = 'active' AND age > 3")],
    "compare_key": [_d(1, ["status = 'active'"]), _d(2, ["email"], where="status = 'active'")],
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["active", "pending", "", "a\x00b", "Zürich", "\ud7ff", "m"]),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = ["address", "age", "email", "status", "verified", "a", "odd name", "tags", "x"]


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=len(FIELDS), unique=True)):
        if name == "address" and draw(st.booleans()):
            doc[name] = {"city": draw(values), "zip": draw(values)}
        elif name == "a" and draw(st.booleans()):
            doc[name] = {"b": {"c": draw(values)} if draw(st.booleans()) else draw(values)}
        elif name == "status":
            doc[name] = draw(st.one_of(st.sampled_from(["active", "pending"]), values))
        else:
            doc[name] = draw(values)
    return doc


@st.composite
def bodies(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return None  # a deletion
    if kind == 1:
        return draw(st.sampled_from([b"not json", b"[1, 2]", b'"text"', b"", b"{"]))
    if kind == 2:  # a key over MAX_ENTRY_BYTES, and a float JSON cannot hold exactly
        return draw(st.sampled_from([b'{"email": "%s", "status": "active"}' % (b"e" * 5000)]))
    if kind == 3:
        return b'{"age": 1e999, "address": {"city": 1e999}, "status": "active", "email": 1}'
    if kind == 4:  # duplicate names (the last one wins) and escaped names
        return b'{"age": 1, "age": 50, "\\u0065mail": "x", "status": "active"}'
    doc = draw(documents())
    if draw(st.booleans()):
        return msgspec.json.encode(doc)
    return json.dumps(doc, ensure_ascii=True).encode()


batches = st.lists(bodies(), max_size=25)


def _run(pr: Projector, bs: list[bytes | None], columns: bool) -> ProjectResult:
    ids = [f"doc-{i}\x00" if i % 7 == 3 else f"doc-{i}" for i in range(len(bs))]
    parts = [i % 4 for i in range(len(bs))]
    seqnos = list(range(1, len(bs) + 1))
    ops = [OP_DELETE if b is None else OP_UPSERT for b in bs]
    if columns:
        return pr.project_columns(ids, parts, seqnos, ops, bs, sample_limit=None)
    return pr.project(zip(ids, parts, seqnos, ops, bs, strict=True), sample_limit=3)


def _same(a: ProjectResult, b: ProjectResult) -> None:
    assert a.rows == b.rows
    assert a.errors == b.errors
    assert a.samples == b.samples
    assert a.documents == b.documents


@pytest.mark.parametrize("name", sorted(FAST_SETS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bs=batches, columns=st.booleans())
def test_fast_path_equals_general_path(name: str, bs: list[bytes | None], columns: bool) -> None:
    defs = FAST_SETS[name]
    fast, general = Projector(defs), Projector(defs, fast=False)
    assert fast.fast and not general.fast
    _same(_run(fast, bs, columns), _run(general, bs, columns))


@pytest.mark.parametrize("name", sorted(SLOW_SETS))
def test_other_shapes_stay_on_the_general_path(name: str) -> None:
    assert not Projector(SLOW_SETS[name]).fast


def test_fast_path_handles_edge_rows_in_place() -> None:
    """A fallback row (not JSON) between fast rows keeps its place and its error report."""
    defs = FAST_SETS["bench"]
    bs: list[bytes | None] = [
        b'{"email": "a@x", "status": "active", "address": {"city": "Oslo"}, "age": 3}',
        b"not json",
        None,
        b'{"email": "%s", "status": "active"}' % (b"e" * 5000),
        b'{"email": "b@x", "status": "pending"}',
    ]
    res = _run(Projector(defs), bs, columns=True)
    _same(res, _run(Projector(defs, fast=False), bs, columns=True))
    assert [r[2] for r in res.rows] == [0, 0, 1, 1, 2, 2, 1, 1, 1, 1]
    assert res.errors == {"ix1": 1, "ix2": 2}
    assert [s.docid for s in res.samples] == ["doc-1", "doc-1", "doc-3\x00"]
