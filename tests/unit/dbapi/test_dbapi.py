"""``shardex.dbapi`` (PEP 249) over ``LocalQueryClient``: the same ``query`` interface as a
cluster ``Client``, so the module is tested without a cluster (the cluster call is in
tests/spark/test_sql_surfaces.py)."""

from __future__ import annotations

from typing import Any

import pytest

import shardex.dbapi as db
from shardex.dbapi.local import LocalQueryClient
from shardex.dbapi.params import to_sqlpp
from shardex.errors import ErrorCode, ShardexError

INSERT = 'INSERT INTO users (KEY, VALUE) VALUES (?, {"name": ?, "age": ?})'
PEOPLE = [("u1", "ann", 41), ("u2", "bob", 17), ("u3", "cy", None), ("u4", "dee", 30)]


class Recorder(LocalQueryClient):
    """Remembers what reached ``query`` (the statement after the placeholder rewrite)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any, str]] = []

    def query(self, sql: str, params: Any = None, consistency: str = "request_plus") -> Any:
        self.calls.append((sql, params, consistency))
        return super().query(sql, params, consistency)


@pytest.fixture
def client() -> Recorder:
    c = Recorder()
    c.engine.create_keyspace("users")
    c.engine.execute("CREATE PRIMARY INDEX ON users")
    return c


@pytest.fixture
def conn(client: Recorder) -> db.Connection:
    conn = db.connect(client=client)
    conn.cursor().executemany(INSERT, PEOPLE)
    return conn


def test_module_globals() -> None:
    assert db.apilevel == "2.0"
    assert db.threadsafety == 1
    assert db.paramstyle == "qmark"
    for name in ("Warning", "Error", "InterfaceError", "DatabaseError", "DataError"):
        assert issubclass(getattr(db, name), Exception)
    for name in ("DataError", "OperationalError", "IntegrityError", "InternalError"):
        assert issubclass(getattr(db, name), db.DatabaseError)
    assert issubclass(db.ProgrammingError, db.DatabaseError)
    assert issubclass(db.NotSupportedError, db.DatabaseError)
    assert issubclass(db.DatabaseError, db.Error)
    assert db.Date(2024, 2, 29) == "2024-02-29"
    assert db.Timestamp(2024, 2, 29, 1, 2, 3) == "2024-02-29T01:02:03"
    assert db.Binary(b"\x00\xff") == [0, 255]


def test_qmark_rewrite_skips_strings_identifiers_and_comments() -> None:
    sql, params = to_sqlpp(
        "SELECT '?', `a?b` FROM t /* ? */ WHERE x = ? -- ?\n AND y IN [?, \"?\"]", [1, 2]
    )
    assert sql == "SELECT '?', `a?b` FROM t /* ? */ WHERE x = $1 -- ?\n AND y IN [$2, \"?\"]"
    assert params == [1, 2]
    # SQL++'s own placeholders pass through; "$name" keys lose their "$".
    assert to_sqlpp("SELECT $1, $2", (1, 2)) == ("SELECT $1, $2", [1, 2])
    assert to_sqlpp("SELECT $a", {"$a": 1}) == ("SELECT $a", {"a": 1})


@pytest.mark.parametrize(
    ("sql", "params", "text"),
    [
        ("SELECT ? + ?", [1], "2 ? placeholder(s), 1 supplied"),
        ("SELECT ?", None, "1 ? placeholder(s), none supplied"),
        ("SELECT ?", {"a": 1}, "a mapping supplied"),
        ("SELECT ? + $1", [1, 2], "mixes ? with $1 at line 1, column 12"),
        ("SELECT 1", "ab", "parameters must be a sequence or a mapping, not str"),
        ("SELECT 'open ?", [1], "unterminated"),
    ],
)
def test_bad_parameters_are_programming_errors(
    conn: db.Connection, client: Recorder, sql: str, params: Any, text: str
) -> None:
    before = len(client.calls)
    with pytest.raises(db.ProgrammingError, match=None) as info:
        conn.cursor().execute(sql, params)
    assert text in str(info.value)
    assert len(client.calls) == before  # refused before anything was sent


def test_select_description_rows_and_rowcount(conn: db.Connection, client: Recorder) -> None:
    cur = conn.cursor()
    cur.execute("SELECT name, age, nick FROM users WHERE age > ? ORDER BY age", [18])
    assert client.calls[-1][0] == "SELECT name, age, nick FROM users WHERE age > $1 ORDER BY age"
    assert client.calls[-1][2] == "request_plus"
    assert [d[0] for d in cur.description] == ["name", "age", "nick"]
    assert [d[1] for d in cur.description] == ["string", "number", None]
    assert cur.description[0][1] == db.STRING and cur.description[1][1] == db.NUMBER
    assert cur.rowcount == -1  # not known until every row is read
    assert cur.fetchone() == ("dee", 30, None)  # nick is MISSING: None
    assert cur.fetchall() == [("ann", 41, None)]
    assert cur.rowcount == 2
    assert cur.metrics is not None and cur.metrics.result_count == 2
    assert cur.fetchone() is None
    assert cur.fetchall() == []


def test_fetchmany_arraysize_and_iteration(conn: db.Connection) -> None:
    cur = conn.cursor()
    cur.execute("SELECT RAW name FROM users ORDER BY name")
    assert cur.description is not None and cur.description[0][0] == "name"
    assert cur.fetchmany() == [("ann",)]  # arraysize 1
    cur.arraysize = 2
    assert cur.fetchmany() == [("bob",), ("cy",)]
    assert cur.fetchmany(5) == [("dee",)]
    assert cur.fetchmany(5) == []
    cur.execute("SELECT META().id AS id FROM users WHERE age IS NULL")
    assert list(cur) == [("u3",)]


def test_star_terms_take_the_first_rows_fields_and_row_factory(conn: db.Connection) -> None:
    cur = conn.cursor()
    cur.execute("SELECT u.*, META(u).id AS id FROM users AS u ORDER BY id")
    assert [d[0] for d in cur.description] == ["id", "name", "age"]
    assert cur.fetchone() == ("u1", "ann", 41)
    cur.row_factory = lambda _cur, row: row
    assert cur.fetchone() == {"name": "bob", "age": 17, "id": "u2"}
    cur.execute("SELECT * FROM users WHERE name = 'cy'")
    assert cur.fetchall() == [{"users": {"name": "cy", "age": None}}]  # factory still set


def test_empty_select_has_a_description(conn: db.Connection) -> None:
    cur = conn.cursor()
    cur.execute("SELECT name FROM users WHERE age > 1000")
    assert [d[0] for d in cur.description] == ["name"]
    assert cur.fetchall() == [] and cur.rowcount == 0


def test_dml_rowcount_returning_and_executemany(conn: db.Connection, client: Recorder) -> None:
    cur = conn.cursor()
    cur.execute("UPDATE users SET age = age + 1 WHERE age >= ? RETURNING name, age", [30])
    assert cur.rowcount == 2
    assert sorted(cur.fetchall()) == [("ann", 42), ("dee", 31)]
    cur.execute("DELETE FROM users WHERE name = $1", ["bob"])
    assert cur.rowcount == 1 and cur.description is None
    with pytest.raises(db.ProgrammingError, match="no result set"):
        cur.fetchone()
    cur.executemany("UPSERT INTO users (KEY, VALUE) VALUES (?, {'n': ?})", [("x", 1), ("y", 2)])
    assert cur.rowcount == 2
    assert client.engine.keyspaces["users"]["y"] == {"n": 2}
    with pytest.raises(db.ProgrammingError, match="executemany runs INSERT"):
        cur.executemany("SELECT ?", [[1]])


def test_errors_map_from_shardex_codes(conn: db.Connection, client: Recorder) -> None:
    cur = conn.cursor()
    with pytest.raises(db.ProgrammingError) as info:
        cur.execute("SELECT name FROM users WHERE\n age >")
    e = info.value
    assert e.code is ErrorCode.SQL_SYNTAX and e.details["line"] == 2
    assert isinstance(e.__cause__, ShardexError)
    with pytest.raises(db.ProgrammingError) as info:
        cur.execute("SELECT * FROM nowhere")
    assert info.value.code is ErrorCode.KEYSPACE_NOT_FOUND
    with pytest.raises(db.ProgrammingError) as info:
        cur.execute("SELECT name FROM users WHERE age = $1 AND name = $2", [1])
    assert info.value.details["expected"] == 2
    with pytest.raises(db.IntegrityError) as info:
        cur.execute(INSERT, ["u1", "again", 1])
    assert info.value.code is ErrorCode.DOC_EXISTS
    assert client.engine.keyspaces["users"]["u1"]["name"] == "ann"  # nothing changed
    with pytest.raises(db.ProgrammingError, match="got 'eventually'"):
        db.connect(client=client, consistency="eventually")
    with pytest.raises(db.NotSupportedError):
        cur.callproc("p")
    # The cursor still works after every error.
    cur.execute("SELECT COUNT(*) AS n FROM users")
    assert cur.fetchall() == [(4,)]


def test_error_class_for_every_code() -> None:
    from shardex.dbapi.errors import error_class

    assert error_class(ErrorCode.EXPRESSION_EVAL) is db.DataError
    assert error_class(ErrorCode.SCAN_TIMEOUT) is db.OperationalError
    assert error_class(ErrorCode.QUERY_MEMORY_LIMIT) is db.OperationalError
    assert error_class(ErrorCode.QUERY_OVERLOADED) is db.OperationalError
    assert error_class(ErrorCode.TOO_MANY_CONNECTIONS) is db.OperationalError
    assert error_class(ErrorCode.NODE_UNAVAILABLE) is db.OperationalError
    assert error_class(ErrorCode.CAS_MISMATCH) is db.IntegrityError
    assert error_class(ErrorCode.INTERNAL) is db.InternalError
    for code in ErrorCode:
        assert issubclass(error_class(code), db.DatabaseError)


def test_commit_rollback_close_and_context_managers(client: Recorder) -> None:
    with db.connect(client=client, consistency="not_bounded") as conn:
        cur = conn.cursor()
        cur.execute("SELECT 1 AS one")
        assert client.calls[-1][2] == "not_bounded"
        conn.rollback()  # nothing written: a no-op
        cur.execute(INSERT, ["z", "zed", 1])
        with pytest.raises(db.NotSupportedError, match="1 document change"):
            conn.rollback()
        assert "z" in client.engine.keyspaces["users"]  # the write stays
        cur.execute(INSERT, ["z2", "zed", 1])
        conn.commit()
        conn.rollback()  # committed: nothing to roll back
        with conn.cursor() as other:
            other.execute("SELECT 1 AS one")
        with pytest.raises(db.InterfaceError, match="cursor is closed"):
            other.fetchone()
    assert conn.closed
    with pytest.raises(db.InterfaceError, match="connection is closed"):
        cur.execute("SELECT 1")
    with pytest.raises(db.InterfaceError, match="exactly one of"):
        db.connect()


def test_connect_dir_errors_are_dbapi_errors(tmp_path: Any) -> None:
    with pytest.raises(db.Error) as info:
        db.connect(dir=tmp_path / "no-cluster")
    assert info.value.code is not None


def test_set_operations_and_with_stream_and_are_described(conn: db.Connection) -> None:
    cur = conn.cursor()
    cur.execute(
        "SELECT name, age FROM users WHERE age > ? UNION ALL SELECT name, age FROM users "
        "WHERE age IS NULL ORDER BY name",
        [20],
    )
    assert [d[0] for d in cur.description] == ["name", "age"]
    assert cur.rowcount == -1
    assert cur.fetchall() == [("ann", 41), ("cy", None), ("dee", 30)]
    cur.execute("WITH old AS (SELECT RAW age FROM users WHERE age > 35) SELECT RAW a FROM old AS a")
    assert cur.description[0][0] == "a" and cur.fetchall() == [(41,)]
