"""``shardex sql``: run SQL++ on a local cluster, one statement or an interactive shell.

    shardex sql --dir DIR "SELECT name FROM users WHERE age > $1" --param 40
    shardex sql --dir DIR --json "SELECT ..."     # stdout: the rows as one JSON array
    shardex sql --dir DIR                          # the shell

The shell reads statements over several lines until one ends with ``;`` (a ``;`` inside a
string, a quoted identifier or a comment does not count), prints rows as a table with the
query's metrics, keeps readline history in ``~/.shardex_history`` and prints errors with
their line and column (a caret under the spot); the cluster keeps serving. ``\\q`` quits,
``\\c`` clears a half-typed statement, ``\\?`` lists the commands.

The pure parts (``StatementBuffer``, ``render_rows``, ``format_error``, ``parse_params``,
``Shell``) take any client with ``query(sql, params, consistency)`` so they are tested over
``LocalQueryClient``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Final

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from shardex.cli.common import err, fail
from shardex.cli.keyspace import DirOption, local_client
from shardex.core.expr.lexer import tokenize
from shardex.core.sizes import parse_size
from shardex.dbapi.local import QueryClient
from shardex.errors import ErrorCode, ShardexError

HISTORY_FILE: Final = "~/.shardex_history"
PROMPT: Final = "shardex> "
CONTINUATION: Final = "     ...> "
HELP: Final = (
    "End a statement with ';' (it may span lines).  \\q quit   \\c clear the statement   "
    "\\? this help"
)
_NAMED_PARAM = re.compile(r"^\$?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)


# -- statements from lines ----------------------------------------------------------------


class StatementBuffer:
    """Collects input lines into complete statements.

    ``feed(line)`` returns the statements the line completed (text without the final
    ``;``). A statement is complete at a ``;`` token; text the lexer cannot read yet (an
    open string or comment) waits for more lines; text it rejects for another reason is
    handed over at a line ending with ``;`` so the error reaches the user with its line and
    column.
    """

    def __init__(self) -> None:
        self.text = ""

    @property
    def pending(self) -> bool:
        return bool(self.text.strip())

    def clear(self) -> None:
        self.text = ""

    def feed(self, line: str) -> list[str]:
        self.text += line + "\n"
        try:
            tokens = tokenize(self.text)
        except ShardexError as e:
            if "unterminated" in e.message or not self.text.rstrip().endswith(";"):
                return []  # an open string or comment, or not finished: wait
            done, self.text = self.text.rstrip()[:-1], ""
            return [done] if done.strip() else []
        out: list[str] = []
        start = 0
        for tok in tokens:
            if tok.text == ";" and tok.kind.name == "OP":
                stmt = self.text[start : tok.offset]
                if stmt.strip():
                    out.append(stmt.strip("\n"))
                start = tok.offset + 1
        rest = self.text[start:]
        self.text = rest if rest.strip() else ""
        return out


# -- parameters ---------------------------------------------------------------------------


def parse_params(values: Sequence[str]) -> list[Any] | dict[str, Any] | None:
    """``--param`` values: ``VALUE`` (positional: $1, $2, ...) or ``name=VALUE`` ($name).
    VALUE is JSON; text that is not JSON is taken as a string (``--param bob``)."""
    if not values:
        return None
    named: dict[str, Any] = {}
    positional: list[Any] = []
    for raw in values:
        m = _NAMED_PARAM.match(raw)
        if m:
            named[m.group(1)] = _json_or_text(m.group(2))
        else:
            positional.append(_json_or_text(raw))
    if named and positional:
        raise ShardexError(
            "--param values must all be positional (VALUE) or all named (name=VALUE)",
            code=ErrorCode.BAD_REQUEST,
            details={"values": list(values), "hint": "--param 40 --param '\"bob\"'"},
        )
    return named or positional


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


# -- rendering ----------------------------------------------------------------------------


def columns_of(rows: Iterable[Any]) -> list[str] | None:
    """Field names in order of first appearance; None when the rows are bare values."""
    cols: dict[str, None] = {}
    for row in rows:
        if not isinstance(row, dict):
            return None
        cols.update(dict.fromkeys(row))
    return list(cols)


def cell(value: Any) -> Text:
    if isinstance(value, str):
        return Text(value)
    return Text(json.dumps(value, ensure_ascii=False), style="cyan" if value is not None else "dim")


def render_rows(rows: list[Any]) -> Table:
    """Rows as a table: one column per field (a missing field is an empty cell), or one
    ``value`` column for SELECT RAW / VALUE results."""
    table = Table(show_header=True, header_style="bold", show_lines=False)
    cols = columns_of(rows)
    if cols is None:
        table.add_column("value")
        for row in rows:
            table.add_row(cell(row))
        return table
    for c in cols:
        table.add_column(c)
    for row in rows:
        table.add_row(*(cell(row[c]) if c in row else Text("") for c in cols))
    return table


def describe_metrics(metrics: Any, rows: int) -> str:
    if metrics is None:
        return f"{rows} row(s)"
    parts = [f"{metrics.result_count} row(s)"]
    if metrics.mutation_count:
        parts.append(f"{metrics.mutation_count} mutation(s)")
    parts.append(f"{metrics.elapsed * 1000:.1f} ms")
    parts.append(f"{metrics.bytes} bytes")
    if getattr(metrics, "index", None):
        parts.append(f"index {metrics.index}")
    return ", ".join(parts)


def format_error(e: ShardexError, statement: str | None = None) -> str:
    """The error with, when it has a position, the statement line and a caret under it."""
    lines = [f"error: {e}"]
    line, column = e.details.get("line"), e.details.get("column")
    text = e.details.get("text", statement)
    if isinstance(line, int) and isinstance(column, int) and isinstance(text, str):
        src = text.split("\n")
        if 1 <= line <= len(src):
            lines.append(f"  {src[line - 1]}")
            lines.append("  " + " " * (column - 1) + "^")
    hint = e.details.get("hint")
    if hint and str(hint) not in e.message:
        lines.append(f"hint: {hint}")
    return "\n".join(lines)


# -- the shell ----------------------------------------------------------------------------


class Shell:
    """Runs what the user types; ``feed`` returns False when the user quits."""

    def __init__(
        self,
        client: QueryClient,
        console: Console,
        *,
        consistency: str = "request_plus",
        params: list[Any] | dict[str, Any] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.console = console
        self.consistency = consistency
        self.params = params
        # The statement options of the command line (``statement_options``), each query's.
        self.options = options or {}
        self.buffer = StatementBuffer()

    @property
    def prompt(self) -> str:
        return CONTINUATION if self.buffer.pending else PROMPT

    def feed(self, line: str) -> bool:
        cmd = line.strip()
        if not self.buffer.pending and cmd.startswith("\\"):
            return self.command(cmd)
        for stmt in self.buffer.feed(line):
            self.run(stmt)
        return True

    def command(self, cmd: str) -> bool:
        if cmd in ("\\q", "\\quit"):
            return False
        if cmd == "\\c":
            self.buffer.clear()
        elif cmd in ("\\?", "\\h", "\\help"):
            self.console.print(HELP, markup=False)
        else:
            self.console.print(f"unknown command {cmd!r}; {HELP}", markup=False)
        return True

    def run(self, statement: str) -> None:
        try:
            result = self.client.query(statement, self.params, self.consistency, **self.options)
            rows = list(result)
        except ShardexError as e:
            self.console.print(Text(format_error(e, statement), style="red"))
            return
        if rows:
            self.console.print(render_rows(rows))
        self.console.print(Text(describe_metrics(result.metrics, len(rows)), style="dim"))


def parse_bytes(text: str) -> int:
    """``"67108864"``, ``"64MiB"``, ``"512 KiB"``: bytes; BAD_REQUEST naming the text."""
    size = parse_size(text)
    if size is None:
        raise ShardexError(
            f"not a size in bytes: {text!r}",
            code=ErrorCode.BAD_REQUEST,
            details={"value": text, "hint": "bytes, or a number with KiB, MiB or GiB: 64MiB"},
        )
    return size


def statement_options(
    timeout: float, durability: str, durability_timeout: float | None, memory_quota: str | None
) -> dict[str, Any]:
    """The command line's options as ``Client.query`` keywords (only those given, beside
    the timeout and durability); the node checks their values and names a bad one."""
    out: dict[str, Any] = {"timeout": timeout, "durability": durability}
    if durability_timeout is not None:
        out["durability_timeout"] = durability_timeout
    if memory_quota is not None:
        out["memory_quota"] = parse_bytes(memory_quota)
    return out


def history_path() -> Path:
    return Path(os.path.expanduser(HISTORY_FILE))


def interactive(shell: Shell, read: Callable[[str], str] = input) -> None:
    """The read-eval-print loop, with readline history when the platform has it."""
    try:
        import readline
    except ImportError:  # pragma: no cover - readline exists on Linux and macOS
        readline = None  # type: ignore[assignment]
    hist = history_path()
    if readline is not None:
        with contextlib.suppress(OSError):  # the first session: no history yet
            readline.read_history_file(hist)
    shell.console.print(f"shardex SQL++ shell.  {HELP}", markup=False)
    try:
        while True:
            try:
                line = read(shell.prompt)
            except EOFError:
                break
            except KeyboardInterrupt:  # ^C drops the statement being typed, like psql
                shell.buffer.clear()
                shell.console.print()
                continue
            if not shell.feed(line):
                break
    finally:
        if readline is not None:
            try:
                readline.set_history_length(2000)
                readline.write_history_file(hist)
            except OSError as e:
                err.print(f"[yellow]warning:[/] history not saved to {hist}: {e}")


# -- the command --------------------------------------------------------------------------


def sql(
    cluster_dir: DirOption,
    statement: Annotated[
        str | None, typer.Argument(help="The statement; without it, an interactive shell.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print only the rows, as one JSON array.")
    ] = False,
    consistency: Annotated[
        str, typer.Option("--consistency", "-c", help="request_plus | not_bounded.")
    ] = "request_plus",
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="A parameter: VALUE for $1, $2...; name=VALUE."),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Query timeout, seconds.")] = 120.0,
    durability: Annotated[
        str,
        typer.Option(
            "--durability",
            help="Of the documents a DML statement writes: none | persist_active | majority | "
            "majority_persist_active | persist_majority.",
        ),
    ] = "persist",
    durability_timeout: Annotated[
        float | None,
        typer.Option(
            "--durability-timeout",
            help="Seconds a DML write waits for its durability level before "
            "DURABILITY_AMBIGUOUS (default: the node's).",
        ),
    ] = None,
    memory_quota: Annotated[
        str | None,
        typer.Option(
            "--memory-quota",
            help="The statement's memory budget per node: bytes, or with KiB/MiB/GiB "
            "(at most the nodes' sql_query_memory; default: that).",
        ),
    ] = None,
) -> None:
    """Run SQL++ statements: one (``--json`` for machine-readable rows) or a shell."""
    try:
        params = parse_params(param or [])
        options = statement_options(timeout, durability, durability_timeout, memory_quota)
    except ShardexError as e:
        fail(e)
    with local_client(cluster_dir, timeout=timeout + 30) as client:
        if statement is None:
            shell = Shell(
                client, Console(), consistency=consistency, params=params, options=options
            )
            interactive(shell)
            return
        try:
            rows = client.query(statement, params, consistency, **options)
            values = list(rows)
        except ShardexError as e:
            err.print(Text(format_error(e, statement), style="red"))
            raise typer.Exit(1) from None
        if as_json:
            print(json.dumps(values, ensure_ascii=False))
            return
        out = Console()
        if values:
            out.print(render_rows(values))
        out.print(Text(describe_metrics(rows.metrics, len(values)), style="dim"))
