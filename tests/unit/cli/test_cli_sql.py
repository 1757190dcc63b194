"""``shardex sql``: the shell's line handling, rendering and error display over
``LocalQueryClient`` (the cluster ``--json`` path is in tests/spark/test_sql_surfaces.py)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from shardex.cli import sql as cli_sql
from shardex.cli.sql import (
    Shell,
    StatementBuffer,
    columns_of,
    describe_metrics,
    format_error,
    interactive,
    parse_bytes,
    parse_params,
    render_rows,
    statement_options,
)
from shardex.dbapi.local import LocalQueryClient
from shardex.errors import ErrorCode, ShardexError


def feed_all(buf: StatementBuffer, lines: list[str]) -> list[str]:
    return [s for line in lines for s in buf.feed(line)]


def test_statements_end_at_a_semicolon_token_across_lines() -> None:
    buf = StatementBuffer()
    assert buf.feed("SELECT a") == []
    assert buf.pending
    assert buf.feed("  FROM t;") == ["SELECT a\n  FROM t"]
    assert not buf.pending
    # Two statements on one line, and a third started after them.
    assert buf.feed("SELECT 1; SELECT 2; SELECT") == ["SELECT 1", " SELECT 2"]
    assert buf.feed("3;") == [" SELECT\n3"]


def test_semicolons_in_strings_identifiers_and_comments_do_not_end_a_statement() -> None:
    buf = StatementBuffer()
    got = feed_all(
        buf,
        [
            "SELECT 'a;",  # an open string spans lines
            "b;' AS s, `x;y` -- c;",
            "/* d; */ FROM t;",
        ],
    )
    assert got == ["SELECT 'a;\nb;' AS s, `x;y` -- c;\n/* d; */ FROM t"]
    assert feed_all(StatementBuffer(), ["/* open;", "still;", "*/ SELECT 1;"]) == [
        "/* open;\nstill;\n*/ SELECT 1"
    ]


def test_text_the_lexer_rejects_is_handed_over_at_a_final_semicolon() -> None:
    buf = StatementBuffer()
    assert buf.feed("SELECT # FROM t") == []  # not finished yet: wait
    assert buf.feed("WHERE x;") == ["SELECT # FROM t\nWHERE x"]
    assert buf.feed(";;") == []  # empty statements are dropped
    assert not buf.pending


def test_parse_params() -> None:
    assert parse_params([]) is None
    assert parse_params(["40", '"bob"', "bob", "[1, 2]", "null"]) == [
        40,
        "bob",
        "bob",
        [1, 2],
        None,
    ]
    assert parse_params(["lo=30", "$hi=40.5", "name=ann"]) == {"lo": 30, "hi": 40.5, "name": "ann"}
    with pytest.raises(ShardexError) as info:
        parse_params(["1", "lo=2"])
    assert info.value.code is ErrorCode.BAD_REQUEST


def _text(table: object) -> str:
    con = Console(file=io.StringIO(), width=120, color_system=None)
    con.print(table)
    return con.file.getvalue()  # type: ignore[attr-defined]


def test_render_rows_columns_missing_fields_and_raw_values() -> None:
    rows = [{"name": "ann", "age": 41}, {"name": "bob", "tags": ["x"]}, {"age": None}]
    assert columns_of(rows) == ["name", "age", "tags"]
    out = _text(render_rows(rows))
    lines = [ln for ln in out.splitlines() if "ann" in ln or "bob" in ln or "null" in ln]
    assert "ann" in lines[0] and "41" in lines[0]
    assert '["x"]' in lines[1]
    assert "null" in lines[2]  # NULL is printed, a MISSING field is an empty cell
    assert columns_of([1, {"a": 1}]) is None
    raw = _text(render_rows([3, "x", {"a": 1}]))
    assert "value" in raw and '{"a": 1}' in raw


def test_format_error_points_at_line_and_column() -> None:
    stmt = "SELECT a\nFROM t WHERE a = = 1"
    with pytest.raises(ShardexError) as info:
        LocalQueryClient().query(stmt)
    text = format_error(info.value, stmt)
    lines = text.splitlines()
    assert lines[0].startswith("error: SQL_SYNTAX: unexpected '=' at line 2, column 18")
    assert lines[1] == "  FROM t WHERE a = = 1"
    assert lines[2] == "  " + " " * 17 + "^"


def make_shell() -> tuple[Shell, io.StringIO]:
    client = LocalQueryClient()
    client.engine.create_keyspace("users")
    client.engine.execute("CREATE PRIMARY INDEX ON users")
    out = io.StringIO()
    return Shell(client, Console(file=out, width=120, color_system=None)), out


def test_shell_runs_statements_prints_tables_metrics_and_survives_errors() -> None:
    shell, out = make_shell()
    for line in [
        "INSERT INTO users (KEY, VALUE)",
        "  VALUES ('u1', {'name': 'ann', 'age': 41});",
        "SELECT name, age FROM users",
        "WHERE age >;",  # a syntax error: printed, the shell goes on
        "SELECT * FROM nowhere;",
        "SELECT name, age FROM users;",
    ]:
        assert shell.prompt == (cli_sql.CONTINUATION if shell.buffer.pending else cli_sql.PROMPT)
        assert shell.feed(line)
    text = out.getvalue()
    assert "1 mutation(s)" in text
    assert "error: SQL_SYNTAX" in text and "line 2, column 12" in text
    assert "KEYSPACE_NOT_FOUND" in text and "hint: create it first" in text
    assert "ann" in text and "41" in text and "1 row(s)" in text
    assert shell.client.engine.keyspaces["users"] == {"u1": {"name": "ann", "age": 41}}


def test_shell_commands() -> None:
    shell, out = make_shell()
    assert shell.feed("SELECT")
    assert shell.buffer.pending
    assert shell.feed("\\c") is True  # a backslash line inside a statement is SQL text
    assert shell.buffer.pending
    shell.buffer.clear()
    assert shell.feed("\\c") is True and not shell.buffer.pending
    assert shell.feed("\\?") is True and "\\q quit" in out.getvalue()
    assert shell.feed("\\x") is True and "unknown command" in out.getvalue()
    assert shell.feed("\\q") is False


def test_interactive_loop_history_and_eof(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    shell, out = make_shell()
    lines = iter(["SELECT RAW 1 +", "2;", "\\q", "never read;"])
    prompts: list[str] = []

    def read(prompt: str) -> str:
        prompts.append(prompt)
        return next(lines)

    interactive(shell, read)
    assert prompts == [cli_sql.PROMPT, cli_sql.CONTINUATION, cli_sql.PROMPT]
    assert "3" in out.getvalue()
    assert (tmp_path / ".shardex_history").exists()

    def eof(prompt: str) -> str:
        raise EOFError

    interactive(shell, eof)  # ^D ends the shell


def test_describe_metrics() -> None:
    rows = LocalQueryClient().query("SELECT RAW 1")
    list(rows)
    assert describe_metrics(rows.metrics, 1).startswith("1 row(s), ")
    assert describe_metrics(None, 2) == "2 row(s)"


def test_sizes_and_statement_options() -> None:
    assert parse_bytes("1048576") == 1 << 20
    assert parse_bytes("64MiB") == 64 << 20
    assert parse_bytes(" 512 kib ") == 512 << 10
    assert parse_bytes("2GiB") == 2 << 30
    for bad in ("", "lots", "1.5MiB", "-1", "10 XB"):
        with pytest.raises(ShardexError) as e:
            parse_bytes(bad)
        assert e.value.code is ErrorCode.BAD_REQUEST and repr(bad) in str(e.value)
    assert statement_options(5.0, "majority", None, None) == {
        "timeout": 5.0,
        "durability": "majority",
    }
    assert statement_options(5.0, "none", 2.5, "4MiB") == {
        "timeout": 5.0,
        "durability": "none",
        "durability_timeout": 2.5,
        "memory_quota": 4 << 20,
    }


def test_shell_passes_its_options_with_every_statement() -> None:
    seen: list[dict] = []

    class Recording(LocalQueryClient):
        def query(self, sql, params=None, consistency="request_plus", **options):  # type: ignore[no-untyped-def]
            seen.append(options)
            return super().query(sql, params, consistency)

    options = {"timeout": 3.0, "memory_quota": 1 << 20}
    shell = Shell(Recording(), Console(file=io.StringIO()), options=options)
    shell.feed("SELECT 1;")
    shell.feed("SELECT 2;")
    assert seen == [options, options]
