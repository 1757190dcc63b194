"""Expression parser: the canonical text round trip (``Expr.to_text`` -> ``parse_expression``)
over a corpus, canonical spelling, reserved words, and random ASTs of every node type."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.core.expr import (
    MISSING,
    And,
    ArrayConstruct,
    Between,
    BinaryOp,
    Case,
    Expr,
    Field,
    FunctionCall,
    Identifier,
    In,
    Index,
    IsCheck,
    Like,
    Literal,
    Meta,
    Neg,
    Not,
    ObjectConstruct,
    Or,
    Param,
    parse_expression,
)
from shardex.core.expr.ast import SQL_RESERVED_WORDS
from shardex.core.expr.functions import FUNCTIONS

P = parse_expression
a = Identifier("a")


# -- canonical text round trip ------------------------------------------------------------

CORPUS = [
    "a",
    "a.b.c",
    "`first-name`",
    "a[0].b[-1]",
    "a['x y']",
    "META().id",
    "META(o).cas",
    "$1",
    "$name",
    "LOWER(name) || '-' || TO_STRING(age + 1)",
    "-a * -(b - 1) % 3",
    "- -a",
    "-(2)",
    "-(-2)",
    "(-2).a",
    "1.5e300 * 2",
    "a - -2 - -a",
    "NOT (a AND b) OR NOT c",
    "(a = b) = c",
    "a = (b = c)",
    "(a < b) < c",
    "a IS NOT NULL = TRUE",
    "(a IS NULL) IS NULL",
    "a LIKE 'x\\\\%'",
    "(a LIKE b) LIKE c",
    "(a BETWEEN 1 AND 2) BETWEEN TRUE AND FALSE",
    "a BETWEEN (b OR c) AND (d AND a)",
    "a IN (b OR c)",
    "a IN (1, 2, 3)",
    "a NOT IN ['x']",
    "a IN ('x')",
    "a IN (NULL)",
    "(a IN b) IN c",
    "a IN -1",
    "CASE WHEN a > 1 THEN 'big' WHEN a IS MISSING THEN MISSING ELSE NULL END",
    "CASE a.b WHEN 1 THEN [1, {'k': 2}] END",
    "{'a': 1, 'b': {'c': [TRUE, FALSE, NULL]}}",
    "{a || 'x': 1}",
    "IFMISSINGORNULL(a, b, 'z')",
    "`select`.`from`",
    "`AND` AND `or`",
    "a.`1`",
    "`a``b`",
    "'quote \" and \\' and \\\\ and \n and \u00e9 and \U0001f600'",
    "GREATEST(1, 2.5, -3)",
    "-0.0",
    "a[b[c[0]]]",
]


@pytest.mark.parametrize("text", CORPUS)
def test_corpus_round_trips(text):
    e = P(text)
    canonical = e.to_text()
    assert P(canonical) == e
    assert P(canonical).to_text() == canonical  # canonical text is a fixed point


def test_to_text_is_canonical():
    assert P("a=='x' and not(b<>1)").to_text() == 'a = "x" AND NOT b != 1'
    assert P("x in (1,2)").to_text() == "x IN [1, 2]"
    assert P("lower( `a` )").to_text() == "LOWER(a)"
    assert P("`value` + `first-name`").to_text() == "`value` + `first-name`"
    assert P("a is known").to_text() == "a IS VALUED"
    assert P("(a + b) * (c - d)").to_text() == "(a + b) * (c - d)"
    assert P("a + (b + c)").to_text() == "a + (b + c)"
    assert P("(a + b) + c").to_text() == "a + b + c"


def test_to_text_backticks_every_sql_reserved_word():
    for word in ("select", "ORDER", "index", "value", "key", "user"):
        assert word.upper() in SQL_RESERVED_WORDS
        assert Identifier(word).to_text() == f"`{word}`"
        assert Field(a, word).to_text() == f"a.`{word}`"
    assert Identifier("plain_name1").to_text() == "plain_name1"


# Hypothesis: random ASTs of every node type survive to_text -> parse.

_names = st.text(min_size=1, max_size=8)
_param_names = st.one_of(
    st.from_regex(r"[0-9]{1,3}", fullmatch=True),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.just(MISSING),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)
_literals = _scalars.map(Literal)
_leaves = st.one_of(
    _literals,
    _names.map(Identifier),
    _param_names.map(Param),
    st.one_of(st.none(), _names).map(Meta),
)
_fixed_arity = sorted(
    {(s.name, s.min_args) for s in FUNCTIONS.values() if s.min_args == s.max_args}
)


def _extend(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    pairs = st.tuples(children, children)
    unique_keys = st.lists(st.text(max_size=4), max_size=3, unique=True)
    return st.one_of(
        st.builds(Field, children, _names),
        st.builds(Index, children, children),
        st.builds(Neg, children),
        st.builds(Not, children),
        st.builds(
            BinaryOp,
            st.sampled_from(["+", "-", "*", "/", "%", "||", "=", "!=", "<", "<=", ">", ">="]),
            children,
            children,
        ),
        st.lists(children, min_size=2, max_size=3).map(lambda xs: And(tuple(xs))),
        st.lists(children, min_size=2, max_size=3).map(lambda xs: Or(tuple(xs))),
        st.builds(Like, children, children, st.booleans()),
        st.builds(Between, children, children, children, st.booleans()),
        st.builds(In, children, children, st.booleans()),
        st.builds(IsCheck, children, st.sampled_from(["NULL", "MISSING", "VALUED"]), st.booleans()),
        st.builds(
            Case,
            st.one_of(st.none(), children),
            st.lists(pairs, min_size=1, max_size=2).map(tuple),
            st.one_of(st.none(), children),
        ),
        st.lists(children, max_size=3).map(lambda xs: ArrayConstruct(tuple(xs))),
        st.builds(
            lambda keys, vals: ObjectConstruct(
                tuple(zip((Literal(k) for k in keys), vals, strict=False))
            ),
            unique_keys,
            st.lists(children, min_size=3, max_size=3),
        ),
        st.sampled_from(_fixed_arity).flatmap(
            lambda spec: st.lists(children, min_size=spec[1], max_size=spec[1]).map(
                lambda args, name=spec[0]: FunctionCall(name, tuple(args))
            )
        ),
    )


exprs = st.recursive(_leaves, _extend, max_leaves=12)


@settings(max_examples=120, deadline=None)
@given(exprs)
def test_random_ast_round_trips_through_text(e):
    text = e.to_text()
    assert P(text) == e, text
