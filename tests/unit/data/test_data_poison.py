"""Poison input does not hurt its neighbours on the data node's write path: in one group
commit, an op whose document is too deep or holds NaN gets BAD_REQUEST in its own slot while
the others commit (read back), and the engine still serves; a group whose call fails in an
unexpected way is retried one entry at a time, so only the guilty entry fails."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import shardex.data.documents as documents
from shardex.api.records import MutationResult
from shardex.api.validation import MAX_DOC_DEPTH
from shardex.data.engine import DataEngine
from shardex.data.service import DataService
from shardex.errors import ErrorCode, ShardexError
from tests.unit.data.test_data_service import running_service, state_with

DEEP_TEXT = b'{"a":' * 10_000 + b"1" + b"}" * 10_000
JUST_TOO_DEEP = b'{"a":' * (MAX_DOC_DEPTH + 1) + b"1" + b"}" * (MAX_DOC_DEPTH + 1)


def deep_dict(depth: int) -> dict[str, Any]:
    doc: Any = 1
    for _ in range(depth):
        doc = {"a": doc}
    return doc


POISON: dict[str, object] = {
    "deep-text": DEEP_TEXT,
    "deep-str": DEEP_TEXT.decode(),
    "just-too-deep": JUST_TOO_DEEP,
    "deep-dict": deep_dict(10_000),
    "nan": {"a": math.nan},
    "inf-text": b'{"a": Infinity}',
}


@pytest.fixture
def engine(tmp_path: Path):
    eng = DataEngine(tmp_path / "db")
    eng.create_keyspace("ks", 8)
    for p in range(8):
        eng.create_partition("ks", p)
    yield eng
    eng.close()


def test_poison_ops_fail_alone_in_mutate_many(engine: DataEngine) -> None:
    ops: list[tuple[str, str, object, None]] = []
    for i in range(20):
        ops.append(("upsert", f"good-{i}", b'{"i": %d}' % i, None))
        if i % 3 == 0 and i // 3 < len(POISON):
            docid = list(POISON)[i // 3]
            ops.append(("upsert", docid, POISON[docid], None))
    results = engine.mutate_many("ks", ops)
    for (_, docid, _, _), r in zip(ops, results, strict=True):
        if docid in POISON:
            assert isinstance(r, ShardexError), docid
            assert r.code == ErrorCode.BAD_REQUEST
            assert r.details["docid"] == docid
        else:
            assert isinstance(r, MutationResult), (docid, r)
    for i in range(20):
        assert engine.get("ks", f"good-{i}").doc == {"i": i}
    for docid in POISON:
        with pytest.raises(ShardexError):
            engine.get("ks", docid)
    engine.upsert("ks", "after", {"ok": True})  # still serves
    assert engine.get("ks", "after").doc == {"ok": True}


def test_too_deep_error_names_depth_and_limit(engine: DataEngine) -> None:
    [r] = engine.mutate_many("ks", [("upsert", "d", JUST_TOO_DEEP, None)])
    assert isinstance(r, ShardexError)
    assert r.details["depth"] == MAX_DOC_DEPTH + 1
    assert r.details["limit"] == MAX_DOC_DEPTH


def test_a_check_that_breaks_fails_only_its_op(
    engine: DataEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = documents.encode_document

    def breaks_on_poison(doc: object, max_bytes: int, docid: str = "") -> bytes:
        if docid == "poison":
            raise MemoryError("simulated")
        return real(doc, max_bytes, docid)

    monkeypatch.setattr(documents, "encode_document", breaks_on_poison)
    a, bad, b = engine.mutate_many(
        "ks",
        [
            ("upsert", "a", b"{}", None),
            ("upsert", "poison", b"{}", None),
            ("upsert", "b", b"{}", None),
        ],
    )
    assert isinstance(a, MutationResult) and isinstance(b, MutationResult)
    assert isinstance(bad, ShardexError) and bad.code == ErrorCode.BAD_REQUEST


def test_a_failure_after_a_written_chunk_is_per_op(
    engine: DataEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunks of 2 ops; the second chunk's write fails: the first chunk stays committed with
    # its results, the rest fail per op, and nothing is raised (a retry would write twice).
    monkeypatch.setattr(documents, "BATCH_MAX_OPS", 2)
    real = documents.DocumentOps._apply_chunk
    calls = []

    def second_fails(self, *args: Any) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk gone")
        real(self, *args)

    monkeypatch.setattr(documents.DocumentOps, "_apply_chunk", second_fails)
    results = engine.mutate_many("ks", [("upsert", f"k{i}", b"{}", None) for i in range(6)])
    assert [isinstance(r, MutationResult) for r in results] == [True, True] + [False] * 4
    assert {r.code for r in results[2:]} == {ErrorCode.STORAGE_ERROR}  # type: ignore[union-attr]
    assert len(calls) == 2  # later chunks not attempted: a partition's ops stay in order


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[DataService]:
    async with running_service(tmp_path) as (ds, coord):
        coord.state = state_with(5, ("ks", "u1", 1, 5, ["n1"]))
        await ds.reconcile()
        yield ds


async def test_group_commit_poison_op_gets_bad_request_neighbours_commit(
    service: DataService,
) -> None:
    committer = service.committer
    assert committer is not None
    goods = [
        committer.submit("ks", "persist", ("upsert", f"g{i}", b'{"i": 1}', None)) for i in range(5)
    ]
    poison = committer.submit("ks", "persist", ("upsert", "deep", DEEP_TEXT, None))
    batch = committer.submit_many(
        "ks", "persist", [("upsert", "b1", b"{}", None), ("upsert", "nan", {"x": math.nan}, None)]
    )
    out = await asyncio.gather(*goods, poison, batch, return_exceptions=True)
    assert all(isinstance(r, MutationResult) for r in out[:5])
    assert isinstance(out[5], ShardexError) and out[5].code == ErrorCode.BAD_REQUEST
    b1, nan = out[6]  # type: ignore[misc]
    assert isinstance(b1, MutationResult)
    assert isinstance(nan, ShardexError) and nan.code == ErrorCode.BAD_REQUEST
    assert committer.flushes < 7  # they did share a group
    for i in range(5):
        assert service.engine.get("ks", f"g{i}").doc == {"i": 1}


async def test_group_that_fails_unexpectedly_is_retried_entry_by_entry(
    service: DataService,
) -> None:
    committer = service.committer
    assert committer is not None
    real = committer._mutate_many
    calls: list[int] = []

    def breaks_on_poison(keyspace: str, ops: list[Any], **kw: Any) -> list[Any]:
        calls.append(len(ops))
        if any(op[1] == "poison" for op in ops):
            raise RuntimeError("unexpected")
        return real(keyspace, ops, **kw)

    committer._mutate_many = breaks_on_poison  # type: ignore[method-assign]
    subs = [
        committer.submit("ks", "persist", ("upsert", d, b"{}", None)) for d in ("a", "poison", "b")
    ]
    many = committer.submit_many("ks", "persist", [("upsert", "c", b"{}", None)])
    a, poison, b, c = await asyncio.gather(*subs, many, return_exceptions=True)
    assert isinstance(a, MutationResult) and isinstance(b, MutationResult)
    assert isinstance(c, list) and isinstance(c[0], MutationResult)
    assert isinstance(poison, ShardexError) and poison.code == ErrorCode.STORAGE_ERROR
    assert calls[0] == 4 and calls[1:] == [1, 1, 1, 1]  # the group, then each entry
    for d in ("a", "b", "c"):
        service.engine.get("ks", d)
