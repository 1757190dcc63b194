"""``META(b).cas`` and ``META(b).expiration`` of a joined keyspace (and of the FROM alias
in a join statement) in the distributed plan: the side statements carry them when the
statement reads them, so their leaves fetch them from the documents' owners, and a lookup
join fetches its documents with their META(); statements that do not read them fetch
nothing more."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from shardex.sql.exec.join_plan import join_sides, side_meta
from shardex.sql.exec.join_run import run_join
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.plan import PhysicalPlan
from shardex.sql.exec.rows import decode_row, encode_row
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.bind import bind_select
from tests.unit.sql.test_sql_exec_joins import _state

MiB = 1 << 20
ORDERS = {"o1": {"cid": "c1", "b": 1}, "o2": {"cid": "c2", "b": 2}, "o3": {"cid": "cx", "b": 1}}
CUSTOMERS = {"c1": {"b": 1}, "c2": {"b": 2}}
CAS = {"c1": 111, "c2": 222, "o1": 1, "o2": 2, "o3": 3}
EXPIRY = {"c1": 0, "c2": 1_900_000_000, "o1": 0, "o2": 0, "o3": 5}


def _sides(sql: str) -> Any:
    return join_sides(bind_select(parse_statement(sql)), _state())  # type: ignore[arg-type]


def test_side_statements_carry_the_fetched_meta_only_when_read() -> None:
    s = _sides("SELECT META(c).cas AS x FROM o JOIN c ON c.b = o.b")
    # Each side's document cut to the fields the statement reads (decision 0142).
    assert s.gathered[0].startswith(
        'SELECT RAW [META(c).id, {"b": c.b}, META(c).cas, META(c).expiration]'
    )
    assert s.from_sql.startswith('SELECT RAW [META(o).id, {"b": o.b}] FROM')
    s = _sides("SELECT o.b FROM o JOIN c ON c.b = o.b WHERE META(o).expiration > 0")
    assert s.from_sql.startswith(
        'SELECT RAW [META(o).id, {"b": o.b}, META(o).cas, META(o).expiration]'
    )
    assert s.gathered[0].startswith('SELECT RAW [META(c).id, {"b": c.b}] FROM')
    s = _sides("SELECT 1 AS x FROM o JOIN c ON c.b = o.b AND META(c).cas > 0")  # ON reads it
    assert "META(c).cas" in s.gathered[0].split(" FROM ")[0]
    s = _sides("SELECT META(c).id AS x FROM o JOIN c ON KEYS o.cid")
    assert not s.fetched_meta
    assert _sides("SELECT META(c).cas AS x FROM o JOIN c ON KEYS o.cid").fetched_meta == {0}
    assert side_meta(["d", {}]) == {"id": "d"}
    assert side_meta(["d", {}, 7, 0]) == {"id": "d", "cas": 7, "expiration": 0}


class _Owners:
    """``DocumentAccess`` with CAS and expiry, as the documents' owners report them."""

    def __init__(self) -> None:
        self.meta_reads = 0

    async def get_many(self, keyspace: str, ids: list[str]) -> list[tuple[str, Any]]:
        docs = CUSTOMERS if keyspace == "c" else ORDERS
        return [(i, docs[i]) for i in ids if i in docs]

    async def get_many_meta(self, keyspace: str, ids: list[str]) -> list[Any]:
        self.meta_reads += 1
        found = await self.get_many(keyspace, ids)
        return [(i, d, {"id": i, "cas": CAS[i], "expiration": EXPIRY[i]}) for i, d in found]

    def get_many_now(self, keyspace: str, ids: list[str]) -> None:
        return None


def _run(sql: str, side_rows: Any) -> tuple[list[Any], _Owners]:
    b = bind_select(parse_statement(sql))  # type: ignore[arg-type]
    plan = PhysicalPlan(b, "join", "join", query_id="q")
    plan.join = join_sides(b, _state())
    owners = _Owners()

    async def start(side: str, params: Any) -> AsyncIterator[list[bytes]]:
        rows = side_rows(side)

        async def chunks() -> AsyncIterator[list[bytes]]:
            yield [encode_row(r) for r in rows]

        return chunks()

    async def run() -> list[Any]:
        out: list[Any] = []
        async for cells in run_join(plan, None, start, owners, NodeMemory(), 64 * MiB, False):  # type: ignore[arg-type, attr-defined]
            out += [decode_row(c) for c in cells]
        return out

    return asyncio.run(run()), owners


def _leaf_rows(side: str) -> list[Any]:
    """What a side statement's leaves return: the fetched META() fields when it asks."""
    docs = CUSTOMERS if "FROM c " in side else ORDERS
    head = side.split(" FROM ")[0]
    if ".cas" in head:
        return [[i, d, CAS[i], EXPIRY[i]] for i, d in docs.items()]
    return [[i, d] for i, d in docs.items()]


def test_a_gathered_side_and_the_from_side_give_their_cas_and_expiration() -> None:
    rows, _ = _run(
        "SELECT META(o).id AS o, META(o).cas AS oc, META(c).cas AS cc, "
        "META(c).expiration AS ce FROM o JOIN c ON c.b = o.b",
        _leaf_rows,
    )
    assert sorted(rows, key=lambda r: r["o"]) == [
        {"o": "o1", "oc": 1, "cc": 111, "ce": 0},
        {"o": "o2", "oc": 2, "cc": 222, "ce": 1_900_000_000},
        {"o": "o3", "oc": 3, "cc": 111, "ce": 0},
    ]


def test_a_lookup_join_fetches_meta_only_when_read() -> None:
    sql = "SELECT META(o).id AS o, META(c).cas AS cc FROM o LEFT JOIN c ON KEYS o.cid"
    rows, owners = _run(sql, _leaf_rows)
    assert sorted(rows, key=lambda r: r["o"]) == [
        {"o": "o1", "cc": 111},
        {"o": "o2", "cc": 222},
        {"o": "o3"},  # no customer: MISSING
    ]
    assert owners.meta_reads == 1
    rows, owners = _run("SELECT META(c).id AS c FROM o JOIN c ON KEYS o.cid", _leaf_rows)
    assert len(rows) == 2 and owners.meta_reads == 0
