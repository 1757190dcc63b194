"""Hash, BASE64, UUID, LEN and version functions, with both engines (``expr_eval_env.py``)."""

from __future__ import annotations

import re

import pytest

from shardex.core.expr import compile_expression, evaluate, is_constant, parse_expression
from shardex.core.expr.functions_crypto import md4
from tests.unit.core.expr_eval_env import M, N, check_table, ev

MISC_FUNCTIONS: list[tuple[str, object]] = [
    # A string hashes as its UTF-8 bytes, any other value as its JSON text.
    ("MD5('')", "d41d8cd98f00b204e9800998ecf8427e"),
    ("SHA1('abc')", "a9993e364706816aba3e25717850c26c9cd0d89d"),
    ("SHA256('abc')", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    ("SHA512('') = HASHBYTES('', 'sha512')", True),
    ("MD5([1,2]) = MD5('[1,2]')", True),
    ("MD5({'b': 1.0, 'a': 2}) = MD5('{\"a\":2,\"b\":1}')", True),
    ("MD5(nope)", M),
    ("MD5(NULL)", N),
    ("HASHBYTES('abc', {'algorithm': 'MD4'})", "a448017aaf21d8525fc10ae87aa6729d"),
    (
        "HASHBYTES('Hello World')",
        "a591a6d40bf420404a011733cfb7b190d62c65bf0bcda32b57b277d9ad9f146e",
    ),
    ("HASHBYTES('hello world', {'algorithm': 'crc32', 'polynomial': 'koopman'})", "df373d3c"),
    ("HASHBYTES('x', {'algorithm': 'crc32', 'polynomial': 'nope'})", N),
    ("HASHBYTES('x', {'algorithm': 'crc32', 'polynomial': 0})", N),
    ("HASHBYTES('x', {'algorithm': 'crc32', 'polynomial': 4294967296})", N),
    ("HASHBYTES('x', {'algorithm': 5})", N),
    ("HASHBYTES('x', [1])", N),
    ("BASE64([1, 2, 3, 4])", "WzEsMiwzLDRd"),
    ("BASE64(FALSE)", "ZmFsc2U="),
    ("BASE64(NULL)", "bnVsbA=="),  # NULL is encoded, not propagated
    ("BASE64(nope)", M),
    ("BASE64(1234)", "MTIzNA=="),
    ("BASE64({'a': 1, 'b': 2, 'c': [1, 2, 3]})", "eyJhIjoxLCJiIjoyLCJjIjpbMSwyLDNdfQ=="),
    ("ENCODE_BASE64('Couchbase')", "IkNvdWNoYmFzZSI="),
    ("BASE64_DECODE('IkNvdWNoYmFzZSI=')", "Couchbase"),
    ("DECODE_BASE64('bnVsbA==')", N),
    ("BASE64_DECODE('not base64!')", N),
    ("BASE64_DECODE('Q291Y2hiYXNl')", N),  # valid base64 of text that is not JSON
    (
        "BASE64_DECODE(BASE64_ENCODE(address))",
        {"city": "San Jose", "zip": "95134", "geo": {"lat": 37.3}},
    ),
    ("BASE64_DECODE(nope)", M),
    ("LEN([1, 2, 3, 4])", 4),
    ("LEN(FALSE)", 1),
    ("LEN(1234)", 4),
    ("LEN(-1.5)", 4),
    ("LEN({'a': 1})", 1),
    ("LEN('日本')", 2),
    ("LEN(nope)", M),
    ("LEN(NULL)", N),
]


def test_misc_functions() -> None:
    check_table(MISC_FUNCTIONS)


@pytest.mark.parametrize(
    ("data", "digest"),
    [
        (b"", "31d6cfe0d16ae931b73c59d7e0c089c0"),
        (b"message digest", "d9130a8164549fe818874806e1c7014b"),
        (b"1234567890" * 8, "e33b4ddc9c38f2199c3e7b164fcc0536"),  # two blocks
    ],
)
def test_md4_matches_rfc_1320(data: bytes, digest: str) -> None:
    assert md4(data).hex() == digest


def test_uuid_is_a_fresh_version_4_uuid_never_folded() -> None:
    expr = parse_expression("UUID()")
    a, b, c = evaluate(expr, {}), evaluate(expr, {}), compile_expression(expr)({})
    assert len({a, b, c}) == 3
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", a)  # type: ignore[arg-type]
    assert not is_constant(parse_expression("UUID()"))
    assert not is_constant(parse_expression("VERSION()"))
    assert isinstance(ev("DS_VERSION()"), str)
