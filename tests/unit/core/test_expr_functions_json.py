"""JSON and token functions, with both engines (``expr_eval_env.py``): encoding details
(sorted names, integral numbers, non-ASCII text), decoding bad text, and TOKENS' options."""

from __future__ import annotations

from tests.unit.core.expr_eval_env import F, M, N, T, check_table, ev

JSON_FUNCTIONS: list[tuple[str, object]] = [
    ("ENCODE_JSON({'b': 1.0, 'a': [TRUE, NULL, 'é']})", '{"a":[true,null,"é"],"b":1}'),
    ("ENCODE_JSON(2.5)", "2.5"),
    # Go's number text: fixed notation from 1e-6 up to 1e21, exponent form outside.
    (
        "ENCODE_JSON([1.5e-7, 1e-6, 1e20, 1e21, 9007199254740993.0, -2.5e-300])",
        "[1.5e-7,0.000001,100000000000000000000,1e+21,9007199254740992,-2.5e-300]",
    ),
    ("JSON_ENCODE('a\"b')", '"a\\"b"'),
    ("ENCODE_JSON(nope)", M),
    ("ENCODE_JSON(NULL)", N),
    ("DECODE_JSON('{\"a\": [1, 2.5]}')", {"a": [1, 2.5]}),
    ("JSON_DECODE('null')", N),
    ("DECODE_JSON('NaN')", N),  # Python's parser would take it; JSON has no NaN
    ("DECODE_JSON('[1,')", N),
    (
        "DECODE_JSON(DECODE_JSON(ENCODE_JSON(ENCODE_JSON(address))))",
        {"city": "San Jose", "zip": "95134", "geo": {"lat": 37.3}},
    ),
    ("ENCODED_SIZE(nope)", 0),
    ("ENCODED_SIZE(NULL)", 4),
    ("ENCODED_SIZE('é')", 4),  # UTF-8 bytes
    ("ENCODED_SIZE({'a': 1.0})", 7),
    ("POLY_LENGTH('日本')", 2),  # characters, unlike LENGTH's bytes
    ("POLY_LENGTH({'a': 1})", 1),
    ("POLY_LENGTH(TRUE)", N),
    ("POLY_LENGTH(3)", N),
    ("TOKENS(['a b', 'b', 1, 1.0, TRUE])", ["a", "b", 1, T]),
    ("TOKENS({'k': 'v'}, {'names': FALSE})", ["v"]),
    ("TOKENS('Ab-cD', {'case': 'lower'})", ["ab", "cd"]),
    ("TOKENS(' x y ', {'split': FALSE})", ["x y"]),
    ("TOKENS(' x y ', {'split': FALSE, 'trim': FALSE})", [" x y "]),
    ("TOKENS('mail a@b.com.', {'specials': TRUE})", ["mail", "a", "b", "com", "a@b.com"]),
    ("TOKENS('x', 'names')", N),
    ("TOKENS(nope)", M),
    ("CONTAINS_TOKEN(address, 'jose', {'case': 'lower'})", T),
    ("CONTAINS_TOKEN(address, 'jose')", F),
    ("HAS_TOKEN(address, 'zip')", T),
    ("CONTAINS_TOKEN(address, 3)", N),
    ("CONTAINS_TOKEN_LIKE(address, 'Sa%')", T),
    ("CONTAINS_TOKEN_REGEXP(address, '9513.')", T),
    ("CONTAINS_TOKEN_REGEXP(address, '951')", F),  # the whole token must match
]


def test_json_functions() -> None:
    check_table(JSON_FUNCTIONS)


def test_encode_json_is_what_decode_json_reads() -> None:
    doc = {"z": [1, {"y": None}], "a": "\u00e9\u65e5"}
    assert ev("DECODE_JSON(ENCODE_JSON(d))", {"d": doc}) == doc
