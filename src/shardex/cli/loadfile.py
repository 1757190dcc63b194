"""Reading a JSON Lines file for ``shardex load``: one document per line, bad lines reported.

Pure functions (no network, no terminal) so the rules are unit-tested on their own:

* a blank line (only whitespace) is skipped silently: editors and ``cat`` leave them;
* a line over ``max_bytes`` is refused before it is parsed (DOC_TOO_LARGE);
* a line must parse as JSON and be an object;
* with ``id_field`` the docid is that top-level field, a non-empty string or an integer
  (written as decimal text); otherwise a random uuid4 hex is generated per line;
* a good line's document is forwarded as the line's own bytes, never re-encoded.

Each line yields either a ``Doc`` or a ``BadLine``, with its 1-based line number and its size
in bytes (for a progress bar over the file size).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import msgspec

from shardex.api.validation import DEFAULT_MAX_DOC_BYTES, MAX_DOCID_BYTES


@dataclass(frozen=True, slots=True)
class Doc:
    line: int
    nbytes: int
    docid: str
    body: bytes


@dataclass(frozen=True, slots=True)
class BadLine:
    line: int
    nbytes: int
    reason: str


_decoder = msgspec.json.Decoder()


def _docid(doc: dict[str, object], id_field: str) -> str:
    if id_field not in doc:
        raise ValueError(f"missing id field {id_field!r}")
    value = doc[id_field]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(
            f"id field {id_field!r} must be a string or an integer, got {type(value).__name__}"
        )
    docid = str(value)
    if not docid:
        raise ValueError(f"id field {id_field!r} is empty")
    if len(docid.encode("utf-8", "surrogatepass")) > MAX_DOCID_BYTES:
        raise ValueError(f"id field {id_field!r} is longer than {MAX_DOCID_BYTES} bytes")
    return docid


def parse_line(
    raw: bytes, line_no: int, *, id_field: str | None, max_bytes: int = DEFAULT_MAX_DOC_BYTES
) -> Doc | BadLine | None:
    """One line (with or without its newline); None for a blank line."""
    nbytes = len(raw)
    body = raw.strip()
    if not body:
        return None
    if len(body) > max_bytes:
        return BadLine(line_no, nbytes, f"document is {len(body)} bytes, the limit is {max_bytes}")
    try:
        doc = _decoder.decode(body)
    except msgspec.DecodeError as exc:
        return BadLine(line_no, nbytes, f"not valid JSON: {exc}")
    if not isinstance(doc, dict):
        return BadLine(line_no, nbytes, f"not a JSON object (got {_json_type(doc)})")
    if id_field is None:
        return Doc(line_no, nbytes, uuid.uuid4().hex, body)
    try:
        return Doc(line_no, nbytes, _docid(doc, id_field), body)
    except ValueError as exc:
        return BadLine(line_no, nbytes, str(exc))


def read_lines(
    fh: BinaryIO, *, id_field: str | None, max_bytes: int = DEFAULT_MAX_DOC_BYTES
) -> Iterator[Doc | BadLine]:
    """Every non-blank line of ``fh`` as a ``Doc`` or ``BadLine``.

    A line far over the limit is not held in memory whole: it is read in pieces and
    discarded, and reported as too large."""
    line_no = 0
    limit = max_bytes + 2  # the document plus a CRLF
    while True:
        raw = fh.readline(limit + 1)
        if not raw:
            return
        line_no += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            total = len(raw)
            while raw and not raw.endswith(b"\n"):
                raw = fh.readline(1 << 20)
                total += len(raw)
            yield BadLine(line_no, total, f"line is {total} bytes, the limit is {max_bytes}")
            continue
        item = parse_line(raw, line_no, id_field=id_field, max_bytes=max_bytes)
        if item is not None:
            yield item


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"
