"""The expression evaluation tests' harness (``test_expr_eval.py``, ``test_expr_predicates.py``,
``test_expr_functions.py``, ``test_expr_compiled.py``): a sample document, and checks that
evaluate with both engines - the reference interpreter and the compiled fast path - and
insist they agree, comparing JSON types exactly.
"""

from __future__ import annotations

import math

from shardex.core.expr import (
    MISSING,
    compile_expression,
    evaluate,
    parse_expression,
)

M, N = MISSING, None
T, F = True, False

DOC = {
    "name": "Ashley Casper",
    "age": 37,
    "price": 12.5,
    "zero": 0,
    "flag": True,
    "nothing": None,
    "tags": ["red", "green", "blue"],
    "nums": [1, 2.5, -3],
    "empty": [],
    "address": {"city": "San Jose", "zip": "95134", "geo": {"lat": 37.3}},
    "orderlines": [{"qty": 2, "productId": "coffee01"}, {"qty": 1, "productId": "tea111"}],
    "shipped-on": "2012/01/02",
    "text": "日本語で日本",
}
META = {"id": "order::1234", "cas": 1700000000000, "expiration": 0}


def ev(text: str, doc: object = DOC, **kw: object) -> object:
    """Evaluate with both engines and insist they agree."""
    expr = parse_expression(text)
    interpreted = evaluate(expr, doc, **kw)  # type: ignore[arg-type]
    compiled = compile_expression(expr)(doc, kw.get("meta"), kw.get("params"))
    assert same(interpreted, compiled), (text, interpreted, compiled)
    return interpreted


def same(x: object, y: object) -> bool:
    """Equal values of equal JSON types (1 and True and 1.0 are different here)."""
    if x is MISSING or y is MISSING:
        return x is y
    if type(x) is not type(y) and not (
        isinstance(x, int | float) and isinstance(y, int | float) and type(x) is not bool
    ):
        return False
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x):
        return math.isnan(y)
    if isinstance(x, list):
        return len(x) == len(y) and all(same(a, b) for a, b in zip(x, y, strict=True))  # type: ignore[arg-type]
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)  # type: ignore[union-attr, index]
    return x == y


def check(text: str, expected: object, **kw: object) -> None:
    got = ev(text, **kw)
    assert same(got, expected), f"{text}: got {got!r}, expected {expected!r}"


def check_table(rows: list[tuple[str, object]], **kw: object) -> None:
    """Check every row and report all mismatches at once (one test item per table keeps
    the suite fast while a failure still names each bad row)."""
    failures = []
    for text, expected in rows:
        try:
            got = ev(text, **kw)
        except Exception as exc:  # report, then keep checking the other rows
            failures.append(f"{text}: raised {exc!r}")
            continue
        if not same(got, expected):
            failures.append(f"{text}: got {got!r}, expected {expected!r}")
    assert not failures, "\n".join(failures)
