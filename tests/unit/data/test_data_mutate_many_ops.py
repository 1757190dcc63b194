"""``mutate_many``'s inlined per-op checks give what the single-op path (``_prepare``) gives:
the same error per bad op, the same partition per good one, whatever the op's shape; and
chunking keeps every op's result in its place."""

from __future__ import annotations

import pytest

import shardex.data.documents as documents
from shardex.api.records import MutationResult
from shardex.data.engine import DataEngine
from shardex.errors import ShardexError
from shardex.meta.partitioning import partition_of

PARTS = 8


@pytest.fixture
def engine(tmp_path):
    eng = DataEngine(tmp_path / "db")
    eng.create_keyspace("ks", PARTS)
    for p in range(PARTS):
        eng.create_partition("ks", p)
    yield eng
    eng.close()


# (kind, docid, doc, cas): good and bad ops of every shape the fast path must tell apart.
OPS: list[tuple[object, object, object, object]] = [
    ("upsert", "a", {"x": 1}, None),
    ("upsert", "é-ü", b'{"y": 2}', None),
    ("insert", "new", b"{}", None),
    ("insert", "a", b"{}", None),  # exists: DOC_EXISTS after the first op
    ("replace", "a", b'{"x": 3}', None),
    ("replace", "missing", b"{}", None),
    ("delete", "é-ü", None, None),
    ("upsert", "", b"{}", None),  # empty docid
    ("upsert", 7, b"{}", None),  # not a str
    ("upsert", "x" * 250, b"{}", None),  # at the limit
    ("upsert", "x" * 251, b"{}", None),  # over it
    ("upsert", "é" * 126, b"{}", None),  # 252 UTF-8 bytes
    ("upsert", "\ud800", b"{}", None),  # a lone surrogate does not encode
    ("upsert", "bad-json", b"{", None),
    ("upsert", "not-object", b"[1]", None),
    ("upsert", "bad-utf8", b'{"a": "\xff"}', None),
    ("frobnicate", "k", b"{}", None),
    ("insert", "with-cas", b"{}", 5),
    ("upsert", "a", b"{}", 0),  # cas must be positive
    ("upsert", "a", b"{}", 12345),  # CAS mismatch
    ("upsert", "a", b"{}", True),
]


def _shape(r: MutationResult | ShardexError) -> object:
    if isinstance(r, ShardexError):
        # the message and details, less the stored CAS (a clock reading, differs per engine)
        details = {k: v for k, v in (r.details or {}).items() if k != "actual"}
        return ("error", r.code, str(r).split(", document has")[0], details)
    return ("ok", r.partition)


def _one_by_one(engine: DataEngine, ops: list) -> list[object]:
    """Each op alone through ``_mutate`` (the single-op API's path, ``_prepare``)."""
    out: list[object] = []
    for kind, docid, doc, cas in ops:
        try:
            if kind not in ("insert", "upsert", "replace", "delete"):
                out.append(_shape(engine.mutate_many("ks", [(kind, docid, doc, cas)])[0]))
                continue
            out.append(_shape(engine._documents._mutate(kind, "ks", docid, doc, cas, "memory")))
        except ShardexError as exc:
            out.append(_shape(exc))
    return out


def test_every_op_gets_what_the_single_op_path_gives(tmp_path, engine) -> None:
    batch = [_shape(r) for r in engine.mutate_many("ks", OPS, durability="memory")]
    other = DataEngine(tmp_path / "other")
    other.create_keyspace("ks", PARTS)
    for p in range(PARTS):
        other.create_partition("ks", p)
    try:
        single = _one_by_one(other, OPS)
    finally:
        other.close()
    assert batch == single
    # Good ops landed in partition_of's partition (the hash of the bytes encoded once).
    for (_, docid, _, _), shape in zip(OPS, batch, strict=True):
        if shape[0] == "ok":
            assert shape == ("ok", partition_of(str(docid), PARTS))
    assert engine.get("ks", "a").doc == {"x": 3}
    assert engine.get("ks", "x" * 250).doc == {}


def test_chunks_keep_results_in_place(engine, monkeypatch) -> None:
    monkeypatch.setattr(documents, "BATCH_MAX_OPS", 3)
    ops = [("upsert", f"d{i}", {"i": i}, None) for i in range(10)]
    ops.insert(4, ("upsert", "", b"{}", None))
    ops.insert(8, ("insert", "d0", b"{}", None))  # d0 exists by then (an earlier chunk)
    res = engine.mutate_many("ks", ops, durability="memory")
    assert len(res) == len(ops)
    for (_, docid, doc, _), r in zip(ops, res, strict=True):
        if docid == "" or (docid == "d0" and doc == b"{}"):
            assert isinstance(r, ShardexError)
        else:
            assert isinstance(r, MutationResult)
            assert r.partition == partition_of(docid, PARTS)
            assert engine.get("ks", docid).doc == doc
    # Seqnos within a partition follow input order across chunks.
    by_part: dict[int, list[int]] = {}
    for r in res:
        if isinstance(r, MutationResult):
            by_part.setdefault(r.partition, []).append(r.seqno)
    assert all(s == sorted(s) for s in by_part.values())
