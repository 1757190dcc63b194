"""Error codes and the exception every shardex caller sees.

One enum of stable names travels on the wire (as the name, never the ordinal, so adding a
code never shifts another). Every error raised to a Python caller is a ``ShardexError``
subclass carrying ``.code``, a message and structured ``details``.
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.StrEnum):
    """Stable error names; the string value is what goes over the wire."""

    INTERNAL = "INTERNAL"
    BAD_REQUEST = "BAD_REQUEST"
    AUTH_FAILED = "AUTH_FAILED"
    PROTOCOL_ERROR = "PROTOCOL_ERROR"
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    TIMEOUT = "TIMEOUT"
    CONNECTION_CLOSED = "CONNECTION_CLOSED"
    UNKNOWN_MESSAGE = "UNKNOWN_MESSAGE"
    NODE_UNAVAILABLE = "NODE_UNAVAILABLE"
    NOT_A_CLUSTER_MEMBER = "NOT_A_CLUSTER_MEMBER"
    CONFIG_ERROR = "CONFIG_ERROR"
    STORAGE_ERROR = "STORAGE_ERROR"
    EXPRESSION_SYNTAX = "EXPRESSION_SYNTAX"
    EXPRESSION_EVAL = "EXPRESSION_EVAL"
    KEYSPACE_NOT_FOUND = "KEYSPACE_NOT_FOUND"
    KEYSPACE_EXISTS = "KEYSPACE_EXISTS"
    DOC_NOT_FOUND = "DOC_NOT_FOUND"
    DOC_EXISTS = "DOC_EXISTS"
    DOC_TOO_LARGE = "DOC_TOO_LARGE"
    CAS_MISMATCH = "CAS_MISMATCH"
    NOT_MY_PARTITION = "NOT_MY_PARTITION"
    ROLLBACK = "ROLLBACK"
    INDEX_NOT_FOUND = "INDEX_NOT_FOUND"
    INDEX_EXISTS = "INDEX_EXISTS"
    INDEX_NOT_READY = "INDEX_NOT_READY"
    INDEX_IN_ROLLBACK = "INDEX_IN_ROLLBACK"
    SNAPSHOT_TOO_OLD = "SNAPSHOT_TOO_OLD"
    SCAN_TIMEOUT = "SCAN_TIMEOUT"
    QUERY_STATE = "QUERY_STATE"
    QUERY_CANCELLED = "QUERY_CANCELLED"
    QUERY_MEMORY_LIMIT = "QUERY_MEMORY_LIMIT"  # a query over its blocking-operator budget
    # a node running and queueing as many statements (fragments) as it is configured to take
    QUERY_OVERLOADED = "QUERY_OVERLOADED"
    # a node with max_connections users' connections open refused one more (nodes never are)
    TOO_MANY_CONNECTIONS = "TOO_MANY_CONNECTIONS"
    SQL_SYNTAX = "SQL_SYNTAX"
    TOPOLOGY_NOT_FOUND = "TOPOLOGY_NOT_FOUND"
    STALE_TOPOLOGY = "STALE_TOPOLOGY"
    # an indexer restarted between a delivery and its stabilise: the batch must be re-sent
    STALE_DELIVERY = "STALE_DELIVERY"
    PARTIAL_FAILURE = "PARTIAL_FAILURE"  # a batch where some items failed (details say which)
    # a durable write whose level cannot hold: too few copies configured or reachable
    DURABILITY_IMPOSSIBLE = "DURABILITY_IMPOSSIBLE"
    # a durable write that timed out waiting for its copies: it may or may not persist
    DURABILITY_AMBIGUOUS = "DURABILITY_AMBIGUOUS"
    # the document has a durable write not yet acknowledged by its copies: retry shortly
    SYNC_WRITE_IN_PROGRESS = "SYNC_WRITE_IN_PROGRESS"
    # this node was failed over: it serves nothing until recovered and rebalanced back in
    NODE_FAILED_OVER = "NODE_FAILED_OVER"


class ShardexError(Exception):
    """Base of every error shardex raises to callers.

    ``details`` holds machine-readable context (the failing value, a position, a hint) so a
    caller can act on it without parsing the message.
    """

    default_code: ErrorCode = ErrorCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code: ErrorCode = code if code is not None else self.default_code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"

    def to_wire(self) -> tuple[str, str, dict[str, Any]]:
        return (self.code.value, self.message, self.details)

    @staticmethod
    def from_wire(code: str, message: str, details: dict[str, Any] | None) -> ShardexError:
        """Rebuild the most specific exception class for a code received from a peer."""
        try:
            ec = ErrorCode(code)
        except ValueError:
            ec = ErrorCode.INTERNAL
            message = f"[{code}] {message}"
        cls = _CLASS_BY_CODE.get(ec, ShardexError)
        return cls(message, code=ec, details=details)


class AuthFailed(ShardexError):
    default_code = ErrorCode.AUTH_FAILED


class ProtocolError(ShardexError):
    default_code = ErrorCode.PROTOCOL_ERROR


class FrameTooLarge(ProtocolError):
    default_code = ErrorCode.FRAME_TOO_LARGE


class RequestTimeout(ShardexError):
    default_code = ErrorCode.TIMEOUT


class ConnectionClosed(ShardexError):
    default_code = ErrorCode.CONNECTION_CLOSED


class NodeUnavailable(ShardexError):
    default_code = ErrorCode.NODE_UNAVAILABLE


class ConfigError(ShardexError):
    default_code = ErrorCode.CONFIG_ERROR


class StorageError(ShardexError):
    default_code = ErrorCode.STORAGE_ERROR


class ExpressionSyntaxError(ShardexError):
    default_code = ErrorCode.EXPRESSION_SYNTAX


class ExpressionEvalError(ShardexError):
    default_code = ErrorCode.EXPRESSION_EVAL


_CLASS_BY_CODE: dict[ErrorCode, type[ShardexError]] = {
    cls.default_code: cls
    for cls in (
        AuthFailed,
        ProtocolError,
        FrameTooLarge,
        RequestTimeout,
        ConnectionClosed,
        NodeUnavailable,
        ConfigError,
        StorageError,
        ExpressionSyntaxError,
        ExpressionEvalError,
    )
}
