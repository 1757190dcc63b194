"""``META().expiration`` in the distributed plan: the fetched documents bring it (no index
covers it, so a leaf fetches and late materialization does not apply), and a key lookup's
scope rows carry it when, and only when, the query reads it."""

from __future__ import annotations

import asyncio
from typing import Any

from shardex.sql.exec.analyze import reads_meta_field
from shardex.sql.exec.fragments import lookup_rows
from shardex.sql.syntax.bind import META_KEY
from tests.unit.sql.test_sql_exec_fastpaths import _plan
from tests.unit.sql.test_sql_exec_plan import KS


def test_meta_expiration_is_never_covered() -> None:
    for sql in (
        f"SELECT META().expiration AS e FROM {KS} WHERE city = 'rome'",
        f"SELECT city FROM {KS} WHERE city = 'rome' AND META().expiration > 0",
        f"SELECT META().expiration AS e FROM {KS} WHERE city = 'rome' ORDER BY age LIMIT 3",
    ):
        p = _plan(sql)
        assert reads_meta_field(p.bound, "expiration"), sql
        assert p.choice is not None and not p.choice.covering and not p.late, sql
    # an ORDER BY ... LIMIT otherwise fetched late by the root: the leaves fetch instead
    late = f"SELECT name{{}} FROM {KS} WHERE age > 3 ORDER BY age LIMIT 3"
    assert _plan(late.format("")).late
    assert not _plan(late.format(", META().expiration AS e")).late
    p = _plan(f"SELECT META().id AS id FROM {KS} WHERE city = 'rome'")
    assert not reads_meta_field(p.bound, "expiration")
    assert p.choice is not None and p.choice.covering  # META().id alone: still covered


def _rows(sql: str) -> tuple[list[Any], list[str]]:
    calls: list[str] = []
    docs = {"a": {"v": 1}, "b": {"v": 2}}

    async def fetch(keyspace: str, ids: list[str]) -> list[tuple[str, Any]]:
        calls.append("plain")
        return [(i, docs[i]) for i in ids if i in docs]

    async def meta(keyspace: str, ids: list[str]) -> list[tuple[str, Any, dict[str, Any]]]:
        calls.append("meta")
        return [(i, docs[i], {"id": i, "expiration": 100 + len(i)}) for i in ids if i in docs]

    b = _plan(sql).bound

    async def run() -> list[Any]:
        return [r async for chunk in lookup_rows(b, None, KS, fetch, None, meta) for r in chunk]

    return asyncio.run(run()), calls


def test_key_lookup_rows_carry_the_expiration_only_when_read() -> None:
    rows, calls = _rows(f"SELECT META().expiration AS e FROM {KS} USE KEYS ['b', 'x', 'a', 'b']")
    assert calls == ["meta"]  # in key order, repeats kept, the missing one left out
    assert [r[META_KEY] for r in rows] == [{"id": d, "expiration": 101} for d in ("b", "a", "b")]
    rows, calls = _rows(f"SELECT META().id AS id FROM {KS} USE KEYS ['a']")
    assert calls == ["plain"]
    assert [r[META_KEY] for r in rows] == [{"id": "a"}]
