"""DML writes under CAS (``sql/exec/dml.py``), against an in-memory document store that plays
the data service's CAS rules and lets a test slip a concurrent write in between a read and
the write that follows it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.dml import CAS_ATTEMPTS, DELETE, SKIP, write_checked


class Store:
    """docid -> (document, CAS); ``before_write`` runs just before each write is applied
    (a concurrent client's write landing in the window)."""

    def __init__(self, docs: dict[str, Any]) -> None:
        self.docs: dict[str, tuple[Any, int]] = {d: (v, 1) for d, v in docs.items()}
        self.before_write: Callable[[str], None] = lambda docid: None
        self.writes = 0
        # (durability, durability_timeout) of every write, in order
        self.durabilities: list[tuple[str, float | None]] = []

    def put(self, docid: str, doc: Any) -> None:
        cas = self.docs[docid][1] + 1 if docid in self.docs else 1
        self.docs[docid] = (doc, cas)

    async def get_many_cas(self, keyspace: str, docids: list[str]) -> dict[str, tuple[Any, int]]:
        return {d: self.docs[d] for d in docids if d in self.docs}

    async def get_cas(self, keyspace: str, docid: str) -> tuple[Any, int] | None:
        return self.docs.get(docid)

    def _check(self, docid: str, cas: int) -> None:
        self.before_write(docid)
        if docid not in self.docs:
            raise ShardexError("gone", code=ErrorCode.DOC_NOT_FOUND)
        if self.docs[docid][1] != cas:
            raise ShardexError("cas", code=ErrorCode.CAS_MISMATCH)
        self.writes += 1

    async def replace(
        self,
        keyspace: str,
        docid: str,
        doc: Any,
        cas: int,
        *,
        durability: str = "persist",
        durability_timeout: float | None = None,
    ) -> None:
        self.durabilities.append((durability, durability_timeout))
        self._check(docid, cas)
        self.put(docid, doc)

    async def delete(
        self,
        keyspace: str,
        docid: str,
        cas: int | None = None,
        *,
        durability: str = "persist",
        durability_timeout: float | None = None,
    ) -> object | None:
        self.durabilities.append((durability, durability_timeout))
        try:
            self._check(docid, cas or 0)
        except ShardexError as exc:
            if exc.code is ErrorCode.DOC_NOT_FOUND:
                return None
            raise
        del self.docs[docid]
        return object()


def increment_below(limit: int) -> Callable[[str, Any], Any]:
    def decide(docid: str, doc: Any) -> Any:
        if doc["n"] >= limit:
            return SKIP
        return {**doc, "n": doc["n"] + 1}

    return decide


def run(store: Store, docids: list[str], decide: Callable[[str, Any], Any]) -> Any:
    return asyncio.run(write_checked(store, "ks", docids, decide, parallel=4))  # type: ignore[arg-type]


def test_a_concurrent_write_is_not_overwritten_and_where_is_rechecked() -> None:
    store = Store({"a": {"n": 0}, "b": {"n": 5}})
    raced: set[str] = set()

    def concurrent(docid: str) -> None:  # another client sets n = 9 once, before our write
        if docid not in raced:
            raced.add(docid)
            store.put(docid, {"n": 9})

    store.before_write = concurrent
    written = run(store, ["a", "b"], increment_below(9))
    # Both versions our WHERE saw changed under us; the newest (n = 9) no longer matches.
    assert written == []
    assert store.docs["a"][0] == {"n": 9} and store.docs["b"][0] == {"n": 9}
    store.before_write = lambda docid: None
    assert run(store, ["a"], increment_below(10)) == [("a", {"n": 10})]


def test_the_newest_version_is_the_one_changed() -> None:
    store = Store({"a": {"n": 0}})
    raced = []

    def concurrent(docid: str) -> None:
        if not raced:
            raced.append(docid)
            store.put(docid, {"n": 3, "other": "kept"})

    store.before_write = concurrent
    assert run(store, ["a"], increment_below(100)) == [("a", {"n": 4, "other": "kept"})]


def test_deleted_meanwhile_is_skipped_and_delete_carries_cas() -> None:
    store = Store({"a": {"n": 0}, "b": {"n": 1}, "c": {"n": 2}})

    def concurrent(docid: str) -> None:
        if docid == "a" and "a" in store.docs:
            del store.docs["a"]

    store.before_write = concurrent
    out = run(store, ["a", "b", "missing", "c"], lambda d, doc: DELETE)
    assert out == [("b", {"n": 1}), ("c", {"n": 2})]
    assert store.docs == {}


def test_a_document_that_never_settles_ends_in_a_clear_error() -> None:
    store = Store({"hot": {"n": 0}})
    store.before_write = lambda docid: store.put(docid, {"n": 0})  # always changed under us
    with pytest.raises(ShardexError) as err:
        run(store, ["hot"], increment_below(100))
    assert err.value.code is ErrorCode.CAS_MISMATCH
    assert err.value.details["docid"] == "hot"
    assert err.value.details["attempts"] == CAS_ATTEMPTS
    assert store.writes == 0


def test_the_statement_durability_reaches_every_write() -> None:
    store = Store({"a": {"n": 1}, "b": {"n": 2}})
    done = asyncio.run(
        write_checked(
            store,  # type: ignore[arg-type]
            "ks",
            ["a", "b"],
            increment_below(10),
            parallel=2,
            durability="majority",
            durability_timeout=1.5,
        )
    )
    assert len(done) == 2
    assert store.durabilities == [("majority", 1.5), ("majority", 1.5)]
