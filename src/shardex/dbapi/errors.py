"""The PEP 249 exception hierarchy of ``shardex.dbapi`` and how ``ShardexError`` codes map
onto it.

Every DB-API error raised for a server or client failure chains the original
``ShardexError`` (``__cause__``) and copies its ``code`` and ``details`` (line, column, the
failing value, a hint), so a caller can act on either.
"""

from __future__ import annotations

from typing import Any

from shardex.errors import ErrorCode, ShardexError

__all__ = [
    "DataError",
    "DatabaseError",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "ProgrammingError",
    "Warning",
    "from_shardex",
]


class Warning(Exception):  # the name PEP 249 requires (shadows the builtin here only)
    """Important warnings (PEP 249); shardex raises none today."""


class Error(Exception):
    """Base of every DB-API error. ``code``: the ``ErrorCode`` (None for errors of the
    DB-API layer itself); ``details``: the structured context of the ``ShardexError``."""

    def __init__(
        self, message: str, *, code: ErrorCode | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details: dict[str, Any] = dict(details or {})


class InterfaceError(Error):
    """Misuse of the interface itself: a closed connection or cursor, fetch before execute."""


class DatabaseError(Error):
    """Errors of the database."""


class DataError(DatabaseError):
    """A value the statement cannot process (an evaluation error, a document too large)."""


class OperationalError(DatabaseError):
    """The cluster could not serve the statement now: timeouts, unavailable nodes, an index
    not ready or rolling back, a cancelled query, the query memory limit."""


class IntegrityError(DatabaseError):
    """A write conflicts with existing data: a duplicate document key, a CAS mismatch."""


class InternalError(DatabaseError):
    """An internal error of the cluster (a protocol or storage failure)."""


class ProgrammingError(DatabaseError):
    """A statement error: syntax, an unknown keyspace or index, wrong parameters."""


class NotSupportedError(DatabaseError):
    """A DB-API feature shardex does not have (transactions, stored procedures)."""


_BY_CODE: dict[ErrorCode, type[Error]] = {
    ErrorCode.SQL_SYNTAX: ProgrammingError,
    ErrorCode.EXPRESSION_SYNTAX: ProgrammingError,
    ErrorCode.BAD_REQUEST: ProgrammingError,
    ErrorCode.KEYSPACE_NOT_FOUND: ProgrammingError,
    ErrorCode.KEYSPACE_EXISTS: ProgrammingError,
    ErrorCode.INDEX_NOT_FOUND: ProgrammingError,
    ErrorCode.INDEX_EXISTS: ProgrammingError,
    ErrorCode.CONFIG_ERROR: ProgrammingError,
    ErrorCode.EXPRESSION_EVAL: DataError,
    ErrorCode.DOC_TOO_LARGE: DataError,
    ErrorCode.DOC_EXISTS: IntegrityError,
    ErrorCode.CAS_MISMATCH: IntegrityError,
    ErrorCode.DOC_NOT_FOUND: IntegrityError,
    ErrorCode.TIMEOUT: OperationalError,
    ErrorCode.SCAN_TIMEOUT: OperationalError,
    ErrorCode.NODE_UNAVAILABLE: OperationalError,
    ErrorCode.CONNECTION_CLOSED: OperationalError,
    ErrorCode.NOT_A_CLUSTER_MEMBER: OperationalError,
    ErrorCode.AUTH_FAILED: OperationalError,
    ErrorCode.NOT_MY_PARTITION: OperationalError,
    ErrorCode.ROLLBACK: OperationalError,
    ErrorCode.INDEX_NOT_READY: OperationalError,
    ErrorCode.INDEX_IN_ROLLBACK: OperationalError,
    ErrorCode.SNAPSHOT_TOO_OLD: OperationalError,
    ErrorCode.QUERY_STATE: OperationalError,
    ErrorCode.QUERY_CANCELLED: OperationalError,
    ErrorCode.QUERY_MEMORY_LIMIT: OperationalError,
    ErrorCode.QUERY_OVERLOADED: OperationalError,
    ErrorCode.TOO_MANY_CONNECTIONS: OperationalError,
    ErrorCode.TOPOLOGY_NOT_FOUND: OperationalError,
    ErrorCode.STALE_TOPOLOGY: OperationalError,
    ErrorCode.STALE_DELIVERY: OperationalError,
    ErrorCode.PARTIAL_FAILURE: DatabaseError,
}


def error_class(code: ErrorCode) -> type[Error]:
    """The DB-API class for a ``ShardexError`` code; anything unlisted (INTERNAL, protocol,
    storage, unknown messages) is an ``InternalError``."""
    return _BY_CODE.get(code, InternalError)


def from_shardex(e: ShardexError) -> Error:
    """The DB-API error for ``e`` (raise it ``from e``)."""
    return error_class(e.code)(str(e), code=e.code, details=e.details)
