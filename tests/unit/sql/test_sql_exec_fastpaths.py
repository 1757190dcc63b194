"""The SQL execution's fast paths and their switches: leaves streaming in index order when it
satisfies ORDER BY (no local sort, stopping at the limit, reading the index lazily), the
planner rules that allow it (``ORDER BY key, META().id``; ``IS NOT MISSING``/``IS VALUED``
as sargable), the statement cache, the tuning switches and the bounded exchange meter."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import pytest

from shardex.api.query_ids import QueryId
from shardex.core.expr import parse_expression
from shardex.core.keycodec import decode_entry, encode_entry
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.analyze import doc_order, key_lookup, key_route
from shardex.sql.exec.entries import EntryDecoder
from shardex.sql.exec.fragment_rows import leaf_rows, mode_of, root_rows
from shardex.sql.exec.fragments import MIN_SCAN_BLOCK_ROWS, SCAN_BLOCK_ROWS, scan_block_rows
from shardex.sql.exec.plan import bind_statement, plan_select
from shardex.sql.exec.rows import decode_rows, to_batches
from shardex.sql.exec.statements import bound_statement, parsed
from shardex.sql.exec.tuning import SWITCHES, BoundedMeter, check_tuning
from shardex.sql.local import LocalEngine
from shardex.sql.planner.choose import choose_index, covered_document
from shardex.sql.planner.key_ranges import key_spans
from shardex.sql.syntax.bind import META_KEY
from tests.unit.sql.budgets import budget
from tests.unit.sql.test_sql_exec_plan import BY_AGE, BY_CITY, KS, MEMBERS, PRIMARY, STATE

RANGE_SQL = f"SELECT META().id AS id, age FROM {KS} WHERE city = $1 ORDER BY age, META().id LIMIT 5"


def _plan(sql: str, params: Any = None, tuning: dict[str, bool] | None = None):
    b = bind_statement(sql, False)
    return plan_select(b, params, state=STATE, members=MEMBERS, tuning=tuning)


# --- planning -------------------------------------------------------------------------------


def test_index_order_replaces_the_leaf_sort_when_it_satisfies_order_by() -> None:
    p = _plan(RANGE_SQL, ["rome"])
    assert p.record is BY_CITY and p.mode == "sort" and p.ordered
    qp = p.query_plan(RANGE_SQL, False, "m9", None, 100)
    leaf = qp.fragments[1]
    assert leaf.args["ordered"] is True and leaf.args["top"] == 5
    assert leaf.args["tuning"] == dict.fromkeys(SWITCHES, True)
    does = p.explain()["distributed"]["fragments"][1]["does"]
    assert "IndexOrder" in does and "LocalSort" not in does
    assert p.explain()["distributed"]["index"]["index_order"] is True
    # The switch off: the leaves sort as before, with the same plan otherwise.
    off = _plan(RANGE_SQL, ["rome"], tuning={"index_order": False})
    assert not off.ordered and off.record is BY_CITY
    assert "LocalSort" in off.explain()["distributed"]["fragments"][1]["does"]


@pytest.mark.parametrize(
    "order",
    [
        "age DESC",  # against the key's direction
        "META().id, age",  # docid first: the index is not in that order
        "age NULLS LAST",  # the index puts NULL/MISSING first for ASC
        "age, META().id DESC",
        "age, name",  # name is not a key part: ties on age are in docid order, not name
        "age, id",  # a projection alias: not planned against the index order at all
    ],
)
def test_orders_the_index_does_not_give_keep_the_sort(order: str) -> None:
    p = _plan(f"SELECT META().id AS id, age FROM {KS} WHERE city = 'rome' ORDER BY {order}")
    assert p.record is BY_CITY and not p.ordered


def test_distinct_keeps_the_sort() -> None:
    p = _plan(f"SELECT DISTINCT age FROM {KS} WHERE city = 'rome' ORDER BY age LIMIT 3")
    assert p.record is BY_CITY and not p.ordered


def test_trailing_docid_is_satisfied_only_once_every_key_part_is_ordered() -> None:
    def ordered(where: str, order: str) -> bool:
        b = bind_statement(f"SELECT age FROM {KS} WHERE {where} ORDER BY {order}", False)
        keys = [BY_CITY.definition]
        return choose_index(
            keys,
            parse_expression(where),
            keyspace=KS,
            read_paths=None,
            order_by=doc_order(b),
        ).ordered

    assert ordered("city = 'x'", "age, META().id")
    assert ordered("city = 'x' AND age = 3", "META().id")  # both key parts pinned
    assert ordered("city > 'x'", "city, age, META().id, age")  # later terms order nothing
    assert not ordered("city > 'x'", "city, META().id")  # age is not ordered yet


def test_is_not_missing_and_is_valued_make_the_leading_key_sargable() -> None:
    defs = [PRIMARY.definition, BY_CITY.definition, BY_AGE.definition]

    def choose(where: str) -> Any:
        return choose_index(defs, parse_expression(where), keyspace=KS, read_paths=None)

    full = choose("city IS NOT MISSING")
    assert full.definition.name == "by_city"
    assert key_spans(full.per_key, [False, False], None) == [
        {"low": None, "high": None, "inclusion": "both"}
    ]
    valued = choose("city IS VALUED")
    assert valued.definition.name == "by_city"
    (span,) = key_spans(valued.per_key, [False, False], None)
    assert span["low"] == [None] and span["inclusion"] in ("high", "neither")
    # IS MISSING cannot use an index (those documents have no entry): the primary index.
    assert choose("city IS MISSING").definition.name == "#primary"
    assert choose("city IS NOT VALUED").definition.name == "#primary"


def test_group_by_every_document_reads_a_covering_index() -> None:
    p = _plan(
        f"SELECT city, COUNT(*) AS n, AVG(age) AS a FROM {KS} WHERE city IS NOT MISSING "
        "GROUP BY city"
    )
    assert p.record is BY_CITY and p.choice is not None and p.choice.covering
    assert p.mode == "group" and len(p.leaves) == 3


# --- leaves in index order -----------------------------------------------------------------


def _docs(n: int = 240) -> dict[str, Any]:
    rng = random.Random(9)
    return {f"d{i:03d}": {"v": rng.randrange(40), "k": i, "g": rng.choice("xy")} for i in range(n)}


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT META().id AS id, v FROM {KS} ORDER BY v, META().id LIMIT 12 OFFSET 3",
        f"SELECT RAW k FROM {KS} WHERE g = 'x' ORDER BY v, META().id LIMIT 9",
        f"SELECT k FROM {KS} WHERE k > 30 ORDER BY v, META().id",
    ],
)
def test_presorted_leaves_merge_to_the_reference(sql: str) -> None:
    docs = _docs()
    b = bind_statement(sql, False)
    limit = 12 if "OFFSET" in sql else 9 if "LIMIT 9" in sql else None
    offset = 3 if "OFFSET" in sql else 0
    top = None if limit is None else limit + offset
    # Each leaf's entries in index order: (v, docid), as an index on v would give them.
    items = sorted(docs.items(), key=lambda kv: (kv[1]["v"], kv[0]))
    inputs = []
    for i in range(3):
        scope = [{b.alias: d, META_KEY: {"id": k}} for k, d in items if int(k[1:]) % 3 == i]
        out = leaf_rows(b, None, mode_of(b), top, budget(), scope, presorted=True)
        inputs.append(iter([r for batch in to_batches(out) for r in decode_rows(batch)]))
    got = list(root_rows(b, None, "sort", limit, offset, budget(), inputs))
    ref = LocalEngine()
    ref.create_keyspace(KS)
    ref.keyspaces[KS].update(docs)
    assert got == ref.query(sql)


def test_presorted_leaf_pulls_only_the_rows_it_needs() -> None:
    b = bind_statement(RANGE_SQL.replace("$1", "'rome'"), False)
    pulled = itertools.count()

    def scope() -> Iterator[dict[str, Any]]:
        for i in range(10_000):
            next(pulled)
            yield {b.alias: {"city": "rome", "age": i}, META_KEY: {"id": f"d{i}"}}

    # A budget of 1 row: a sort would fail at once; streaming never holds rows.
    out = list(leaf_rows(b, None, "sort", 5, budget(), scope(), presorted=True))
    assert [v["age"] for _, v in out] == [0, 1, 2, 3, 4]
    assert next(pulled) == 5  # the sixth document was never read


def test_scan_blocks_follow_the_limit() -> None:
    assert scan_block_rows(None) == SCAN_BLOCK_ROWS
    assert scan_block_rows(20) == 20
    assert scan_block_rows(1) == MIN_SCAN_BLOCK_ROWS
    assert scan_block_rows(10**6) == SCAN_BLOCK_ROWS


# --- statement cache, switches, meter --------------------------------------------------------


def test_statement_cache_returns_one_bound_select_per_text() -> None:
    sql = f"SELECT age FROM {KS} WHERE city = $1"
    assert bound_statement(sql, False) is bound_statement(sql, False)
    fresh = bound_statement(sql, False, cached=False)
    assert fresh == bound_statement(sql, False) and fresh is not bound_statement(sql, False)
    assert parsed(sql) is parsed(sql)
    for _ in range(2):  # a bad statement is not cached: the error each time
        with pytest.raises(ShardexError) as info:
            bound_statement(f"SELECT FROM {KS}", False)
        assert info.value.code == ErrorCode.SQL_SYNTAX


def test_tuning_switches_default_on_and_reject_unknown_names() -> None:
    assert check_tuning(None) == dict.fromkeys(SWITCHES, True)
    assert check_tuning({"get_many": False})["get_many"] is False
    with pytest.raises(ShardexError) as info:
        check_tuning({"go_fast": True})
    assert info.value.code == ErrorCode.BAD_REQUEST and info.value.details["value"] == "go_fast"
    with pytest.raises(ShardexError) as info:
        check_tuning({"plan_cache": 1})  # type: ignore[dict-item]
    assert info.value.code == ErrorCode.BAD_REQUEST


def test_bounded_meter_keeps_the_last_queries_streams() -> None:
    meter = BoundedMeter(limit=2)
    qs = [QueryId("m1", f"{i}-x") for i in range(3)]
    for q in qs:
        meter.on_sent((q, 1, "m2"), 4096, 100, 100)
        meter.on_sent((q, 2, "m3"), 4096, 50, 50)
        meter.on_consumed((q, 1, "m2"), 4096, 100)
    assert {k[0] for k in meter.streams} == set(qs[1:])  # the oldest query dropped
    assert meter.of_query(str(qs[0])) == []
    found = dict(meter.of_query(str(qs[2])))
    assert found[(qs[2], 1, "m2")].sent == 100 and found[(qs[2], 1, "m2")].consumed == 100
    assert found[(qs[2], 2, "m3")].max_sender_bound == 50


@pytest.mark.parametrize("desc", [[False, False], [False, True]])
def test_entry_decoder_reuses_keys_and_equals_decode_entry(desc: list[bool]) -> None:
    rng = random.Random(4)
    keys = [
        [rng.choice(["a", "b\x00c", None]), rng.choice([1, 2.5, "x\x02y", [3]])] for _ in range(9)
    ]
    entries = sorted(encode_entry(keys[rng.randrange(9)], f"doc\x02{i}", desc) for i in range(300))
    paths = [("city",), ("age",)]
    decoder = EntryDecoder(desc, paths)
    want = [decode_entry(e, desc) for e in entries]
    assert decoder.docids(entries[:150]) == [docid for _, docid in want[:150]]
    rows = decoder.covered_rows(entries[150:], "u", meta=True)
    assert [r[META_KEY]["id"] for r in rows] == [docid for _, docid in want[150:]]
    assert [r["u"] for r in rows] == [covered_document(paths, k) for k, _ in want[150:]]
    assert decoder.decoded_keys <= len({tuple(map(repr, k)) for k, _ in want}) + 1
    # Rows of one key share its rebuilt document; without META() no docid is decoded.
    bare = decoder.covered_rows(entries, "u", meta=False)
    assert all(r[META_KEY] == {} for r in bare)
    same = [i for i in range(1, len(want)) if want[i][0] == want[i - 1][0]]
    assert same and all(bare[i]["u"] is bare[i - 1]["u"] for i in same)


def testconcatenated_cells_skip_the_offset_and_stop_at_the_limit() -> None:
    """A root in ``rows`` mode passes its leaves' cells on as they came: sources one after
    another, ``offset`` skipped across chunk and source borders, ``limit`` passed, and a
    source left half-read at the limit is closed."""
    import asyncio

    from shardex.sql.exec.fragments import concatenated

    closed: list[int] = []

    def source(i: int, chunks: list[list[bytes]]) -> Any:
        async def gen() -> Any:
            try:
                for chunk in chunks:
                    yield chunk
            finally:
                closed.append(i)

        return gen()

    def run(offset: int, limit: int | None) -> list[bytes]:
        closed.clear()
        srcs = [
            source(0, [[b"a", b"b"], [b"c"]]),
            source(1, [[b"d", b"e"], [b"f"]]),
            source(2, [[b"g"]]),
        ]

        async def collect() -> list[bytes]:
            return [c async for chunk in concatenated(srcs, offset, limit) for c in chunk]

        return asyncio.run(collect())

    every = [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]
    assert run(0, None) == every and closed == [0, 1, 2]
    assert run(2, None) == every[2:]
    assert run(3, 2) == [b"d", b"e"]
    assert closed == [0, 1]  # source 1 stopped half-read; source 2 never started
    assert run(1, 3) == [b"b", b"c", b"d"]
    assert run(0, 0) == []
    assert run(10, None) == []


@pytest.mark.parametrize(
    ("sql", "route"),
    [
        (f"SELECT name FROM {KS} WHERE META().id = $1", (KS, "1")),
        (f"SELECT name FROM {KS} WHERE age > 3 AND $k = META().id", (KS, "k")),
        (f"SELECT * FROM {KS} USE KEYS $ids", (KS, "ids")),
        (f"SELECT name FROM {KS} WHERE META().id = 'a'", None),  # no parameter to route by
        (f"SELECT name FROM {KS} WHERE META().id IN [$1, $2]", None),  # two keys
        (f"SELECT name FROM {KS} USE INDEX (by_age) WHERE META().id = $1", None),
        (f"SELECT name FROM {KS} WHERE age = $1", None),
        ("SELECT $1 AS one", None),
    ],
)
def test_key_route_names_the_parameter_a_key_lookup_reads(sql: str, route: Any) -> None:
    """The rule both a node's reply and a client's first sight of a text apply: a key
    lookup of one parameter key goes to the key's owner."""
    b = bound_statement(sql, False)
    assert key_route(b, key_lookup(b)) == route
