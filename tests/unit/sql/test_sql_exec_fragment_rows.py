"""The distributed row pipelines against the reference: documents split over several leaves
(each run through ``leaf_rows``), every leaf's output shipped through the row codec (as it
crosses an exchange), the root (``root_rows``) over them; the result must equal
``LocalEngine`` over all the documents, whatever the split."""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

import msgspec
import pytest

from shardex.core.expr.functions_date import with_statement_time
from shardex.core.keycodec_values import encode_value
from shardex.core.values import MISSING
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.fragment_rows import leaf_rows, mode_of, root_rows
from shardex.sql.exec.rows import decode_row, decode_rows, encode_row, pack_state, to_batches
from shardex.sql.local import LocalEngine
from shardex.sql.local_rows import eval_count
from shardex.sql.operators.aggregate import SumState
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.bind import META_KEY, bind_select
from tests.unit.sql.budgets import budget

KS = "t"


def _docs(n: int = 300) -> dict[str, Any]:
    rng = random.Random(3)
    out = {}
    for i in range(n):
        d: dict[str, Any] = {
            "g": rng.choice(["x", "y", "z", None]),
            "v": rng.choice([rng.randrange(50), rng.randrange(500) / 10, None, "s"]),
            "k": i,
        }
        if rng.random() < 0.8:
            d["a"] = rng.randrange(10)
        out[f"d{i:03d}"] = d
    return out


def _run(sql: str, docs: dict[str, Any], leaves: int, params: Any = None) -> list[Any]:
    b = bind_select(parse_statement(sql))
    mode = mode_of(b)
    limit = eval_count(b.limit, params, "LIMIT")
    offset = eval_count(b.offset, params, "OFFSET") or 0
    top = None if limit is None or b.grouped or b.distinct else offset + limit
    items = sorted(docs.items())
    random.Random(leaves).shuffle(items)
    inputs = []
    for i in range(leaves):
        part = items[i::leaves]
        scope = [{b.alias: doc, META_KEY: {"id": docid}} for docid, doc in part]
        out = leaf_rows(b, params, mode, top, budget(), scope)
        shipped = [r for batch in to_batches(out) for r in decode_rows(batch)]
        inputs.append(iter(shipped))
    return list(root_rows(b, params, mode, limit, offset, budget(), inputs))


QUERIES = [
    f"SELECT k, a FROM {KS} WHERE a > 4",
    f"SELECT RAW v FROM {KS} WHERE g = 'x'",
    f"SELECT g, COUNT(*) AS c, COUNT(a) AS ca, SUM(v) AS s, AVG(v) AS av, MIN(v) AS lo, "
    f"MAX(v) AS hi, COUNT(DISTINCT a) AS da, SUM(DISTINCT a) AS sa FROM {KS} GROUP BY g",
    f"SELECT a, COUNT(*) AS c FROM {KS} GROUP BY a HAVING COUNT(*) > 20 ORDER BY a",
    f"SELECT COUNT(*) AS c, SUM(v) AS s FROM {KS} WHERE k < 0",
    f"SELECT k FROM {KS} ORDER BY v DESC, k LIMIT 12 OFFSET 3",
    f"SELECT k, v AS w FROM {KS} WHERE a IS NOT MISSING ORDER BY w NULLS LAST, k",
    f"SELECT DISTINCT g FROM {KS}",
    f"SELECT DISTINCT RAW a FROM {KS} ORDER BY a",
    f"SELECT k FROM {KS} ORDER BY k LIMIT 0",
    f"SELECT g, a, COUNT(*) AS c FROM {KS} GROUP BY g, a ORDER BY c DESC, g, a LIMIT 5",
    f"SELECT g, MEDIAN(v) AS md, MEDIAN(DISTINCT a) AS mda, COUNTN(v) AS n, "
    f"COUNTN(DISTINCT v) AS dn, VARIANCE(v) AS va, VAR_POP(v) AS vp, VARIANCE_SAMP(a) AS vs, "
    f"STDDEV(v) AS sd, STDDEV_POP(DISTINCT v) AS sdp, STDDEV_SAMP(k) AS sds FROM {KS} GROUP BY g",
    f"SELECT MEDIAN(k) AS md, VARIANCE_POP(v) AS vp, STDDEV(DISTINCT a) AS sd FROM {KS}",
    f"SELECT k, ARRAY_RANGE(0, a)[1:] AS r, OBJECT_NAMES(self) AS n, BITAND(k, 7) AS b, "
    f"HASHBYTES(v, 'md5') AS h, TOKENS(g) AS t, OBJECT_PAIRS(SELF)[0] AS p FROM {KS} "
    f"WHERE a > 7",
]


def _canon(v: Any) -> bytes:
    return msgspec.json.encode(v, order="sorted")


@pytest.mark.parametrize("sql", QUERIES)
@pytest.mark.parametrize("leaves", [1, 3])
def test_distributed_pipeline_equals_the_reference(sql: str, leaves: int) -> None:
    docs = _docs()
    ref = LocalEngine()
    ref.create_keyspace(KS)
    ref.keyspaces[KS].update(docs)
    want = ref.query(sql)
    got = _run(sql, docs, leaves)
    if "ORDER BY" in sql:
        assert got == want
    else:
        assert sorted(map(_canon, got)) == sorted(map(_canon, want))


def test_every_leaf_reads_the_one_statement_time_of_the_params() -> None:
    # The receiving node stamps the params; they reach every leaf and the root unchanged.
    params = with_statement_time(None, 1463284740000 * 10**6)
    rows = _run(f"SELECT k, NOW_MILLIS() AS n, NOW_UTC() AS s FROM {KS}", _docs(), 3, params)
    assert len(rows) == 300
    assert {(r["n"], r["s"]) for r in rows} == {(1463284740000, "2016-05-15T03:59:00Z")}
    grouped = _run(f"SELECT g, MAX(NOW_MILLIS()) AS n FROM {KS} GROUP BY g", _docs(), 3, params)
    assert {r["n"] for r in grouped} == {1463284740000}


@pytest.mark.parametrize("leaves", [1, 3, 7])
def test_array_agg_is_in_collation_order_whatever_the_split(leaves: int) -> None:
    # Values equal under collation (44 and 44.0) may come in either order, so rows compare
    # under SQL++ equality (the key codec's identity), not as JSON text.
    sql = f"SELECT g, ARRAY_AGG(v) AS vs, ARRAY_AGG(DISTINCT a) AS das FROM {KS} GROUP BY g"
    docs = _docs()
    ref = LocalEngine()
    ref.create_keyspace(KS)
    ref.keyspaces[KS].update(docs)
    want = sorted(map(encode_value, ref.query(sql)))
    assert sorted(map(encode_value, _run(sql, docs, leaves))) == want
    for row in ref.query(sql):
        keys = [encode_value(v) for v in row["vs"]]
        assert keys == sorted(keys)


def test_unsorted_limit_is_pushed_to_the_leaves() -> None:
    b = bind_select(parse_statement(f"SELECT k FROM {KS} WHERE a > 1"))
    scope = [{KS: {"a": 5, "k": i}, META_KEY: {"id": str(i)}} for i in range(100)]
    out = list(leaf_rows(b, None, "rows", 7, budget(), iter(scope)))
    assert out == [{"k": i} for i in range(7)]


def test_blocking_operators_without_spilling_stop_at_the_budget() -> None:
    b = bind_select(parse_statement(f"SELECT k FROM {KS} ORDER BY k"))
    scope = [{KS: {"k": i, "pad": "x" * 100}, META_KEY: {"id": str(i)}} for i in range(100)]
    with pytest.raises(ShardexError) as info:
        list(leaf_rows(b, None, "sort", None, budget(4096, spill=False), iter(scope)))
    e = info.value
    assert e.code is ErrorCode.QUERY_MEMORY_LIMIT
    assert e.details["limit"] == 4096 and e.details["operator"] == "ORDER BY"
    assert e.details["value"] > 4096 and "memory_quota" in e.details["hint"]
    # A top-N holds about its N rows only: within the same budget.
    assert len(list(leaf_rows(b, None, "sort", 5, budget(4096, spill=False), iter(scope)))) == 5


def test_row_codec_keeps_missing_sum_states_and_big_integers() -> None:
    s = SumState(ints=2**70, floats=Fraction(1, 3), count=4, saw_float=True)
    row = [[MISSING, None, 1, 1.0], [pack_state(s), MISSING], {"big": -(2**80), "l": [True]}]
    back = decode_row(encode_row(row))
    assert back[0][0] is MISSING and back[0][1] is None
    assert type(back[0][2]) is int and type(back[0][3]) is float
    assert back[1][0] == s and back[1][1] is MISSING
    assert back[2] == {"big": -(2**80), "l": [True]}


def test_batches_are_cut_by_rows() -> None:
    batches = list(to_batches({"i": i} for i in range(1300)))
    assert [b.num_rows for b in batches] == [512, 512, 276]
    assert [r["i"] for b in batches for r in decode_rows(b)] == list(range(1300))


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT g, COUNT(*) AS n, SUM(v) AS s, AVG(v) AS av, MIN(v) AS lo, MAX(a) AS hi,"
        f" COUNT(DISTINCT a) AS da FROM {KS} WHERE a IS NOT MISSING GROUP BY g",
        f"SELECT g, ARRAY_AGG(a) AS xs, COUNT(v) AS nv FROM {KS} GROUP BY g",
        f"SELECT COUNT(*) AS n, SUM(a) AS s FROM {KS} WHERE v IS NOT NULL",
    ],
)
def test_a_leaf_groups_runs_of_one_covering_key_as_their_rows(sql: str) -> None:
    """Consecutive scope rows carrying the same document object (a covering scan's entries
    of one key, ``EntryDecoder``) are grouped as one run: the leaf's partial groups equal
    those of the same rows each with a document of its own."""
    b = bind_select(parse_statement(sql))
    rng = random.Random(5)
    shared: list[Any] = []
    copied: list[Any] = []
    no_meta: dict[str, Any] = {}
    for key in range(40):
        doc = {"g": rng.choice(["x", "y", None]), "a": key % 7, "v": rng.choice([1, 2.5, None])}
        if key % 5 == 0:
            del doc["a"]
        for _ in range(rng.randrange(1, 6)):  # the run: entries of one key
            shared.append({b.alias: doc, META_KEY: no_meta})
            copied.append({b.alias: dict(doc), META_KEY: {}})

    def partials(rows: list[Any]) -> list[Any]:
        out = leaf_rows(b, None, "group", None, budget(), rows)
        return [encode_row(r) for r in out]  # what crosses the exchange, groups in order

    assert partials(shared) == partials(copied)


@pytest.mark.parametrize("leaves", [1, 3])
def test_a_projection_alias_named_like_the_from_alias_shadows_no_document_field(
    leaves: int,
) -> None:
    """``ORDER BY k`` is the document's ``k`` (``d.k``) even when the projection has an alias
    ``d`` too; a bare ``d`` in ORDER BY is that alias (projection aliases come first)."""
    docs = _docs()
    ref = LocalEngine()
    ref.create_keyspace(KS)
    ref.keyspaces[KS].update(docs)
    by_k = f"SELECT k, v AS d FROM {KS} AS d ORDER BY k DESC"
    want = ref.query(by_k)
    assert [r["k"] for r in want] == sorted((d["k"] for d in docs.values()), reverse=True)
    assert _run(by_k, docs, leaves) == want
    by_alias = f"SELECT k, a AS d FROM {KS} AS d WHERE a IS NOT MISSING ORDER BY d, k"
    want = ref.query(by_alias)
    keys = [(r["d"], r["k"]) for r in want]
    assert keys == sorted(keys)
    assert _run(by_alias, docs, leaves) == want
