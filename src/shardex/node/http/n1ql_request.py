"""A ``/query/service`` request's parameters, as Couchbase's N1QL REST API takes them.

Parameters arrive in the URL's query string, a form body (``application/x-www-form-urlencoded``,
what ``curl -d`` sends) or a JSON object body. In a form or a query string every value is
text: ``args`` and ``$name`` values are JSON text, booleans are ``true``/``false``; in a JSON
body they are JSON values. Named parameters are ``$name`` or ``@name``. A parameter given twice
is 1060, one the service does not know 1065, a value of the wrong type 1070, an unknown
value 1030 (``scan_consistency=statement_plus``), a bad one 1040.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from shardex.api.scan import AT_PLUS, CONSISTENCIES, NOT_BOUNDED, REQUEST_PLUS
from shardex.node.http.n1ql_errors import (
    E_BAD_VALUE,
    E_MISSING,
    E_MULTIPLE,
    E_TYPE,
    E_UNKNOWN_PARAMETER,
    E_UNKNOWN_VALUE,
    N1qlError,
)
from shardex.node.http.wire import Request

__all__ = ["DEFAULT_TIMEOUT", "QueryRequest", "parse_duration", "query_request"]

DEFAULT_TIMEOUT: Final = 60.0  # seconds, as the RPC path's default
MAX_CLIENT_CONTEXT_ID: Final = 256
# Known parameters without an effect here: accepted so Couchbase clients that always send
# them work (``pretty``: output is one row per line either way).
_IGNORED: Final = frozenset({"pretty", "encoding", "format", "namespace"})
_KNOWN: Final = frozenset(
    {
        "statement",
        "args",
        "scan_consistency",
        "scan_vector",
        "timeout",
        "readonly",
        "client_context_id",
        "metrics",
        "signature",
    }
    | _IGNORED
)
_DURATION_RE: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


@dataclasses.dataclass
class QueryRequest:
    statement: str
    params: list[Any] | dict[str, Any] | None = None
    consistency: str = NOT_BOUNDED
    scan_vector: dict[int, tuple[int, int]] | None = None
    timeout: float = DEFAULT_TIMEOUT
    timeout_text: str = ""
    readonly: bool = False
    client_context_id: str | None = None
    metrics: bool = True
    signature: bool = True


@functools.lru_cache(maxsize=256)  # a client sends the same few timeouts
def parse_duration(text: str) -> float:
    """Seconds of a Go duration as N1QL takes it ("10s", "500ms", "1m30s"); 1040 if not."""
    s = text.strip()
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise N1qlError(
            E_BAD_VALUE,
            f'timeout {text[:40]!r} is not a duration: give e.g. "10s", "500ms" or "1m30s"',
        )
    return total


def query_request(req: Request) -> QueryRequest:
    """The request's parameters, checked (``N1qlError`` for the first mistake)."""
    values = _collect(req)
    unknown = sorted(k for k in values if k not in _KNOWN and k[:1] not in "$@")
    if unknown:
        raise N1qlError(E_UNKNOWN_PARAMETER, f"Unrecognized parameter in request: {unknown[0]}")
    statement = values.get("statement")
    if statement is None or (isinstance(statement, str) and not statement.strip()):
        raise N1qlError(E_MISSING, "No statement or prepared value")
    out = QueryRequest(statement=_string("statement", statement))
    out.params = _params(values)
    _consistency(out, values)
    if "timeout" in values:
        out.timeout_text = _string("timeout", values["timeout"])
        out.timeout = parse_duration(out.timeout_text)
        if out.timeout <= 0:  # N1QL's 0: no timeout; here the service's longest
            out.timeout, out.timeout_text = 0.0, ""
    out.readonly = _flag("readonly", values.get("readonly", False))
    out.metrics = _flag("metrics", values.get("metrics", True))
    out.signature = _flag("signature", values.get("signature", True))
    if "client_context_id" in values:
        ctx = _string("client_context_id", values["client_context_id"])
        if len(ctx) > MAX_CLIENT_CONTEXT_ID or '"' in ctx or "\\" in ctx:
            raise N1qlError(
                E_BAD_VALUE,
                f"client_context_id must be at most {MAX_CLIENT_CONTEXT_ID} characters "
                'without " or \\',
            )
        out.client_context_id = ctx
    return out


def _collect(req: Request) -> dict[str, Any]:
    """The parameters of the query string and the body, one value each (1060 on a repeat);
    ``$name``/``args`` values of text sources decoded from JSON text."""
    pairs: list[tuple[str, Any, bool]] = [(k, v, True) for k, v in req.query]
    if req.body:
        if req.content_type == "application/json":
            try:
                body = _json(req.body)
            except (ValueError, UnicodeDecodeError) as e:
                raise N1qlError(E_BAD_VALUE, f"Error processing JSON request body: {e}") from None
            if not isinstance(body, dict):
                raise N1qlError(E_TYPE, "a JSON request body must be an object of parameters")
            if not pairs:  # the body alone: its keys are one each already
                return body
            pairs += [(k, v, False) for k, v in body.items()]
        else:
            try:
                text = req.body.decode("utf-8")
            except UnicodeDecodeError:
                raise N1qlError(E_BAD_VALUE, "the form body is not UTF-8") from None
            pairs += [(k, v, True) for k, v in urllib.parse.parse_qsl(text, keep_blank_values=True)]
    out: dict[str, Any] = {}
    for key, value, textual in pairs:
        if key in out:
            raise N1qlError(E_MULTIPLE, f"Multiple values for {key}.")
        if textual and (key == "args" or key[:1] in "$@" or key == "scan_vector"):
            value = _json_text(key, value)
        out[key] = value
    return out


_decode: Final = msgspec.json.Decoder().decode


def _json(data: bytes | str) -> Any:
    """``json.loads(data)``, decoded by msgspec when it can (faster): where
    msgspec declines (NaN, a number past a double, a lone surrogate, a BOM, UTF-16 ...),
    ``json.loads`` decodes it or raises its own error, so values and messages are its."""
    try:
        return _decode(data)
    except msgspec.DecodeError:
        return json.loads(data)


def _json_text(key: str, text: str) -> Any:
    try:
        return _json(text)
    except ValueError:
        raise N1qlError(
            E_BAD_VALUE, f"Error processing {key}: {text[:60]!r} is not JSON text"
        ) from None


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise N1qlError(E_TYPE, f"{key} has to be of type string")
    return value


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise N1qlError(E_TYPE, f"{key} has to be of type boolean")


def _params(values: dict[str, Any]) -> list[Any] | dict[str, Any] | None:
    named = {k[1:]: v for k, v in values.items() if k[:1] in "$@"}
    if "args" in values:
        if not isinstance(values["args"], list):
            raise N1qlError(E_TYPE, "args has to be of type array")
        if named:
            raise N1qlError(
                E_BAD_VALUE,
                "Error processing parameters: give positional args or $name parameters, not both",
            )
        return list(values["args"])
    return named or None


def _consistency(out: QueryRequest, values: dict[str, Any]) -> None:
    level = _string("scan_consistency", values.get("scan_consistency", NOT_BOUNDED)).lower()
    if level not in CONSISTENCIES:
        raise N1qlError(
            E_UNKNOWN_VALUE,
            f"Unknown scan_consistency value: {level[:40]} (one of {', '.join(CONSISTENCIES)})",
        )
    out.consistency = level
    vector = values.get("scan_vector")
    if level == AT_PLUS:
        if vector is None:
            raise N1qlError(E_MISSING, "No scan_vector value: at_plus needs one")
        out.scan_vector = _scan_vector(vector)
    elif vector is not None and level != REQUEST_PLUS:
        raise N1qlError(E_BAD_VALUE, "scan_vector is only for scan_consistency=at_plus")


def _scan_vector(vector: Any) -> dict[int, tuple[int, int]]:
    """Couchbase's sparse form ``{"partition": [seqno, "uuid"]}`` or its full form (a list,
    the entry of partition i at i); the uuid may be a number or its decimal text."""
    if isinstance(vector, dict):
        items: Iterable[tuple[Any, Any]] = vector.items()
    elif isinstance(vector, list):
        items = enumerate(vector)
    else:
        raise N1qlError(E_TYPE, "scan_vector has to be of type array or object")
    out: dict[int, tuple[int, int]] = {}
    for part, entry in items:
        try:
            p = int(part)
            if not isinstance(entry, list) or len(entry) != 2:
                raise ValueError
            seqno, uuid = int(entry[0]), int(entry[1])
            if p < 0 or seqno < 0 or uuid < 0:
                raise ValueError
        except (TypeError, ValueError):
            raise N1qlError(
                E_BAD_VALUE,
                f"Error processing scan_vector entry {str(part)[:20]}: give "
                '{"partition": [seqno, "uuid"]}',
            ) from None
        out[p] = (seqno, uuid)
    return out
