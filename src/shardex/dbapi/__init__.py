"""``shardex.dbapi``: a PEP 249 (DB-API 2.0) module over ``client.query``.

    import shardex.dbapi as db
    with db.connect(dir="mycluster") as conn:
        cur = conn.cursor()
        cur.execute("SELECT name, age FROM users WHERE age > ? ORDER BY age", [40])
        for name, age in cur:
            ...

* ``connect(dir=...)`` opens a client of the local cluster in that directory (closed with
  the connection); ``connect(client=...)`` wraps any object with ``query(sql, params,
  consistency)`` (a ``Client``, or ``shardex.dbapi.local.LocalQueryClient`` for the
  single-process engine) and leaves it open. ``consistency`` applies to every statement
  (default request_plus: reads see every write acknowledged before them).
* Parameters: ``paramstyle = "qmark"``; SQL++ ``$1`` and ``$name`` work as well
  (``shardex.dbapi.params``).
* Rows are tuples in ``description`` order. The columns are the SELECT's projection names
  when the statement fixes them (``SELECT a, b AS c``, ``SELECT *`` -> the keyspace alias,
  ``SELECT RAW x`` -> one column); with ``t.*`` terms the first row's field names are added.
  A field a row lacks (MISSING in SQL++) reads as None; a field of a later row that is not
  a column is not in the tuple: set ``cursor.row_factory = lambda cur, row: row`` to get
  the rows as the server sent them (dicts, or bare values for RAW).
* ``rowcount``: for INSERT/UPSERT/UPDATE/DELETE the number of documents changed (known
  when ``execute`` returns: DML runs to completion there, its RETURNING rows are buffered);
  for SELECT the number of rows once all are fetched, -1 before.
* Transactions: shardex has none; every statement is durable when it returns
  (autocommit). ``commit()`` is a no-op. ``rollback()`` is a no-op when nothing was
  written since the last ``commit``/``rollback``, and otherwise raises
  ``NotSupportedError`` (the writes cannot be undone, and pretending they were would lose
  the caller's data silently).
* ``threadsafety = 1``: threads may share the module, not connections or cursors.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from shardex.dbapi.errors import (
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Warning,
    from_shardex,
)
from shardex.dbapi.local import QueryClient, QueryResultRows
from shardex.dbapi.params import qmarks_to_dollars, to_sqlpp
from shardex.errors import ShardexError
from shardex.sql.syntax import DeleteStmt, InsertStmt, SelectStmt, UpdateStmt, parse_statement
from shardex.sql.syntax.ast import SetOpStmt, WithStmt
from shardex.sql.syntax.bind import bind_select

__all__ = [
    "BINARY",
    "DATETIME",
    "NUMBER",
    "ROWID",
    "STRING",
    "Binary",
    "Connection",
    "Cursor",
    "DataError",
    "DatabaseError",
    "Date",
    "DateFromTicks",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "ProgrammingError",
    "Time",
    "TimeFromTicks",
    "Timestamp",
    "TimestampFromTicks",
    "Warning",
    "apilevel",
    "connect",
    "paramstyle",
    "threadsafety",
]

apilevel: Final = "2.0"
threadsafety: Final = 1
paramstyle: Final = "qmark"

Params = Sequence[Any] | Mapping[str, Any] | None
RowFactory = Callable[["Cursor", Any], Any]


# -- type objects and constructors (PEP 249): JSON has no dates or bytes, so the
# constructors give the values shardex stores for them (ISO-8601 text, lists of ints) ------


class _TypeObject(frozenset[str]):
    """Compares equal to every type code in it (``cursor.description[i][1] == NUMBER``)."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return other in self
        return frozenset.__eq__(self, other)

    def __hash__(self) -> int:
        return frozenset.__hash__(self)


# Type codes in ``description`` are the JSON type names SQL++'s TYPE() returns.
STRING: Final = _TypeObject({"string"})
NUMBER: Final = _TypeObject({"number"})
BINARY: Final = _TypeObject({"binary"})  # never produced: JSON has no bytes
DATETIME: Final = _TypeObject({"string"})  # dates travel as ISO-8601 strings
ROWID: Final = _TypeObject({"string"})  # META().id is a string


def Date(year: int, month: int, day: int) -> str:
    return datetime.date(year, month, day).isoformat()


def Time(hour: int, minute: int, second: int) -> str:
    return datetime.time(hour, minute, second).isoformat()


def Timestamp(year: int, month: int, day: int, hour: int, minute: int, second: int) -> str:
    return datetime.datetime(year, month, day, hour, minute, second).isoformat()


def DateFromTicks(ticks: float) -> str:
    return datetime.date.fromtimestamp(ticks).isoformat()


def TimeFromTicks(ticks: float) -> str:
    return datetime.datetime.fromtimestamp(ticks).time().isoformat()


def TimestampFromTicks(ticks: float) -> str:
    return datetime.datetime.fromtimestamp(ticks).isoformat()


def Binary(data: bytes) -> list[int]:
    return list(bytes(data))


def type_code(value: Any) -> str | None:
    """The JSON type name of a value (None for null: it has no column type)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


# -- connections --------------------------------------------------------------------------


_CONSISTENCIES: Final = ("request_plus", "not_bounded")


def connect(
    dir: str | Path | None = None,
    *,
    client: QueryClient | None = None,
    consistency: str = "request_plus",
    timeout: float = 60.0,
) -> Connection:
    """A connection to the local cluster in ``dir``, or over an open ``client``."""
    if (dir is None) == (client is None):
        raise InterfaceError(
            "connect() needs exactly one of dir=... or client=...",
            details={"hint": "connect(dir='mycluster') or connect(client=c)"},
        )
    if consistency not in _CONSISTENCIES:
        raise ProgrammingError(
            f"consistency must be one of {', '.join(_CONSISTENCIES)}, got {consistency!r}",
            details={"value": repr(consistency), "hint": "at_plus needs Client.query(at=...)"},
        )
    if client is not None:
        return Connection(client, consistency, owns_client=False)
    from shardex.client import connect_local

    try:
        opened = connect_local(Path(dir), name="shardex-dbapi", request_timeout=timeout)  # type: ignore[arg-type]
    except ShardexError as e:
        raise from_shardex(e) from e
    return Connection(opened, consistency, owns_client=True)


class Connection:
    # PEP 249 optional extension: the exception classes as connection attributes.
    Error = Error
    Warning = Warning
    InterfaceError = InterfaceError
    DatabaseError = DatabaseError
    DataError = DataError
    OperationalError = OperationalError
    IntegrityError = IntegrityError
    InternalError = InternalError
    ProgrammingError = ProgrammingError
    NotSupportedError = NotSupportedError

    def __init__(self, client: QueryClient, consistency: str, *, owns_client: bool) -> None:
        self.client = client
        self.consistency = consistency
        self._owns_client = owns_client
        self._closed = False
        self._written = 0  # documents changed since the last commit / rollback

    @property
    def closed(self) -> bool:
        return self._closed

    def _check(self) -> QueryClient:
        if self._closed:
            raise InterfaceError("the connection is closed")
        return self.client

    def cursor(self) -> Cursor:
        return Cursor(self)

    def commit(self) -> None:
        """A no-op: every statement is durable when it returns (autocommit)."""
        self._check()
        self._written = 0

    def rollback(self) -> None:
        """A no-op after reads only; after writes, ``NotSupportedError`` (see the module)."""
        self._check()
        written, self._written = self._written, 0
        if written:
            raise NotSupportedError(
                f"cannot roll back: shardex has no transactions, and the {written} document "
                "change(s) since the last commit are already durable",
                details={"written": written, "hint": "undo the changes with statements"},
            )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        close = getattr(self.client, "close", None)
        if self._owns_client and close is not None:
            close()

    def __enter__(self) -> Connection:
        self._check()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- cursors ------------------------------------------------------------------------------

_DML = (InsertStmt, UpdateStmt, DeleteStmt)
Description = tuple[tuple[str, str | None, None, None, None, None, None], ...]


class Cursor:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.arraysize = 1
        self.row_factory: RowFactory | None = None
        self.description: Description | None = None
        self.rowcount = -1
        self.lastrowid = None  # documents have string ids chosen by the caller
        self.metrics: Any = None  # the last statement's QueryMetrics once its rows are read
        self._closed = False
        self._rows: QueryResultRows | None = None
        self._it: Iterator[Any] | None = None
        self._pending: list[Any] = []  # rows read ahead (the first one, or buffered DML)
        self._columns: list[str] | None = None  # None: the rows are bare values (RAW)

    # -- execution ------------------------------------------------------------------------

    def execute(self, operation: str, parameters: Params = None) -> Cursor:
        client = self._check()
        self._reset()
        sql, params = to_sqlpp(operation, parameters)
        try:
            stmt = parse_statement(sql)
            rows = client.query(sql, params, self.connection.consistency)
            self._rows, self._it = rows, iter(rows)
            select = _first_select(stmt)
            if select is not None:  # a query: its rows stream, named by its first SELECT
                self._describe_select(select)
            else:  # DML, DDL, EXPLAIN: run to completion, so rowcount is known now
                self._pending = list(self._it)
                self._it = None
                self.metrics = rows.metrics
                count = getattr(rows.metrics, "mutation_count", 0) or 0
                self.connection._written += count
                self.rowcount = count if isinstance(stmt, _DML) else -1
                if self._pending:
                    self._describe_first(self._pending[0])
        except ShardexError as e:
            self._reset()
            raise from_shardex(e) from e
        except Error:
            self._reset()
            raise
        return self

    def executemany(self, operation: str, seq_of_parameters: Sequence[Params]) -> Cursor:
        """Runs a DML statement once per parameter set; ``rowcount`` is the total changed."""
        self._check()
        sql, _ = qmarks_to_dollars(operation)
        try:
            stmt = parse_statement(sql)
        except ShardexError as e:
            raise from_shardex(e) from e
        if not isinstance(stmt, _DML):
            raise ProgrammingError(
                "executemany runs INSERT, UPSERT, UPDATE or DELETE statements",
                details={"statement": sql[:200], "hint": "use execute() for a query"},
            )
        total = 0
        for params in seq_of_parameters:
            self.execute(operation, params)
            total += max(self.rowcount, 0)
        self.rowcount = total
        return self

    def _describe_select(self, stmt: SelectStmt) -> None:
        bound = bind_select(stmt)
        first = self._peek()
        if bound.raw:
            self._columns = None
            name = bound.terms[0].name or "$1"
            self.description = ((name, type_code(first), None, None, None, None, None),)
            return
        names = [t.name for t in bound.terms if t.name is not None and not t.star]
        if any(t.star for t in bound.terms) and isinstance(first, dict):
            names += [k for k in first if k not in names]
        self._columns = names
        values = first if isinstance(first, dict) else {}
        self.description = tuple(
            (n, type_code(values.get(n)), None, None, None, None, None) for n in names
        )

    def _describe_first(self, first: Any) -> None:
        """RETURNING, EXPLAIN: the columns are the first row's fields."""
        if isinstance(first, dict):
            self._columns = list(first)
            self.description = tuple(
                (k, type_code(v), None, None, None, None, None) for k, v in first.items()
            )
        else:
            self._columns = None
            self.description = (("$1", type_code(first), None, None, None, None, None),)

    def _peek(self) -> Any:
        row = self._next_raw()
        if row is not _END:
            self._pending.append(row)
            return row
        return None

    # -- fetching -------------------------------------------------------------------------

    def _next_raw(self) -> Any:
        """The next row as the server sent it, or ``_END``."""
        if self._pending:
            return self._pending.pop(0)
        if self._it is None:
            return _END
        try:
            return next(self._it)
        except StopIteration:
            self._it = None
            rows = self._rows
            self.metrics = None if rows is None else rows.metrics
            if self.metrics is not None:
                self.rowcount = self.metrics.result_count
            return _END
        except ShardexError as e:
            self._it = None
            raise from_shardex(e) from e

    def _fetch(self) -> Any:
        self._check()
        if self.description is None:
            raise ProgrammingError(
                "no result set: the last statement returned no rows (or none was executed)"
            )
        row = self._next_raw()
        return row if row is _END else self._shape(row)

    def _shape(self, row: Any) -> Any:
        if self.row_factory is not None:
            return self.row_factory(self, row)
        if self._columns is None or not isinstance(row, dict):
            return (row,)
        return tuple(row.get(c) for c in self._columns)

    def fetchone(self) -> Any:
        row = self._fetch()
        return None if row is _END else row

    def fetchmany(self, size: int | None = None) -> list[Any]:
        n = self.arraysize if size is None else size
        out: list[Any] = []
        while len(out) < n:
            row = self._fetch()
            if row is _END:
                break
            out.append(row)
        return out

    def fetchall(self) -> list[Any]:
        out: list[Any] = []
        while (row := self._fetch()) is not _END:
            out.append(row)
        return out

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        row = self._fetch()
        if row is _END:
            raise StopIteration
        return row

    # -- PEP 249 odds and ends ------------------------------------------------------------

    def setinputsizes(self, sizes: Any) -> None:
        """Accepted and ignored (PEP 249 allows that)."""

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        """Accepted and ignored (PEP 249 allows that)."""

    def callproc(self, procname: str, parameters: Params = None) -> Any:
        raise NotSupportedError(
            f"shardex has no stored procedures (callproc({procname!r}))",
            details={"hint": "run the statements with execute()"},
        )

    def close(self) -> None:
        self._reset()
        self._closed = True

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> QueryClient:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        return self.connection._check()

    def _reset(self) -> None:
        rows = self._rows
        close = getattr(rows, "close", None)
        if self._it is not None and close is not None:
            close()  # stops a query whose rows were not all read
        self._rows, self._it, self._pending = None, None, []
        self._columns, self.description, self.rowcount, self.metrics = None, None, -1, None


_END: Final = object()


def _first_select(stmt: object) -> SelectStmt | None:
    """The SELECT a query's columns are named by: itself, a set operation's first branch
    (as SQL names a union's columns), a WITH statement's query's."""
    if isinstance(stmt, WithStmt):
        stmt = stmt.body
    while isinstance(stmt, SetOpStmt):
        stmt = stmt.branches[0]
    return stmt if isinstance(stmt, SelectStmt) else None
