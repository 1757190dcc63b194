"""REGEXP_MATCHES / REGEXP_SPLIT, the literal prefix / suffix / stop of LIKE and regular
expression patterns, and MASK, with both engines (``expr_eval_env.py``). MASK rows are the
documented N1QL examples."""

from __future__ import annotations

from tests.unit.core.expr_eval_env import M, N, check_table

SENTENCE = "So, 'twas better Betty Botter bought a bit of better butter"

PATTERN_FUNCTIONS: list[tuple[str, object]] = [
    (
        f"REGEXP_MATCHES(\"{SENTENCE}\", '\\\\b[Bb]\\\\w+')",
        ["better", "Betty", "Botter", "bought", "bit", "better", "butter"],
    ),
    ("REGEXP_MATCHES('abc', 'x')", []),
    ("REGEXP_MATCHES(1, 'x')", N),
    ("REGEXP_SPLIT('/opt/couchbase/bin', '/')", ["", "opt", "couchbase", "bin"]),
    ("REGEXP_SPLIT('abc', 'x*')", ["a", "b", "c"]),  # Go's Split: no empty pieces
    ("REGEXP_SPLIT('abc', ',')", ["abc"]),
    ("LIKE_PREFIX('ab\\\\%c%d')", "ab%c"),
    ("LIKE_PREFIX('a!_b_', '!')", "a_b"),
    ("LIKE_PREFIX('abc', 'ab')", N),  # an escape is one character
    ("LIKE_SUFFIX('%ab\\\\_')", "ab_"),
    ("LIKE_STOP('ab%')", "ac"),
    ("LIKE_STOP('ab')", "ab\u0000"),
    ("LIKE_STOP('%ab')", N),  # no prefix: no upper bound
    ("LIKE_PREFIX(nope)", M),
    ("REGEXP_PREFIX('abc*d')", "ab"),  # c may occur zero times
    ("REGEXP_PREFIX('^ab\\\\.c+')", "ab.c"),
    ("REGEXP_PREFIX('a|b')", ""),
    ("REGEXP_SUFFIX('.*x\\\\.y$')", "x.y"),
    ("REGEXP_STOP('ab.')", "ac"),
    ("REGEXP_STOP('ab')", "ab\u0000"),
    ("MASK('SomeTextToMask')", "********"),
    ("MASK('SomeTextToMask', {'mask': '++++'})", "++++"),
    ("MASK('SomeTextToMask', {'mask': '++++    ++++'})", "++++Text++++"),
    (
        "MASK('1234abcd5678efgh', {'mask': '****-****-****-####', 'hole': '#', 'inject': '-'})",
        "****-****-****-efgh",
    ),
    (
        "MASK('1234abcd5678efgh', {'mask': '****', 'anchor': 'end', 'length': 'source'})",
        "1234abcd5678****",
    ),
    ("MASK('1234abcd5678efgh', {'mask': '****', 'anchor': 'd5'})", "1234abc****"),
    (
        "MASK('1234abcd5678efgh', {'mask': '****', 'anchor': -2, 'length': 'source'})",
        "1234abcd56****gh",
    ),
    (
        "MASK('1234abcd5678efgh', {'mask': '****', 'anchor': 14, 'length': 'source'})",
        "1234abcd5678ef**",
    ),
    ("MASK('abc', {'anchor': 4})", "abc"),  # outside the string: unchanged
    ("MASK('abc', {'anchor': 'zz'})", "abc"),  # the pattern does not match
    ("MASK('abc', {'mask': 1})", N),
    ("MASK('abc', 'x')", N),
    ("MASK(1)", N),
]


def test_pattern_functions() -> None:
    check_table(PATTERN_FUNCTIONS)
