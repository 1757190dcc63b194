"""Parsing JSON Lines for ``shardex load``: good lines forwarded as their own bytes, every bad
line reported with its number and a reason, blank lines skipped, huge lines never held whole."""

from __future__ import annotations

import io

import pytest

from shardex.cli.loadfile import BadLine, Doc, parse_line, read_lines


def lines(data: bytes, **kw: object) -> list[Doc | BadLine]:
    return list(read_lines(io.BytesIO(data), **kw))  # type: ignore[arg-type]


def test_good_lines_keep_their_bytes_and_ids() -> None:
    data = b'{"id": "a", "v": 1}\n{"id": 7, "v": [1, 2]}\r\n  {"id":"c"}  \n'
    out = lines(data, id_field="id")
    assert [(d.line, d.docid) for d in out if isinstance(d, Doc)] == [(1, "a"), (2, "7"), (3, "c")]
    assert out[0].body == b'{"id": "a", "v": 1}'  # not re-encoded
    assert out[2].body == b'{"id":"c"}'  # surrounding whitespace and CRLF stripped
    assert sum(d.nbytes for d in out) == len(data)  # progress accounts for every byte


def test_generated_ids_are_unique_uuid_hex() -> None:
    out = lines(b"{}\n" * 50, id_field=None)
    ids = [d.docid for d in out if isinstance(d, Doc)]
    assert len(set(ids)) == 50 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"id": "a", ', "not valid JSON"),
        (b"hello", "not valid JSON"),
        (b"[1, 2]", "not a JSON object (got an array)"),
        (b'"text"', "not a JSON object (got a string)"),
        (b"42", "not a JSON object (got a number)"),
        (b"null", "not a JSON object (got null)"),
        (b"true", "not a JSON object (got a boolean)"),
        (b'{"v": 1}', "missing id field 'id'"),
        (b'{"id": null}', "must be a string or an integer, got NoneType"),
        (b'{"id": true}', "must be a string or an integer, got bool"),
        (b'{"id": {"x": 1}}', "must be a string or an integer, got dict"),
        (b'{"id": ""}', "is empty"),
        (b'{"id": "' + b"x" * 300 + b'"}', "longer than 250 bytes"),
    ],
)
def test_bad_lines_say_why(line: bytes, reason: str) -> None:
    item = parse_line(line, 9, id_field="id")
    assert isinstance(item, BadLine)
    assert item.line == 9 and reason in item.reason


def test_nested_id_field_is_not_looked_up() -> None:
    item = parse_line(b'{"user": {"id": "a"}}', 1, id_field="user.id")
    assert isinstance(item, BadLine) and "missing id field 'user.id'" in item.reason


def test_blank_lines_are_skipped_but_counted() -> None:
    out = lines(b'\n   \n{"id": "a"}\n\n{"id": "b"}', id_field="id")
    assert [(d.line, d.docid) for d in out if isinstance(d, Doc)] == [(3, "a"), (5, "b")]


def test_bad_lines_do_not_stop_reading() -> None:
    data = b'{"id": "a"}\nnot json\n[1]\n{"id": "d"}\n'
    out = lines(data, id_field="id")
    assert [type(x).__name__ for x in out] == ["Doc", "BadLine", "BadLine", "Doc"]
    assert [x.line for x in out] == [1, 2, 3, 4]


def test_too_large_lines_are_refused_without_parsing() -> None:
    big = b'{"id": "b", "pad": "' + b"x" * 5000 + b'"}'
    data = b'{"id": "a"}\n' + big + b"\n" + b'{"id": "c"}\n'
    out = lines(data, id_field="id", max_bytes=1000)
    assert [type(x).__name__ for x in out] == ["Doc", "BadLine", "Doc"]
    bad = out[1]
    assert isinstance(bad, BadLine) and bad.line == 2 and "limit is 1000" in bad.reason
    assert bad.nbytes == len(big) + 1
    assert [x.line for x in out] == [1, 2, 3]
    # Just under the limit is fine; the limit counts the document, not its newline.
    ok = b'{"id": "z", "p": "' + b"y" * (1000 - 20) + b'"}'
    assert len(ok) == 1000
    assert isinstance(lines(ok + b"\r\n", id_field="id", max_bytes=1000)[0], Doc)


def test_last_line_without_newline() -> None:
    out = lines(b'{"id": "a"}\n{"id": "b"}', id_field="id")
    assert [d.docid for d in out if isinstance(d, Doc)] == ["a", "b"]
