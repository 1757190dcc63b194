"""Bitwise functions over 64-bit two's complement integers, with both engines
(``expr_eval_env.py``): the documented examples, the 64-bit edges and bad arguments."""

from __future__ import annotations

from tests.unit.core.expr_eval_env import F, M, N, T, check_table

BITWISE_FUNCTIONS: list[tuple[str, object]] = [
    ("BITAND(3, 6, 15)", 2),
    ("BITAND(4.0, 3)", 0),
    ("BITAND(4.5, 3)", N),
    ("BITAND('3', 3)", N),
    ("BITAND(3, nope)", M),
    ("BITAND(3, NULL)", N),
    ("BITOR(3, -4)", -1),
    ("BITXOR(5, 3)", 6),
    ("BITNOT(3)", -4),
    ("BITNOT(9223372036854775807)", -9223372036854775808),
    ("BITNOT(9223372036854775808)", N),  # does not fit 64 bits
    ("BITNOT(-9223372036854775808)", 9223372036854775807),
    ("BITSHIFT(6, 4, TRUE)", 96),
    ("BITSHIFT(6, -2)", 1),
    ("BITSHIFT(6, -2, TRUE)", -9223372036854775807),
    ("BITSHIFT(6, -3, TRUE)", -4611686018427387904),
    ("BITSHIFT(6, -4, TRUE)", 6917529027641081856),
    ("BITSHIFT(524288, 45, TRUE)", 1),
    ("BITSHIFT(1, 63)", -9223372036854775808),
    ("BITSHIFT(1, 64)", 0),
    ("BITSHIFT(1, 1, 'yes')", N),
    ("BITSHIFT(1, 0.5)", N),
    ("BITSET(6, [1, 4])", 15),
    ("BITSET(0, 64)", -9223372036854775808),
    ("BITSET(0, 65)", N),
    ("BITSET(0, 0)", N),
    ("BITSET(0, [1, 'x'])", N),
    ("BITCLEAR(31, [1, 2, 4, 5])", 4),
    ("BITCLEAR(-1, 64)", 9223372036854775807),
    ("ISBITSET(6, 1)", F),
    ("BITTEST(1, [1, 2], FALSE)", T),
    ("ISBITSET(6, [2, 3], TRUE)", T),
    ("BITTEST(6, [1, 3], TRUE)", F),
    ("BITTEST(6, 2, 1)", N),
    ("BITTEST(6, -1)", N),
]


def test_bitwise_functions() -> None:
    check_table(BITWISE_FUNCTIONS)
