"""Projector rules: WHERE, leading MISSING, evaluation errors, deletes, partitioning; the
Arrow entry point; agreement with the oracle's independent evaluation."""

from __future__ import annotations

import random

import msgspec
import pyarrow as pa

from shardex.core.keycodec import decode_entry, encode_entry, encode_key
from shardex.core.values import MISSING
from shardex.index import (
    BROADCAST,
    DELETE,
    ERROR,
    UPSERT,
    UPSERT_DELETION,
    hash_partition,
    make_definition,
)
from shardex.index.keyversion import KEY_VERSION_SCHEMA, MAX_ENTRY_BYTES, from_arrow
from shardex.index.oracle import evaluate_document, expected_entries, expected_errors
from shardex.pipeline.project.projector import (
    CHANGE_SCHEMA,
    Projector,
    map_in_arrow_fn,
    project,
    project_arrow,
)
from shardex.testing.index import EXPLODE

J = msgspec.json.encode

USERS = make_definition(
    id="users", name="users", keyspace="ks", keys=["age", "name"], where="type = 'user'"
)
BY_CITY = make_definition(
    id="city",
    name="city",
    keyspace="ks",
    keys=["city", ("score", True)],
    partition_by=["city"],
    num_partition=4,
)
BY_ID = make_definition(
    id="byid",
    name="byid",
    keyspace="ks",
    keys=["email"],
    partition_by=["META().id"],
    num_partition=4,
)


def one(defn, docid, doc, seqno=5, part=3):
    rows = project([defn], [(docid, part, seqno, "upsert", J(doc))]).rows
    assert len(rows) == 1
    return rows[0]


def test_upsert_row_layout() -> None:
    row = one(USERS, "u1", {"type": "user", "age": 30, "name": "ann"})
    assert row == ("users", 0, UPSERT, encode_entry([30, "ann"], "u1"), "u1", 3, 5)


def test_where_not_true_emits_deletion() -> None:
    for doc in ({"type": "admin", "age": 1}, {"age": 1}, {"type": None, "age": 1}):
        row = one(USERS, "u1", doc)
        assert row[2] == UPSERT_DELETION and row[1] == 0 and row[3] == b""


def test_where_uses_n1ql_truth() -> None:
    d = make_definition(id="t", name="t", keyspace="ks", keys=["a"], where="flag")
    assert one(d, "x", {"a": 1, "flag": 1})[2] == UPSERT  # non-zero number is true
    assert one(d, "x", {"a": 1, "flag": "yes"})[2] == UPSERT
    for falsy in (0, "", [], {}, None, False):
        assert one(d, "x", {"a": 1, "flag": falsy})[2] == UPSERT_DELETION


def test_leading_missing_not_indexed_non_leading_missing_kept() -> None:
    assert one(USERS, "u", {"type": "user", "name": "x"})[2] == UPSERT_DELETION
    row = one(USERS, "u", {"type": "user", "age": 4})
    assert row[2] == UPSERT
    assert decode_entry(row[3]) == ([4, MISSING], "u")
    # NULL leading key is indexed (only MISSING is excluded)
    assert one(USERS, "u", {"type": "user", "age": None})[2] == UPSERT


def test_errors_counted_never_raised() -> None:
    d = make_definition(id="e", name="e", keyspace="ks", keys=[f"{EXPLODE}(a)"])
    changes = [
        ("ok", 0, 1, "upsert", J({"a": 1})),
        ("inf", 0, 2, "upsert", J({"a": "boom"})),  # the expression raises
        ("bad", 0, 3, "upsert", b"{not json"),
    ]
    res = project([d, USERS], changes)
    assert res.errors == {"e": 2, "users": 1}
    assert {(s.index_id, s.docid) for s in res.samples} == {
        ("e", "inf"),
        ("e", "bad"),
        ("users", "bad"),
    }
    kinds = {(r[0], r[4]): r[2] for r in res.rows}
    assert kinds[("e", "ok")] == UPSERT
    assert kinds[("e", "inf")] == UPSERT_DELETION  # an old entry must go away
    assert kinds[("users", "bad")] == UPSERT_DELETION
    assert expected_errors(d, {"ok": {"a": 1}, "inf": {"a": "boom"}}) == {"inf"}


def test_non_finite_key_is_an_error() -> None:
    # inf cannot be encoded as a key (not a JSON value). The compiled and the interpreted
    # ``a * 1e308`` disagree today (inf vs NULL), so the projector is given inf directly.
    d = make_definition(id="f", name="f", keyspace="ks", keys=["a"])
    pr = Projector([d], fast=False)  # the general path: the one whose _fns are swapped
    pr._fns = (lambda doc, m=None, p=None: float("inf"),)
    res = pr.project([("x", 0, 1, "upsert", J({"a": 1}))])
    assert res.errors == {"f": 1} and res.rows[0][2] == UPSERT_DELETION


def test_delete_rows_and_destinations() -> None:
    res = project([USERS, BY_CITY, BY_ID], [("d1", 2, 9, "delete", None)])
    dests = {r[0]: r[1] for r in res.rows}
    assert all(r[2] == DELETE and r[3] == b"" and r[5:] == (2, 9) for r in res.rows)
    assert dests["users"] == 0
    assert dests["city"] == BROADCAST  # old slice unknown: the router broadcasts
    assert dests["byid"] == hash_partition(encode_key(["d1"]), 4)


def test_partition_destinations() -> None:
    row = one(BY_CITY, "c1", {"city": "paris", "score": 2.5})
    assert row[1] == hash_partition(encode_key(["paris"]), 4)
    assert decode_entry(row[3], [False, True]) == (["paris", 2.5], "c1")
    # not indexed in a moving index: the deletion is a broadcast
    assert one(BY_CITY, "c1", {"score": 1})[1:3] == (BROADCAST, UPSERT_DELETION)
    # by docid: the deletion goes to the docid's slice
    row = one(BY_ID, "x9", {"name": "no email"})
    assert row[1:3] == (hash_partition(encode_key(["x9"]), 4), UPSERT_DELETION)


def test_shared_expressions_evaluated_once() -> None:
    calls = []
    defs = [BY_CITY, make_definition(id="c2", name="c2", keyspace="ks", keys=["city"])]
    pr = Projector(defs, fast=False)  # the general path counts calls of its _fns
    fns = list(pr._fns)
    for i, f in enumerate(fns):
        fns[i] = lambda d, m=None, p=None, f=f, i=i: calls.append(i) or f(d, m, p)
    pr._fns = tuple(fns)
    pr.project([("a", 0, 1, "upsert", J({"city": "x", "score": 1}))])
    assert sorted(calls) == [0, 1]  # city once (2 keys + 1 partition key), score once


def test_projector_agrees_with_oracle_on_random_documents() -> None:
    rng = random.Random(7)
    defs = [USERS, BY_CITY, BY_ID]
    values = [None, True, 0, -1.5, 7, "x", "", [1, "a"], {"k": 1}, 2**70]
    docs = {}
    for i in range(400):
        doc = {}
        for f in ("type", "age", "name", "city", "score", "email"):
            if rng.random() < 0.7:
                doc[f] = rng.choice([*values, "user"])
        docs[f"d{i}"] = doc
    changes = [(k, 0, i + 1, "upsert", J(v)) for i, (k, v) in enumerate(docs.items())]
    res = project(defs, changes)
    by = {(r[0], r[4]): r for r in res.rows}
    for d in defs:
        for docid, doc in docs.items():
            want = evaluate_document(d, docid, doc)
            row = by[(d.id, docid)]
            if want is None:
                assert row[2] == UPSERT_DELETION
            else:
                assert (row[1], row[3]) == want, (d.id, docid, doc)


def _change_batch(changes) -> pa.RecordBatch:
    cols = list(zip(*changes, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(cols, CHANGE_SCHEMA, strict=True)],
        schema=CHANGE_SCHEMA,
    )


def test_arrow_entry_points() -> None:
    changes = [
        ("a", 1, 1, "upsert", J({"type": "user", "age": 3, "name": "z", "city": "p"})),
        ("b", 1, 2, "upsert", b"[broken"),
        ("c", 1, 3, "delete", None),
    ]
    batch = _change_batch(changes)
    out, res = project_arrow([USERS, BY_CITY], batch)
    assert out.schema == KEY_VERSION_SCHEMA
    assert from_arrow(out) == res.rows == project([USERS, BY_CITY], changes).rows
    out, res = project_arrow([USERS, BY_CITY], batch, error_rows=True)
    errors = [r for r in from_arrow(out) if r[2] == ERROR]
    assert {(r[0], r[4], r[5], r[6]) for r in errors} == {("users", "b", 1, 2), ("city", "b", 1, 2)}
    fn = map_in_arrow_fn([USERS, BY_CITY])
    outs = list(fn(iter([batch, batch.slice(0, 1)])))
    assert [o.num_rows for o in outs] == [8, 2]


def test_an_entry_over_the_size_limit_is_an_evaluation_error_not_an_entry() -> None:
    defn = make_definition(id="big", name="big", keyspace="ks", keys=["name"])
    docs = {"small": {"name": "x" * 100}, "huge": {"name": "x" * MAX_ENTRY_BYTES}}
    changes = [(d, 0, i + 1, "upsert", J(doc)) for i, (d, doc) in enumerate(docs.items())]
    res = project([defn], changes)
    assert res.errors == {"big": 1}
    assert [s.docid for s in res.samples] == ["huge"]
    kinds = {r[4]: r[2] for r in res.rows}
    assert kinds == {"small": UPSERT, "huge": UPSERT_DELETION}
    assert expected_errors(defn, docs) == {"huge"}
    assert {e for _, e in expected_entries(defn, docs)} == {
        r[3] for r in res.rows if r[2] == UPSERT
    }


def test_a_huge_integer_power_is_null_not_a_stall() -> None:
    """POWER on big integers must not compute an exact gigantic integer (minutes of CPU for
    one document): it overflows to NULL like any non-finite result."""
    defn = make_definition(id="pw", name="pw", keyspace="ks", keys=["POWER(n, n)"])
    changes = [
        ("big", 0, 1, "upsert", J({"n": 10**9})),
        ("small", 0, 2, "upsert", J({"n": 3})),
    ]
    res = project([defn], changes)
    keys = {r[4]: decode_entry(r[3])[0] for r in res.rows}
    assert keys == {"big": [None], "small": [27]}


def test_docid_slices_match_the_generic_key_encoding() -> None:
    """The projector hashes a docid's key encoding without the generic encoder; every slice
    it picks must be the one ``hash_partition(encode_key([docid]))`` names (scans and the
    back index rely on it), also for NULs, non-ASCII text and lone surrogates."""
    rng = random.Random(7)
    docids = ["", "a", "x\x00y", "\x00", "Ærø-ÿ", "日本", "\ud800lone", "k" * 300]
    docids += ["".join(chr(rng.randrange(1, 0x3000)) for _ in range(8)) for _ in range(200)]
    for docid in docids:
        for n in (2, 3, 4, 16):
            expect = hash_partition(encode_key([docid]), n)
            defn = make_definition(
                id="d",
                name="d",
                keyspace="ks",
                keys=["email"],
                partition_by=["META().id"],
                num_partition=n,
            )
            row = one(defn, docid, {"name": "no email"})  # not indexed: the owner's slice
            assert row[1:3] == (expect, UPSERT_DELETION), docid
            deleted = project([defn], [(docid, 0, 9, "delete", None)]).rows[0]
            assert deleted[1] == expect
