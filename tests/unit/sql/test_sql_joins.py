"""JOIN and NEST: their syntax (good forms and clear SQL_SYNTAX errors), binding, the join
method chosen (``planner.joins``), the join operators and ``LocalEngine``'s results for
every form (lookup, index and ANSI joins; INNER, LEFT and RIGHT; NEST), and the privilege
each joined keyspace needs."""

from __future__ import annotations

from typing import Any

import pytest

from shardex.api.privileges import AuthFailed, Principal
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.statement_checks import check_statement
from shardex.sql.local import LocalEngine
from shardex.sql.operators.join import JoinSpec, hash_join, index_join, nl_join, piece
from shardex.sql.planner.joins import plan_join
from shardex.sql.syntax import SelectStmt, parse_statement
from shardex.sql.syntax.bind import bind_select


def sel(text: str) -> SelectStmt:
    stmt = parse_statement(text)
    assert isinstance(stmt, SelectStmt)
    return stmt


# -- syntax ----------------------------------------------------------------------------------


def test_the_three_forms_and_their_prefixes() -> None:
    s = sel("SELECT * FROM o JOIN c ON KEYS o.cid")
    (j,) = s.joins
    assert (j.kind, j.nest, j.alias, j.on_keys.to_text()) == ("inner", False, "c", "o.cid")  # type: ignore[union-attr]
    s = sel("SELECT * FROM c AS x LEFT OUTER NEST o y ON KEY y.cid FOR x")
    (j,) = s.joins
    assert (j.kind, j.nest, j.alias, j.for_alias) == ("left", True, "y", "x")
    assert j.on_key is not None and j.on_key.to_text() == "y.cid"
    s = sel("SELECT * FROM a RIGHT OUTER JOIN b USE HASH(BUILD) ON a.k = b.k")
    assert (s.joins[0].kind, s.joins[0].hint) == ("right", "hash_build")
    s = sel("SELECT * FROM a INNER JOIN b USE INDEX (ix) USE NL ON a.k = b.k")
    assert (s.joins[0].hint, s.joins[0].target.use_index) == ("nl", ("ix",))
    assert sel("SELECT * FROM a JOIN b USE HASH(probe) ON a.k = b.k").joins[0].hint == "hash_probe"


def test_joins_and_unnests_keep_their_order() -> None:
    s = sel(
        "SELECT * FROM o UNNEST o.items AS i JOIN c ON KEYS i.cid "
        "LEFT UNNEST c.tags t NEST d ON KEYS i.d"
    )
    assert [u.alias for u in s.unnests] == ["i", "t"]
    assert [(j.alias, j.position) for j in s.joins] == [("c", 1), ("d", 2)]
    assert bind_select(s).aliases == ("o", "i", "c", "t", "d")
    # LEFT, RIGHT and INNER stay usable as names where no join follows.
    assert sel("SELECT `left`.x FROM ks AS `left`").from_.alias == "left"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "token", "words"),
    [
        ("SELECT * FROM a JOIN b", "", "needs an ON clause"),
        ("SELECT * FROM a JOIN b WHERE a.x = 1", "WHERE", "needs an ON clause"),
        ("SELECT * FROM a JOIN b USE HASH(x) ON a.k = b.k", "x", "BUILD or PROBE"),
        ("SELECT * FROM a RIGHT NEST b ON a.k = b.k", "RIGHT", "no RIGHT form"),
        ("SELECT * FROM a JOIN c ON KEYS a.c RIGHT JOIN b ON a.k = b.k", "RIGHT", "first term"),
        ("SELECT * FROM a RIGHT JOIN b ON KEYS a.b", "RIGHT", "needs an ON condition"),
        ("SELECT * FROM a JOIN b USE NL ON KEYS a.b", "NL", "ANSI joins"),
        ("SELECT * FROM a JOIN b USE KEYS 'x' ON a.k = b.k", "KEYS", "takes no USE KEYS"),
        ("SELECT * FROM a LEFT OUTER b", "b", "JOIN, NEST or UNNEST"),
        ("SELECT * FROM a JOIN b ON KEY b.x", "", "FOR"),
        ("SELECT * FROM a JOIN ON a.k = 1", "ON", "keyspace"),
        ("SELECT * FROM a RIGHT UNNEST a.x", "RIGHT", "not to UNNEST"),
    ],
)
def test_malformed_joins_are_sql_syntax_errors(text: str, token: str, words: str) -> None:
    with pytest.raises(ShardexError) as e:
        parse_statement(text)
    assert e.value.code is ErrorCode.SQL_SYNTAX
    assert e.value.details["token"] == token
    assert words in e.value.message + e.value.details.get("expected", "")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("SELECT * FROM a JOIN a ON KEYS a.x", "already bound"),
        ("SELECT * FROM a JOIN b ON KEY b.x FOR z", "no keyspace alias"),
        ("SELECT * FROM a JOIN b ON KEY a.x FOR a", "must read"),
        ("SELECT * FROM [1, 2] AS a RIGHT JOIN b ON b.k = a", "keyspace in FROM"),
        ("SELECT * FROM a JOIN b ON COUNT(b.x) = 1", "not allowed"),
    ],
)
def test_joins_that_cannot_bind(text: str, words: str) -> None:
    with pytest.raises(ShardexError) as e:
        bind_select(sel(text))
    assert e.value.code is ErrorCode.BAD_REQUEST
    assert words in e.value.message


# -- planning ---------------------------------------------------------------------------------


def _plan(text: str, indexes: list[tuple[str, str]] | None = None) -> Any:
    b = bind_select(sel(text))
    return plan_join(b.joins[0], indexes or [])


def test_methods() -> None:
    assert _plan("SELECT * FROM o JOIN c ON KEYS o.cid").method == "keys"
    p = _plan("SELECT * FROM o JOIN c ON c.k = o.k + 1 AND c.x > 2")
    assert (p.method, p.build) == ("hash", "inner")
    assert [
        (a.to_text(), b.to_text()) for a, b in zip(p.outer_keys, p.inner_keys, strict=True)
    ] == [("o.k + 1", "c.k")]
    p = _plan("SELECT * FROM o JOIN c ON c.k = o.k", [("ix", "k")])
    assert (p.method, p.index) == ("index_nl", "ix")
    # The index's key must be the inner side's join key.
    assert _plan("SELECT * FROM o JOIN c ON c.k = o.k", [("ix", "x")]).method == "hash"
    # An index join is ``inner path = META(outer).id``: served by an index on the path.
    p = _plan("SELECT * FROM c JOIN o ON KEY o.cid FOR c", [("by_cid", "cid")])
    assert (p.method, p.index) == ("index_nl", "by_cid")
    assert _plan("SELECT * FROM o JOIN c ON c.k < o.k").method == "nl"


def test_hints() -> None:
    with_ix = [("ix", "k")]
    p = _plan("SELECT * FROM o JOIN c USE HASH(BUILD) ON c.k = o.k", with_ix)
    assert (p.method, p.build) == ("hash", "inner")
    p = _plan("SELECT * FROM o JOIN c USE HASH(PROBE) ON c.k = o.k", with_ix)
    assert (p.method, p.build) == ("hash", "outer")
    assert _plan("SELECT * FROM o JOIN c USE NL ON c.k = o.k", with_ix).method == "index_nl"
    p = _plan("SELECT * FROM o JOIN c USE NL ON c.k = o.k")
    assert p.method == "nl" and "no index" in p.note
    p = _plan("SELECT * FROM o JOIN c USE HASH(BUILD) ON c.k < o.k")
    assert p.method == "nl" and "hash join cannot" in p.note
    p = _plan("SELECT * FROM o RIGHT JOIN c ON c.k = o.k")
    assert (p.method, p.build) == ("hash", "outer")


# -- operators ----------------------------------------------------------------------------------


def test_every_method_gives_the_same_rows() -> None:
    left = [{"o": {"k": k, "x": x}} for k, x in [(1, 0), (2, 5), (1.0, 9), (None, 1), (3, 2)]]
    inner_docs = [("c1", {"k": 1, "y": 4}), ("c2", {"k": 1, "y": 8}), ("c3", {"k": 3})]
    inner_docs += [("c4", {"k": None}), ("c5", {})]
    for kind in ("inner", "left"):
        for nest in (False, True):

            def run(
                method: str, build_inner: bool = True, kind: str = kind, nest: bool = nest
            ) -> list[Any]:
                spec = JoinSpec(
                    "c",
                    "\x00meta.c",
                    kind,
                    nest,
                    # SQL's =: NULL and MISSING equal nothing.
                    on=lambda r: (
                        r["c"].get("k") is not None
                        and r["c"].get("k") == r["o"]["k"]
                        and r["o"]["x"] < 9
                    ),
                    outer_key=lambda r: [r["o"]["k"]],
                    inner_key=lambda r: [r["c"].get("k")],
                    build_inner=build_inner,
                )
                pieces = [piece(spec, i, d) for i, d in inner_docs]
                if method == "hash":
                    return list(hash_join(iter(left), spec, iter(pieces)))
                if method == "index":
                    return list(
                        index_join(
                            iter(left),
                            spec,
                            lambda vs: [p for p in pieces if p["c"].get("k") in vs],
                            batch=2,
                        )
                    )
                return list(nl_join(iter(left), spec, pieces))

            want = run("nl")
            assert run("hash") == want
            assert run("hash", build_inner=False) == want
            assert run("index") == want
            n_matched = 3  # k=1 twice (x=0) + k=3 once; 1.0 is excluded by x < 9
            if nest:
                assert len(want) == (2 if kind == "inner" else 5)
                if kind == "left":
                    assert want[3]["c"] == []
            else:
                assert len(want) == (n_matched if kind == "inner" else n_matched + 3)


# -- LocalEngine ---------------------------------------------------------------------------------


@pytest.fixture()
def eng() -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("o")
    e.create_keyspace("c")
    e.keyspaces["c"].update(
        {"c1": {"name": "Ann", "tier": 1}, "c2": {"name": "Bob", "tier": 2}, "c3": {"name": "Cy"}}
    )
    e.keyspaces["o"].update(
        {
            "o1": {"cid": "c1", "amt": 5, "items": ["c2", "c3", "c2"]},
            "o2": {"cid": "c2", "amt": 7},
            "o3": {"cid": "zz", "amt": 1},
        }
    )
    return e


def _ids(rows: list[Any]) -> list[Any]:
    return sorted(rows, key=repr)


def test_lookup_join_and_nest(eng: LocalEngine) -> None:
    q = eng.query
    assert _ids(q("SELECT o.amt, c.name FROM o JOIN c ON KEYS o.cid")) == _ids(
        [{"amt": 5, "name": "Ann"}, {"amt": 7, "name": "Bob"}]
    )
    # LEFT keeps the row with the inner alias MISSING; repeated keys join each time.
    assert {"amt": 1} in q("SELECT o.amt, c.name FROM o LEFT JOIN c ON KEYS o.cid")
    assert q("SELECT RAW c.name FROM o JOIN c ON KEYS o.items") == ["Bob", "Cy", "Bob"]
    nest = q("SELECT RAW ARRAY_LENGTH(c) FROM o NEST c ON KEYS o.items")
    assert nest == [3]
    # LEFT NEST: [] where nothing matched (N1QL).
    left = q("SELECT META(o).id AS id, c FROM o LEFT NEST c ON KEYS o.items ORDER BY META(o).id")
    assert [r["c"] for r in left][1:] == [[], []]


def test_index_and_ansi_joins(eng: LocalEngine) -> None:
    q = eng.query
    by_index = q("SELECT META(o).id AS o, c.name FROM c JOIN o ON KEY o.cid FOR c")
    ansi = q("SELECT META(o).id AS o, c.name FROM c JOIN o ON o.cid = META(c).id")
    assert (
        _ids(by_index)
        == _ids(ansi)
        == _ids([{"o": "o1", "name": "Ann"}, {"o": "o2", "name": "Bob"}])
    )
    nest = q(
        "SELECT META(c).id AS c, ARRAY_LENGTH(os) AS n FROM c LEFT NEST o AS os ON KEY os.cid FOR c"
    )
    assert _ids(nest) == _ids([{"c": "c1", "n": 1}, {"c": "c2", "n": 1}, {"c": "c3", "n": 0}])
    right = q("SELECT META(o).id AS o, c.name FROM c RIGHT JOIN o ON o.cid = META(c).id")
    assert _ids(right) == _ids(
        [{"o": "o1", "name": "Ann"}, {"o": "o2", "name": "Bob"}, {"o": "o3"}]
    )
    # Chained: each ON sees the aliases before it.
    chain = q(
        "SELECT o.amt, c.name, d.name AS other FROM o JOIN c ON META(c).id = o.cid "
        "JOIN c AS d ON d.tier = c.tier + 1"
    )
    assert chain == [{"amt": 5, "name": "Ann", "other": "Bob"}]
    # WHERE and aggregates over the joined rows; SELECT * has one field per alias.
    assert q(
        "SELECT COUNT(*) AS n FROM o LEFT JOIN c ON META(c).id = o.cid WHERE c IS MISSING"
    ) == [{"n": 1}]
    star = q("SELECT * FROM o JOIN c ON META(c).id = o.cid WHERE o.amt = 7")
    assert star == [{"o": {"cid": "c2", "amt": 7}, "c": {"name": "Bob", "tier": 2}}]


def test_a_right_joins_unmatched_document_keeps_a_subquerys_outer_names(
    eng: LocalEngine,
) -> None:
    """In a correlated subquery, a RIGHT JOIN's inner document without a match loses only
    the left side's names: the enclosing row's stay readable (o3 matches no customer)."""
    rows = eng.query(
        "SELECT META(x).id AS id, (SELECT RAW META(o).id FROM c RIGHT JOIN o "
        "ON o.cid = META(c).id WHERE o.amt = x.amt) AS hit FROM o AS x ORDER BY META(x).id"
    )
    assert rows == [
        {"id": "o1", "hit": ["o1"]},
        {"id": "o2", "hit": ["o2"]},
        {"id": "o3", "hit": ["o3"]},
    ]


def test_an_index_on_the_join_key_is_probed_and_gives_the_same_rows(eng: LocalEngine) -> None:
    sql = "SELECT META(o).id AS o, c.name FROM o JOIN c ON c.tier = o.amt - 4"
    before = eng.query(sql)
    eng.execute("CREATE INDEX by_tier ON c(tier)")
    (plan,) = eng.query("EXPLAIN " + sql)
    join = plan["plan"][1]
    assert (join["operator"], join["method"], join["index"]) == ("JOIN", "index_nl", "by_tier")
    assert eng.query(sql) == before == [{"o": "o1", "name": "Ann"}]
    (plan,) = eng.query(sql.replace("JOIN c", "JOIN c USE HASH(PROBE)").join(["EXPLAIN ", ""]))
    assert (plan["plan"][1]["method"], plan["plan"][1]["build"]) == ("hash", "outer")


def test_a_missing_joined_keyspace_is_named(eng: LocalEngine) -> None:
    with pytest.raises(ShardexError) as e:
        eng.query("SELECT * FROM o JOIN nope ON KEYS o.cid")
    assert e.value.code is ErrorCode.KEYSPACE_NOT_FOUND and e.value.details["keyspace"] == "nope"


def test_each_joined_keyspace_needs_select() -> None:
    bob = Principal("user", "bob", ("query_select(t)",))
    check_statement(bob, parse_statement("SELECT * FROM t JOIN t AS u ON KEYS t.k"))
    for sql in [
        "SELECT * FROM t JOIN secret ON KEYS t.k",
        "SELECT * FROM t LEFT NEST secret s ON s.k = t.k",
        "EXPLAIN SELECT * FROM t RIGHT JOIN secret s ON s.k = t.k JOIN t u ON u.k = t.k",
        "SELECT (SELECT RAW s.k FROM t USE KEYS 'a' JOIN secret s ON KEYS t.k) FROM t",
    ]:
        with pytest.raises(AuthFailed) as e:
            check_statement(bob, parse_statement(sql))
        assert e.value.details["keyspace"] == "secret"


def test_a_bare_field_name_is_ambiguous_with_a_join(eng: LocalEngine) -> None:
    """As N1QL: with JOIN or NEST a field must name its keyspace alias."""
    for sql in (
        "SELECT amt FROM o JOIN c ON KEYS o.cid",
        "SELECT o.amt FROM o JOIN c ON KEYS cid",
        "SELECT o.amt FROM o JOIN c ON c.tier = tier",
        "SELECT o.amt FROM o NEST c ON KEYS o.items WHERE name = 'Bob'",
    ):
        with pytest.raises(ShardexError) as e:
            eng.query(sql)
        assert e.value.code is ErrorCode.BAD_REQUEST and "ambiguous" in e.value.message, sql
        assert e.value.details["field"] in ("amt", "cid", "tier", "name")
    # Names the statement binds stay usable: LET, projection aliases, comprehension
    # variables, and a subquery's own FROM alias.
    rows = eng.query(
        "SELECT o.amt AS a, (SELECT RAW x FROM o.items AS x) AS its FROM o JOIN c ON KEYS o.cid "
        "LET t = c.tier WHERE t >= 1 AND ANY i IN o.items SATISFIES i = 'c2' END ORDER BY a"
    )
    assert rows == [{"a": 5, "its": ["c2", "c3", "c2"]}]
