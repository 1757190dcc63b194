"""Errors of the N1QL query service: Couchbase's numeric codes and the HTTP status each
answers with (docs/decisions/0116-n1ql-query-service.md).

A request's own mistakes carry the code Couchbase's query service gives them (1050 no
statement, 1065 unknown parameter, 1080 timeout, 3000 syntax error, ...). A ``ShardexError``
raised by the statement keeps its shardex code in the error's ``reason`` and gets the
nearest Couchbase code and an HTTP status from ``_BY_CODE``; anything else is 5000 / 500.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from shardex.errors import ErrorCode, ShardexError

__all__ = [
    "E_AUTH",
    "E_BAD_VALUE",
    "E_CANCELLED",
    "E_HTTP_REQUEST",
    "E_INTERNAL",
    "E_METHOD",
    "E_MISSING",
    "E_MULTIPLE",
    "E_NOT_IMPLEMENTED",
    "E_READONLY",
    "E_TIMEOUT",
    "E_TYPE",
    "E_UNAVAILABLE",
    "E_UNKNOWN_PARAMETER",
    "E_UNKNOWN_VALUE",
    "N1qlError",
    "of_http_status",
    "of_shardex",
]

E_READONLY: Final = 1000
E_METHOD: Final = 1010
E_NOT_IMPLEMENTED: Final = 1020
E_UNKNOWN_VALUE: Final = 1030
E_BAD_VALUE: Final = 1040
E_MISSING: Final = 1050
E_MULTIPLE: Final = 1060
E_UNKNOWN_PARAMETER: Final = 1065
E_TYPE: Final = 1070
E_TIMEOUT: Final = 1080
E_HTTP_REQUEST: Final = 1130  # the HTTP request itself: size caps, unknown path, framing
E_UNAVAILABLE: Final = 1182
E_SYNTAX: Final = 3000
E_PLAN: Final = 4000
E_INTERNAL: Final = 5000
E_EVALUATION: Final = 5010
E_MEMORY: Final = 5500
E_AUTH: Final = 10000
E_KEYSPACE: Final = 12003
E_DML: Final = 12009
E_PRIVILEGE: Final = 13014
# Couchbase reports a stopped request by its status ("stopped"); its error's code is ours.
E_CANCELLED: Final = 1181


@dataclasses.dataclass
class N1qlError(Exception):
    """One entry of the envelope's ``errors`` and the HTTP status it answers with (when
    the response has not started yet). ``status``: the envelope's (fatal, timeout,
    stopped, errors)."""

    code: int
    msg: str
    http: int = 400
    status: str = "fatal"
    reason: dict[str, Any] | None = None

    def __str__(self) -> str:
        return f"{self.code}: {self.msg}"

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "msg": self.msg}
        if self.reason:
            out["reason"] = self.reason
        return out


# shardex code -> (Couchbase code, HTTP status, envelope status)
_BY_CODE: Final[dict[ErrorCode, tuple[int, int, str]]] = {
    ErrorCode.SQL_SYNTAX: (E_SYNTAX, 400, "fatal"),
    ErrorCode.EXPRESSION_SYNTAX: (E_SYNTAX, 400, "fatal"),
    ErrorCode.BAD_REQUEST: (E_BAD_VALUE, 400, "fatal"),
    ErrorCode.CONFIG_ERROR: (E_BAD_VALUE, 400, "fatal"),
    ErrorCode.KEYSPACE_NOT_FOUND: (E_KEYSPACE, 404, "fatal"),
    ErrorCode.INDEX_NOT_FOUND: (E_PLAN, 404, "fatal"),
    ErrorCode.AUTH_FAILED: (E_PRIVILEGE, 403, "fatal"),
    ErrorCode.TIMEOUT: (E_TIMEOUT, 504, "timeout"),
    ErrorCode.SCAN_TIMEOUT: (E_TIMEOUT, 504, "timeout"),
    ErrorCode.QUERY_CANCELLED: (E_CANCELLED, 200, "stopped"),
    ErrorCode.QUERY_OVERLOADED: (E_UNAVAILABLE, 503, "fatal"),
    ErrorCode.TOO_MANY_CONNECTIONS: (E_UNAVAILABLE, 503, "fatal"),
    ErrorCode.NODE_UNAVAILABLE: (E_UNAVAILABLE, 503, "fatal"),
    ErrorCode.INDEX_NOT_READY: (E_UNAVAILABLE, 503, "fatal"),
    ErrorCode.QUERY_MEMORY_LIMIT: (E_MEMORY, 500, "fatal"),
    ErrorCode.EXPRESSION_EVAL: (E_EVALUATION, 500, "fatal"),
    ErrorCode.DOC_EXISTS: (E_DML, 409, "fatal"),
    ErrorCode.CAS_MISMATCH: (E_DML, 409, "fatal"),
    ErrorCode.DOC_TOO_LARGE: (E_DML, 400, "fatal"),
}


def of_shardex(exc: ShardexError) -> N1qlError:
    """The service's error for a statement's ``ShardexError``: its message, its shardex
    code and details (JSON-safe) as the reason."""
    code, http, status = _BY_CODE.get(exc.code, (E_INTERNAL, 500, "fatal"))
    if exc.code == ErrorCode.AUTH_FAILED and "privilege" not in exc.details:
        code, http = E_AUTH, 401
    reason = {"shardex_code": exc.code.value, **{k: _plain(v) for k, v in exc.details.items()}}
    return N1qlError(code, exc.message, http, status, reason)


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def of_http_status(status: int) -> int:
    """The code of an error the HTTP layer answers by itself (405, 413, 431, 503, ...)."""
    if status == 405:
        return E_METHOD
    if status == 503:
        return E_UNAVAILABLE
    return E_HTTP_REQUEST
