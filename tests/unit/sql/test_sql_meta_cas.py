"""``META().cas`` in the distributed plan, as ``META().expiration``: only a document's fetch
brings it (no index covers it, late materialization does not apply, a key lookup's rows
carry it when the query reads it); the reference engine, which keeps no CAS, gives MISSING."""

from __future__ import annotations

import asyncio
from typing import Any

from shardex.sql.exec.analyze import reads_fetched_meta
from shardex.sql.exec.fragments import lookup_rows
from shardex.sql.local import LocalEngine
from shardex.sql.syntax.bind import META_KEY
from tests.unit.sql.test_sql_exec_fastpaths import _plan
from tests.unit.sql.test_sql_exec_plan import KS


def test_meta_cas_is_never_covered_nor_late() -> None:
    for sql in (
        f"SELECT META().cas AS c FROM {KS} WHERE city = 'rome'",
        f"SELECT city FROM {KS} WHERE city = 'rome' AND META({KS}).cas > 0",
    ):
        p = _plan(sql)
        assert reads_fetched_meta(p.bound), sql
        assert p.choice is not None and not p.choice.covering, sql
    late = f"SELECT name{{}} FROM {KS} WHERE age > 3 ORDER BY age LIMIT 3"
    assert _plan(late.format("")).late
    assert not _plan(late.format(", META().cas AS c")).late
    p = _plan(f"SELECT META().id AS id FROM {KS} WHERE city = 'rome'")
    assert not reads_fetched_meta(p.bound)
    assert p.choice is not None and p.choice.covering


def test_key_lookup_rows_carry_the_cas_when_read() -> None:
    docs = {"a": {"v": 1}, "b": {"v": 2}}
    calls: list[str] = []

    async def fetch(keyspace: str, ids: list[str]) -> list[tuple[str, Any]]:
        calls.append("plain")
        return [(i, docs[i]) for i in ids if i in docs]

    async def meta(keyspace: str, ids: list[str]) -> list[tuple[str, Any, dict[str, Any]]]:
        calls.append("meta")
        return [(i, docs[i], {"id": i, "cas": 7, "expiration": 0}) for i in ids if i in docs]

    b = _plan(f"SELECT META().cas AS c FROM {KS} USE KEYS ['b', 'a']").bound

    async def run() -> list[Any]:
        return [r async for chunk in lookup_rows(b, None, KS, fetch, None, meta) for r in chunk]

    rows = asyncio.run(run())
    assert calls == ["meta"]
    assert [r[META_KEY] for r in rows] == [
        {"id": "b", "cas": 7, "expiration": 0},
        {"id": "a", "cas": 7, "expiration": 0},
    ]


def test_the_reference_engine_has_no_cas() -> None:
    eng = LocalEngine()
    eng.create_keyspace("u")
    eng.execute("INSERT INTO u VALUES ('a', {'x': 1})")
    # MISSING: an object leaves the field out, a RAW projection gives no value at all.
    assert eng.query("SELECT META().cas AS c, META().id AS id FROM u") == [{"id": "a"}]
    assert eng.query("SELECT RAW META().cas IS MISSING FROM u") == [True]
