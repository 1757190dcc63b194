"""Expression parser: tokens, precedence, every construct, errors, and the static analyses
(referenced paths, constant/deterministic). The canonical text round trip is
``test_expr_text.py``."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

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
    Parser,
    TokenKind,
    is_constant,
    is_deterministic,
    parse_expression,
    referenced_paths,
    tokenize,
)
from shardex.core.expr.ast import SQL_RESERVED_WORDS
from shardex.core.expr.functions import FUNCTIONS
from shardex.errors import ErrorCode, ExpressionSyntaxError

P = parse_expression
a, b, c, d = (Identifier(n) for n in "abcd")


def lit(v: object) -> Literal:
    return Literal(v)


def sx(e: Expr) -> str:
    """Fully parenthesized prefix form, to assert tree shape independently of to_text."""
    match e:
        case Literal(value=v):
            return repr(v)
        case Identifier(name=n):
            return n
        case Field(base=base, name=n):
            return f"(. {sx(base)} {n})"
        case Index(base=base, index=i):
            return f"([] {sx(base)} {sx(i)})"
        case BinaryOp(op=op, left=left, right=right):
            return f"({op} {sx(left)} {sx(right)})"
        case And(operands=xs):
            return "(AND " + " ".join(sx(x) for x in xs) + ")"
        case Or(operands=xs):
            return "(OR " + " ".join(sx(x) for x in xs) + ")"
        case Not(operand=o):
            return f"(NOT {sx(o)})"
        case Neg(operand=o):
            return f"(NEG {sx(o)})"
        case Like(operand=o, pattern=p, negated=n):
            return f"({'NOT ' if n else ''}LIKE {sx(o)} {sx(p)})"
        case Between(operand=o, low=lo, high=hi, negated=n):
            return f"({'NOT ' if n else ''}BETWEEN {sx(o)} {sx(lo)} {sx(hi)})"
        case In(operand=o, collection=coll, negated=n):
            return f"({'NOT ' if n else ''}IN {sx(o)} {sx(coll)})"
        case IsCheck(operand=o, kind=k, negated=n):
            return f"(IS {'NOT ' if n else ''}{k} {sx(o)})"
        case ArrayConstruct(items=items):
            return "[" + " ".join(sx(i) for i in items) + "]"
        case FunctionCall(name=n, args=args):
            return f"({n} " + " ".join(sx(x) for x in args) + ")"
        case _:
            return e.to_text()


# -- lexer ---------------------------------------------------------------------------------


def test_tokens_carry_kind_value_and_position():
    toks = tokenize("a.`b c` >= 1.5e2 -- comment\n AND $x || 'it''s' /* c */ $2")
    kinds = [(t.kind, t.value) for t in toks]
    assert kinds == [
        (TokenKind.IDENT, "a"),
        (TokenKind.OP, "."),
        (TokenKind.QIDENT, "b c"),
        (TokenKind.OP, ">="),
        (TokenKind.NUMBER, 150.0),
        (TokenKind.IDENT, "AND"),
        (TokenKind.PARAM, "x"),
        (TokenKind.OP, "||"),
        (TokenKind.STRING, "it's"),
        (TokenKind.PARAM, "2"),
        (TokenKind.EOF, None),
    ]
    and_tok = toks[5]
    assert (and_tok.line, and_tok.column, and_tok.upper) == (2, 2, "AND")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("42", 42),
        ("12345678901234567890123", 12345678901234567890123),
        ("1.5", 1.5),
        ("1e3", 1000.0),
        ("2.5E-3", 0.0025),
        ("7e+2", 700.0),
        ("1e-999999", 0.0),  # rounds to zero, as a double does
        ("1.7976931348623157e308", 1.7976931348623157e308),
        ("9" * 308, int("9" * 308)),  # integers stay exact up to the largest double
    ],
)
def test_number_literals(text, value):
    e = P(text)
    assert e == Literal(value) and type(e.value) is type(value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("'abc'", "abc"),
        ('"abc"', "abc"),
        ("'it''s'", "it's"),
        ('"say ""hi"""', 'say "hi"'),
        (r"'a\'b'", "a'b"),
        (r'"a\"b"', 'a"b'),
        (r"'tab\there'", "tab\there"),
        (r"'nl\nx\r\b\f\/'", "nl\nx\r\b\f/"),
        (r"'back\\slash'", "back\\slash"),
        (r"'\u00e9\u4e2d'", "é中"),
        (r"'\ud83d\ude00'", "\U0001f600"),  # surrogate pair escapes combine
        (r"'100\%'", "100\\%"),  # unknown escapes keep the backslash (LIKE, regex)
        (r"'\d+'", "\\d+"),
        ("'multi\nline'", "multi\nline"),
        ("''", ""),
        ("'日本語'", "日本語"),
    ],
)
def test_string_literals_and_escapes(text, value):
    assert P(text) == Literal(value)


@pytest.mark.parametrize(
    ("text", "value"),
    [("TRUE", True), ("false", False), ("Null", None), ("missing", MISSING), ("MISSING", MISSING)],
)
def test_keyword_literals_are_case_insensitive(text, value):
    assert P(text) == Literal(value)


def test_literal_equality_distinguishes_types():
    assert Literal(1) != Literal(True)
    assert Literal(1) != Literal(1.0)
    assert Literal(0) != Literal(False)
    assert Literal(None) != Literal(MISSING)
    assert len({Literal(1), Literal(True), Literal(1.0)}) == 3


# -- precedence and associativity -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("a + b * c", "(+ a (* b c))"),
        ("a * b + c", "(+ (* a b) c)"),
        ("a - b - c", "(- (- a b) c)"),
        ("a / b / c", "(/ (/ a b) c)"),
        ("a % b * c", "(* (% a b) c)"),
        ("(a + b) * c", "(* (+ a b) c)"),
        ("a || b || c", "(|| (|| a b) c)"),
        ("a || b + c", "(|| a (+ b c))"),
        ("a + b || c", "(|| (+ a b) c)"),
        ("-a * b", "(* (NEG a) b)"),
        ("-a.b", "(NEG (. a b))"),
        ("- -a", "(NEG (NEG a))"),
        ("-2 * a", "(* -2 a)"),
        ("a - -2", "(- a -2)"),
        ("-2.5", "-2.5"),
        ("-2.x", "(NEG (. 2 x))"),
        ("a = b + 1", "(= a (+ b 1))"),
        ("a == b", "(= a b)"),
        ("a <> b", "(!= a b)"),
        ("a != b", "(!= a b)"),
        ("a = b < c", "(= a (< b c))"),
        ("a < b = c", "(= (< a b) c)"),
        ("a < b AND c >= d", "(AND (< a b) (>= c d))"),
        ("a OR b AND c", "(OR a (AND b c))"),
        ("a AND b OR c", "(OR (AND a b) c)"),
        ("a OR b OR c", "(OR a b c)"),
        ("a AND b AND c AND d", "(AND a b c d)"),
        ("(a AND b) AND c", "(AND (AND a b) c)"),
        ("a AND (b AND c)", "(AND a (AND b c))"),
        ("a AND b OR c AND d OR a", "(OR (AND a b) (AND c d) a)"),
        ("a OR b AND c OR d", "(OR a (AND b c) d)"),
        ("NOT a AND b", "(AND (NOT a) b)"),
        ("NOT a = b", "(NOT (= a b))"),
        ("NOT NOT a", "(NOT (NOT a))"),
        ("a = NOT b", "(= a (NOT b))"),
        ("a LIKE b || '%'", "(LIKE a (|| b '%'))"),
        ("a NOT LIKE 'x%' AND b", "(AND (NOT LIKE a 'x%') b)"),
        ("a BETWEEN 1 AND 2 AND c", "(AND (BETWEEN a 1 2) c)"),
        ("a NOT BETWEEN b + 1 AND c * 2", "(NOT BETWEEN a (+ b 1) (* c 2))"),
        ("a IN [1, 2] OR b", "(OR (IN a [1 2]) b)"),
        ("a + 1 IN b", "(IN (+ a 1) b)"),
        ("a IS NULL AND b IS NOT MISSING", "(AND (IS NULL a) (IS NOT MISSING b))"),
        ("a || b IS VALUED", "(IS VALUED (|| a b))"),
        ("a IS KNOWN", "(IS VALUED a)"),
        ("a IS NOT KNOWN", "(IS NOT VALUED a)"),
        ("a = b IS NULL", "(= a (IS NULL b))"),
        ("NOT a IS MISSING", "(NOT (IS MISSING a))"),
        ("a.b[0].c", "(. ([] (. a b) 0) c)"),
        ("a[-1]", "([] a -1)"),
        ("a[b + 1]['k']", "([] ([] a (+ b 1)) 'k')"),
        ("LOWER(a).b", "(. (LOWER a) b)"),
    ],
)
def test_precedence_and_associativity(text, shape):
    assert sx(P(text)) == shape


# -- constructs -------------------------------------------------------------------------------


def test_paths_and_identifiers():
    assert P("`first-name`") == Identifier("first-name")
    assert P("`a``b`") == Identifier("a`b")
    assert P("a.`b.c`") == Field(a, "b.c")
    # After a dot any word is a field name, even a keyword.
    assert P("a.end.value") == Field(Field(a, "end"), "value")
    assert P("`end`") == Identifier("end")
    assert P("`select`") == Identifier("select")
    # SQL-only reserved words are fine as bare field names in the expression language.
    assert P("value") == Identifier("value")


def test_meta_and_params():
    assert P("META().id") == Field(Meta(), "id")
    assert P("meta(o).cas") == Field(Meta("o"), "cas")
    assert P("META(`my ks`)") == Meta("my ks")
    assert P("$1 + $name") == BinaryOp("+", Param("1"), Param("name"))


def test_array_and_object_constructors():
    assert P("[]") == ArrayConstruct(())
    assert P("[1, 'a', [true]]") == ArrayConstruct((lit(1), lit("a"), ArrayConstruct((lit(True),))))
    assert P("{}") == ObjectConstruct(())
    assert P('{"k": a + 1, UPPER("x"): [b]}') == ObjectConstruct(
        (
            (lit("k"), BinaryOp("+", a, lit(1))),
            (FunctionCall("UPPER", (lit("x"),)), ArrayConstruct((b,))),
        )
    )


def test_in_forms():
    assert P("a IN (1, 2)") == In(a, ArrayConstruct((lit(1), lit(2))))
    assert P("a IN [1, 2]") == In(a, ArrayConstruct((lit(1), lit(2))))
    assert P("a NOT IN ('x')") == In(a, ArrayConstruct((lit("x"),)), negated=True)
    # A parenthesized non-constant keeps N1QL's meaning: an expression yielding an array.
    assert P("a IN (b)") == In(a, b)
    assert P("a IN ($ids)") == In(a, Param("ids"))
    assert P("a IN b.c") == In(a, Field(b, "c"))
    assert P("a IN ('x') || 'y'") == In(a, BinaryOp("||", lit("x"), lit("y")))
    assert P("a IN (b)[0]") == In(a, Index(b, lit(0)))
    assert P("a IN (1, 2) AND b") == And((In(a, ArrayConstruct((lit(1), lit(2)))), b))


def test_case_forms():
    assert P("CASE WHEN a THEN 1 WHEN b THEN 2 END") == Case(None, ((a, lit(1)), (b, lit(2))))
    assert P("case a when 1 then 'x' else 'y' end") == Case(a, ((lit(1), lit("x")),), lit("y"))
    nested = P("CASE WHEN a BETWEEN 1 AND 2 THEN CASE b WHEN 1 THEN 2 END END")
    assert nested == Case(None, ((Between(a, lit(1), lit(2)), Case(b, ((lit(1), lit(2)),))),))


def test_function_names_are_case_insensitive_and_canonical():
    assert P("lower(a)") == FunctionCall("LOWER", (a,))
    assert P("LoWeR(a)") == FunctionCall("LOWER", (a,))
    assert P("tostring(a)") == FunctionCall("TO_STRING", (a,))
    assert P("`lower`(a)") == FunctionCall("LOWER", (a,))
    assert P("substr(a, 0, 2)") == FunctionCall("SUBSTR", (a, lit(0), lit(2)))
    assert P("CONCAT(a, b, c, d)").args == (a, b, c, d)


def test_comments_and_whitespace():
    assert P("  a /* x */ +\n\t-- line\n b  ") == BinaryOp("+", a, b)


def test_ast_is_immutable_hashable_and_picklable():
    e = P("LOWER(a.b[0]) || 'x' IN ['a', MISSING] AND META().id LIKE $p")
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.operands = ()  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(e)) == e
    again = pickle.loads(pickle.dumps(Literal(MISSING)))
    assert again.value is MISSING
    assert hash(e) == hash(P(e.to_text()))
    assert {e: 1}[P(e.to_text())] == 1


# -- syntax errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "column", "token", "fragment"),
    [
        ("", 1, 1, "", "empty expression"),
        ("   \n  ", 2, 3, "", "empty expression"),
        ("a + )", 1, 5, ")", "unexpected ')' at line 1, column 5; expected an expression"),
        ("LOWER(a) )", 1, 10, ")", "expected an operator or the end"),
        ("a b", 1, 3, "b", "unexpected 'b' at line 1, column 3"),
        ("a +", 1, 4, "", "unexpected end of input at line 1, column 4"),
        ("(a + b", 1, 7, "", "expected ')'"),
        ("'abc", 1, 1, "'abc", "unterminated string literal starting at line 1, column 1"),
        ('x = "abc\n def', 1, 5, '"abc\n def', "unterminated string literal"),
        ("`abc", 1, 1, "`abc", "unterminated quoted identifier"),
        ("``", 1, 1, "``", "empty quoted identifier"),
        ("a /* never closed", 1, 3, "/*", "unterminated comment"),
        ("1e", 1, 1, "1e", "malformed number '1e'"),
        ("x + 12abc", 1, 5, "12abc", "malformed number '12abc'"),
        ("1.2.3", 1, 1, "1.2.3", "malformed number"),
        ("1e999999", 1, 1, "1e999999", "number 1e999999 is too large"),
        ("x + 1e309", 1, 5, "1e309", "number 1e309 is too large"),
        ("2.5E+400", 1, 1, "2.5E+400", "is too large (the largest is about 1.8e308)"),
        ("1" + "0" * 309, 1, 1, "1" + "0" * 39 + "...", "is too large"),
        ("a ^ b", 1, 3, "^", "unexpected character '^'"),
        ("a = $", 1, 5, "$", "malformed parameter"),
        ("FOO(1)", 1, 1, "FOO", "unknown function 'FOO'"),
        ("a +\n  nosuch(b)", 2, 3, "nosuch", "unknown function 'nosuch' at line 2, column 3"),
        ("LOWER(a, b)", 1, 1, "LOWER", "function LOWER takes 1 argument, got 2"),
        ("SUBSTR(a)", 1, 1, "SUBSTR", "takes 2 to 3 arguments, got 1"),
        ("CONCAT('a')", 1, 1, "CONCAT", "takes at least 2 arguments, got 1"),
        ("a = b = c", 1, 7, "=", "cannot follow another operator of the same kind"),
        ("a < b > c", 1, 7, ">", "cannot follow another operator"),
        ("a LIKE b LIKE c", 1, 10, "LIKE", "cannot follow"),
        ("a IS NULL IS NULL", 1, 11, "IS", "cannot follow"),
        ("a IS b", 1, 6, "b", "expected NULL, MISSING, VALUED or KNOWN"),
        ("a BETWEEN 1 OR 2", 1, 13, "OR", "expected AND"),
        ("CASE a END", 1, 8, "END", "expected WHEN"),
        ("CASE WHEN a THEN 1", 1, 19, "", "expected WHEN, ELSE or END"),
        ("CASE WHEN a 1 END", 1, 13, "1", "expected THEN"),
        ("a IN ()", 1, 7, ")", "expected an expression"),
        ("a IN (1, 2)[0]", 1, 12, "[", "expected the end of the IN list"),
        ("[1, 2", 1, 6, "", "expected ',' or ']'"),
        ("{'a' 1}", 1, 6, "1", "expected ':' after an object key"),
        ("{'a': 1, 'a': 2}", 1, 10, "'a'", "duplicate object key"),
        ("a.", 1, 3, "", "expected a field name after '.'"),
        ("a.1", 1, 3, "1", "expected a field name"),
        ("AND", 1, 1, "AND", "expected an expression"),
        ("a AND", 1, 6, "", "expected an expression"),
        ("META(a, b)", 1, 7, ",", "META takes at most a keyspace alias"),
        ("a NOT b", 1, 3, "NOT", "unexpected 'NOT'"),
        ("x = 'bad \\u12'", 1, 10, "\\u12'", "invalid \\u escape"),
    ],
)
def test_syntax_errors_name_line_column_and_token(text, line, column, token, fragment):
    with pytest.raises(ExpressionSyntaxError) as info:
        P(text)
    err = info.value
    assert fragment in err.message, err.message
    assert err.code is ErrorCode.EXPRESSION_SYNTAX
    assert err.details["line"] == line, err.message
    assert err.details["column"] == column, err.message
    assert err.details["token"] == token, err.message
    assert err.details["text"] == text
    if token:
        assert f"line {line}, column {column}" in err.message


def test_nesting_limits_are_syntax_errors_not_crashes():
    with pytest.raises(ExpressionSyntaxError, match="nested too deeply"):
        P("(" * 2000 + "a" + ")" * 2000)
    with pytest.raises(ExpressionSyntaxError, match=r"nested too deeply \(depth 301, limit 128\)"):
        P(" + ".join(["a"] * 301))
    with pytest.raises(ExpressionSyntaxError, match="nested too deeply"):
        P("NOT " * 500 + "a")
    # Long AND/OR chains are flat n-ary nodes: fine at any length.
    long_or = P(" OR ".join(f"a = {i}" for i in range(3000)))
    assert isinstance(long_or, Or) and len(long_or.operands) == 3000


def test_error_details_include_expected():
    with pytest.raises(ExpressionSyntaxError) as info:
        P("a +")
    assert info.value.details["expected"] == "an expression"


def test_parse_rejects_non_string():
    with pytest.raises(TypeError):
        P(b"a")  # type: ignore[arg-type]


# -- extension hooks used by the SQL layer --------------------------------------------------


def test_parser_token_helpers_and_reuse():
    p = Parser.from_text("SELECT a + 1 FROM ks")
    assert p.accept_keyword("select")
    e = p.parse_expression()  # stops at FROM: not an operator
    assert e == BinaryOp("+", a, lit(1))
    assert p.at_keyword("FROM") and p.expect_keyword("FROM").text == "FROM"
    assert p.advance().value == "ks" and p.at_end()
    with pytest.raises(ExpressionSyntaxError, match="expected WHERE"):
        p.expect_keyword("WHERE")


def test_subclass_can_reserve_sql_words():
    class SqlParser(Parser):
        reserved = SQL_RESERVED_WORDS

    with pytest.raises(ExpressionSyntaxError, match="reserved word 'value'"):
        SqlParser.from_text("value + 1").parse_complete()
    assert SqlParser.from_text("`value` + 1").parse_complete() == BinaryOp(
        "+", Identifier("value"), lit(1)
    )


def test_custom_function_registry():
    from shardex.core.expr import FunctionSpec

    funcs = dict(FUNCTIONS)
    funcs["DOUBLE"] = FunctionSpec("DOUBLE", 1, 1, lambda x: x * 2)
    assert P("double(a)", functions=funcs) == FunctionCall("DOUBLE", (a,))
    with pytest.raises(ExpressionSyntaxError, match="unknown function"):
        P("double(a)")


# -- analyses -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "paths"),
    [
        ("a", {("a",)}),
        ("a.b.c", {("a", "b", "c")}),
        ("a[0].b", {("a", 0, "b")}),
        ("a['k'][-1]", {("a", "k", -1)}),
        ("LOWER(a.b) || c[0]", {("a", "b"), ("c", 0)}),
        ("a[$i].x", {("a",)}),
        ("a[b]", {("a",), ("b",)}),
        ("META().id = $p", set()),
        ("CASE WHEN x > 1 THEN y ELSE {'k': z.w} END", {("x",), ("y",), ("z", "w")}),
        ("a.b AND a", {("a", "b"), ("a",)}),
        ("UPPER('x').y", set()),
    ],
)
def test_referenced_paths(text, paths):
    assert referenced_paths(P(text)) == paths


def test_constant_and_deterministic():
    assert is_constant(P("1 + LOWER('A') || 'x'"))
    assert not is_constant(P("1 + a"))
    assert not is_constant(P("$1"))
    assert not is_constant(P("META().id"))
    assert is_deterministic(P("LOWER(a) || $1"))
