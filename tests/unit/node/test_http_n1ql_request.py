"""A ``/query/service`` request's parameters as Couchbase's N1QL REST API takes them: from
the URL, a form body or a JSON body, with each mistake's N1QL code."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest

from shardex.node.http.n1ql_errors import N1qlError
from shardex.node.http.n1ql_request import parse_duration, query_request
from shardex.node.http.wire import Request


def req(
    body: bytes = b"",
    content_type: str = "application/x-www-form-urlencoded",
    query: list[tuple[str, str]] | None = None,
) -> Request:
    return Request(
        "POST", "/query/service", query or [], {"content-type": content_type}, body, True
    )


def as_json(params: dict[str, Any]) -> Request:
    return req(json.dumps(params).encode(), "application/json")


def code_of(r: Request) -> int:
    with pytest.raises(N1qlError) as e:
        query_request(r)
    return e.value.code


def test_a_form_body_as_curl_sends_it() -> None:
    q = query_request(
        req(b"statement=SELECT+%24a+AS+a&%24a=%22x%22&timeout=1m30s&client_context_id=c1")
    )
    assert q.statement == "SELECT $a AS a" and q.params == {"a": "x"}
    assert q.timeout == 90.0 and q.timeout_text == "1m30s" and q.client_context_id == "c1"
    assert q.consistency == "not_bounded" and not q.readonly
    positional = query_request(req(b"statement=SELECT+%241&args=%5B%5B1%2C2%5D%5D&readonly=true"))
    assert positional.params == [[1, 2]] and positional.readonly


def test_a_json_body_and_the_url_together() -> None:
    q = query_request(
        req(
            json.dumps({"args": ["k"], "scan_consistency": "REQUEST_PLUS"}).encode(),
            "application/json; charset=utf-8",
            query=[("statement", "SELECT 1")],
        )
    )
    assert (q.statement, q.params, q.consistency) == ("SELECT 1", ["k"], "request_plus")
    named = query_request(as_json({"statement": "s", "$a": {"x": 1}, "@b": None}))
    assert named.params == {"a": {"x": 1}, "b": None}


def test_at_plus_takes_a_sparse_or_full_scan_vector() -> None:
    sparse = {"statement": "s", "scan_consistency": "at_plus", "scan_vector": {"3": [7, "99"]}}
    assert query_request(as_json(sparse)).scan_vector == {3: (7, 99)}
    full = {**sparse, "scan_vector": [[1, 5], [2, "6"]]}
    assert query_request(as_json(full)).scan_vector == {0: (1, 5), 1: (2, 6)}
    form = b"statement=s&scan_consistency=at_plus&scan_vector=%7B%220%22%3A%5B1%2C2%5D%7D"
    assert query_request(req(form)).scan_vector == {0: (1, 2)}


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({}, 1050),
        ({"statement": "  "}, 1050),
        ({"statement": 5}, 1070),
        ({"statement": "s", "nope": 1}, 1065),
        ({"statement": "s", "args": {"a": 1}}, 1070),
        ({"statement": "s", "args": [1], "$a": 2}, 1040),
        ({"statement": "s", "scan_consistency": "statement_plus"}, 1030),
        ({"statement": "s", "scan_consistency": "at_plus"}, 1050),
        ({"statement": "s", "scan_consistency": "at_plus", "scan_vector": {"x": [1, 2]}}, 1040),
        ({"statement": "s", "scan_consistency": "at_plus", "scan_vector": {"1": [1]}}, 1040),
        ({"statement": "s", "scan_consistency": "at_plus", "scan_vector": 3}, 1070),
        ({"statement": "s", "scan_vector": {"1": [1, 2]}}, 1040),  # not_bounded: no vector
        ({"statement": "s", "timeout": "10 s"}, 1040),
        ({"statement": "s", "timeout": 10}, 1070),
        ({"statement": "s", "readonly": "yes"}, 1070),
        ({"statement": "s", "client_context_id": 'a"b'}, 1040),
    ],
)
def test_each_mistake_has_its_code(params: dict[str, Any], code: int) -> None:
    assert code_of(as_json(params)) == code


def test_text_sources_mistakes() -> None:
    assert code_of(req(b"statement=s&statement=t")) == 1060
    assert code_of(req(b"statement=s", query=[("statement", "t")])) == 1060
    assert code_of(req(b"statement=s&args=%5B1")) == 1040  # args not JSON text
    assert code_of(req(b"{", "application/json")) == 1040
    assert code_of(req(b"[1]", "application/json")) == 1070
    assert code_of(req(b"\xff", "application/x-www-form-urlencoded")) == 1040


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10.0), ("500ms", 0.5), ("1m30s", 90.0), ("1h", 3600.0), ("1.5s", 1.5),
     ("250us", 250e-6), ("100µs", 100e-6), ("7ns", 7e-9)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "s", "10x", "1s 2s", "-1s", "1s2"])
def test_bad_durations_name_the_value(text: str) -> None:
    with pytest.raises(N1qlError) as e:
        parse_duration(text)
    assert e.value.code == 1040 and repr(text[:40]) in e.value.msg


def test_a_zero_timeout_means_the_longest() -> None:
    q = query_request(as_json({"statement": "s", "timeout": "0s"}))
    assert q.timeout == 0.0 and q.timeout_text == ""


@pytest.mark.parametrize(
    "args",
    [
        b'["a", 1, -0.0, 1.5e-400, 12345678901234567890123, {"b": [null, true]}]',
        b"[1e400, NaN, -Infinity]",  # json's own extensions: msgspec declines them
        b'["\\ud800"]',  # a lone surrogate
        b'["\\u00e9\\u2028", 0.1, 1E2]',
    ],
)
def test_a_json_body_decodes_to_json_loads_values(args: bytes) -> None:
    body = b'{"statement": "SELECT $1", "args": ' + args + b"}"
    q = query_request(req(body, "application/json"))
    assert repr(q.params) == repr(json.loads(body)["args"])
    # the same values from a form's args (JSON text)
    assert repr(query_request(req(b"statement=s&args=" + quote(args))).params) == repr(q.params)


@pytest.mark.parametrize(
    "body", [b'{"statement": "SELECT 1",}', b'{"statement": "SELECT 1"', b"\xff", b"[1, 2"]
)
def test_a_bad_json_body_names_json_loads_error(body: bytes) -> None:
    with pytest.raises(N1qlError) as e:
        query_request(req(body, "application/json"))
    try:
        json.loads(body)
    except (ValueError, UnicodeDecodeError) as expected:
        assert e.value.msg == f"Error processing JSON request body: {expected}"
    else:
        raise AssertionError(f"{body!r} is JSON")


def quote(data: bytes) -> bytes:
    return urllib.parse.quote_from_bytes(data).encode()
