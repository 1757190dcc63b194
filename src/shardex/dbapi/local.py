"""``LocalQueryClient``: ``LocalEngine`` behind the client's ``query`` signature.

``shardex.dbapi``, the ``shardex sql`` shell and the SQL correctness suite talk to anything
with ``query(sql, params=None, consistency="request_plus")`` returning an iterator of rows
with a ``metrics`` attribute once exhausted: a cluster ``Client`` or this adapter over the
single-process reference engine. It lets those surfaces be tested without a cluster, and
gives the conformance runner one code path for both engines.

    >>> from shardex.sql.local import LocalEngine
    >>> c = LocalQueryClient(LocalEngine())
    >>> c.engine.create_keyspace("users")
    >>> list(c.query("SELECT RAW 1 + $1", [2]))
    [3]
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from shardex.api.scan import CONSISTENCIES
from shardex.client.query import QueryMetrics
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.ddl import BuildIndexStmt, CreateIndexStmt, DropIndexStmt
from shardex.sql.exec.rows import encode_row
from shardex.sql.local import LocalEngine
from shardex.sql.syntax import InsertStmt, Statement, parse_statement

__all__ = ["LocalQueryClient", "LocalRows", "QueryClient", "QueryResultRows"]

Params = Sequence[Any] | Mapping[str, Any] | None


class QueryResultRows(Protocol):
    """What ``query`` returns: rows read once; ``metrics`` set once they are exhausted."""

    metrics: QueryMetrics | None

    def __iter__(self) -> Iterator[Any]: ...


class QueryClient(Protocol):
    def query(
        self, sql: str, params: Params = None, consistency: str = "request_plus", **options: Any
    ) -> QueryResultRows: ...


class LocalRows:
    """The rows of one statement run on ``LocalEngine``, with the cluster's metrics shape."""

    def __init__(self, rows: list[Any], statement: str, mutation_count: int, t0: float) -> None:
        self._rows = rows
        self._statement = statement
        self._mutation_count = mutation_count
        self._t0 = t0
        self._read = False
        self.metrics: QueryMetrics | None = None

    def __iter__(self) -> Iterator[Any]:
        if self._read:
            raise ShardexError(
                "a query's rows can be read once",
                code=ErrorCode.BAD_REQUEST,
                details={"statement": self._statement},
            )
        self._read = True
        return self._gen()

    def _gen(self) -> Iterator[Any]:
        size = 0
        for row in self._rows:
            size += len(encode_row(row))  # what the cluster would have sent
            yield row
        self.metrics = QueryMetrics(
            elapsed=time.monotonic() - self._t0,
            result_count=len(self._rows),
            bytes=size,
            mutation_count=self._mutation_count,
            statement=self._statement,
        )

    def close(self) -> None:
        self._rows = []


def statement_kind(stmt: Statement) -> str:
    """The cluster's name for a statement's kind (``SqlStarted.statement``)."""
    if isinstance(stmt, InsertStmt):
        return "upsert" if stmt.upsert else "insert"
    if isinstance(stmt, CreateIndexStmt | DropIndexStmt | BuildIndexStmt):
        return "ddl"
    return type(stmt).__name__.removesuffix("Stmt").lower()


class LocalQueryClient:
    """A ``QueryClient`` over one in-process ``LocalEngine`` (consistency is checked, then
    moot: the engine's writes are visible at once)."""

    def __init__(self, engine: LocalEngine | None = None) -> None:
        self.engine = engine if engine is not None else LocalEngine()

    def query(
        self, sql: str, params: Params = None, consistency: str = "request_plus", **options: Any
    ) -> LocalRows:
        """``options`` are the cluster's statement options (timeout, durability...): this
        in-process engine has no use for them and runs the statement all the same."""
        t0 = time.monotonic()
        if consistency not in CONSISTENCIES or consistency == "at_plus":
            raise ShardexError(
                f"consistency must be not_bounded or request_plus here, got {consistency!r}",
                code=ErrorCode.BAD_REQUEST,
                details={"value": repr(consistency), "hint": "at_plus needs a cluster"},
            )
        if isinstance(params, Mapping):  # the client accepts "$name" keys too
            params = {str(k).lstrip("$"): v for k, v in params.items()}
        stmt = parse_statement(sql)
        result = self.engine.execute(stmt, params)
        return LocalRows(result.rows, statement_kind(stmt), result.mutation_count, t0)

    def close(self) -> None:
        """Nothing to release; here so the adapter closes like a ``Client``."""
