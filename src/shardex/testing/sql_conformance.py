"""Conformance runner: Couchbase's own SQL++ test cases run against shardex.

    python -m shardex.testing.sql_conformance [--dir DIR] [--json out.json] [--cluster CLUSTER_DIR]
        [--all | --folder NAME ...]

Reads the case folders (``../shared/conformance/couchbase-filestore`` by default, or
``$SHARDEX_CONFORMANCE_DIR``; format in that folder's README), loads each folder's
``insert.json`` into fresh keyspaces, runs every case and prints a per-file table of
passed / failed / unsupported with the reason of every case not passed.

Comparison (the README's rules): rows compare as a multiset when the statement has no ORDER
BY and in order when it has one; values compare under SQL++ equality (1 and 1.0 are equal,
TRUE is not 1); ``error`` cases pass when the error message contains the expected text;
``ignore`` / ``accept`` drop / keep top-level fields before comparing.

A case is *unsupported* when it needs something outside the implemented language: a
function shardex does not have (the parser reports which), or a documented deliberate
difference (``KNOWN_DIFFERENCES``). Everything else is in scope and must pass.

Queries run on ``LocalEngine`` (the single-process reference), or with ``--cluster`` on the
local cluster in that directory through ``client.query`` at request_plus (``ClusterEngine``:
the five keyspaces are created with a primary index if missing, emptied before each folder
and loaded with its documents; the cluster's index pipeline must be running, as
``shardex pipeline`` or the tests' driver, for the primary indexes to build).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from shardex.core.keycodec_values import encode_value
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.local import LocalEngine
from shardex.sql.syntax import ExplainStmt, SelectStmt, parse_statement

if TYPE_CHECKING:
    from shardex.client import Client

KEYSPACES = ("customer", "orders", "product", "purchase", "review")
_CASES = Path("shared") / "conformance" / "couchbase-filestore"


def _default_dir() -> Path:
    """The workplace's shared folder beside the checkout (``<repo>/../shared``), else beside
    the working directory, else the workplace's fixed location; the first that exists."""
    candidates = [
        Path(__file__).resolve().parents[4] / _CASES,
        Path.cwd().resolve().parent / _CASES,
        Path("/work") / _CASES,
    ]
    return next((c for c in candidates if c.is_dir()), candidates[0])


DEFAULT_DIR = _default_dir()

# The corpus folders shardex runs: all of them (their case count and pass floor are in
# tests/unit/sql/test_sql_conformance.py); ``run_all(folders=None)`` or ``--all`` runs every
# folder found, a new one included.
COVERED_FOLDERS: tuple[str, ...] = (
    "aggregate_functions",
    "alias_functions",
    "any_functions",
    "array_functions",
    "bitwise_functions",
    "case_functions",
    "comp_functions",
    "conditional_unkn_functions",
    "crypto_functions",
    "date_functions",
    "error_cases",
    "json_functions",
    "meta_functions",
    "number_functions",
    "obj_functions",
    "order_functions",
    "select_functions",
    "string_functions",
    "subqexp",
    "typeconv_functions",
    "unnest",
    "where_functions",
)

# Deliberate differences from N1QL, each with its reason: (statement pattern, reason).
KNOWN_DIFFERENCES: tuple[tuple[str, str], ...] = (
    (
        r"(?i)\bacos\(3\)|sqrt\(-1\)|\bNaN\(\)|PosInf\(\)|NegInf\(\)",
        "non-finite numbers (NaN, +/-Infinity) are NULL in shardex: the key codec and JSON "
        'cannot hold them (N1QL prints "NaN")',
    ),
    (
        r"(?i)\brandom\(0\.5\)",
        "RANDOM(seed) is deterministic per seed but uses Python's generator, not Go's",
    ),
    (
        r"(?i)^\s*EXPLAIN\b",
        "EXPLAIN prints shardex's plan (its operators, index and spans), not N1QL's operator tree",
    ),
    (
        r"(?i)DATE_RANGE_MILLIS\(0, 10000000000,",
        "a date range past the array limit gives no row in N1QL; in shardex DATE_RANGE_* is "
        "NULL past RANGE_LIMIT dates (a function never removes a row)",
    ),
    (
        r"(?i)ARRAY TYPE\(c\) for c in \[.*missing",
        "MISSING inside an array constructor becomes NULL in shardex (N1QL keeps it until output)",
    ),
    (
        r"(?i)array_binary_search\(\[missing",
        "MISSING inside an array constructor becomes NULL in shardex (N1QL keeps it until output)",
    ),
)
_UNKNOWN_FUNCTION = re.compile(r"unknown function '([^']+)'")

# An expected error passes when shardex refuses the statement for the same reason: the
# peer's texts carry its own wording and positions (its parser's columns differ from
# shardex's), so each of its messages the corpus expects is paired with shardex's error
# code and a pattern of shardex's message for the same refusal (``{name}`` groups carry over).
N1QL_ERROR_CODES: dict[int, ErrorCode] = {3000: ErrorCode.SQL_SYNTAX}  # 3000: parse error
ERROR_EQUIVALENTS: tuple[tuple[str, ErrorCode, str], ...] = (
    (r"^syntax error\b", ErrorCode.SQL_SYNTAX, r""),
    (
        r"^Duplicate result alias '(?P<name>[^']*)'",
        ErrorCode.BAD_REQUEST,
        r"duplicate result name '{name}'",
    ),
    (
        r"^Duplicate UNNEST alias '(?P<name>[^']*)'",
        ErrorCode.BAD_REQUEST,
        r"UNNEST alias '{name}' is already bound",
    ),
    (
        r"^Number of arguments to function (?P<name>\w+) must be between",
        ErrorCode.SQL_SYNTAX,
        r"(?i)\b{name}\b.*(arguments?|takes at most)",
    ),
    (r"^Invalid function (?P<name>\w+)", ErrorCode.SQL_SYNTAX, r"(?i)unknown function '{name}'"),
    (
        # A correlated subquery in a grouped query's LETTING / HAVING / projection.
        r"^Expression \(correlated .*\) must depend only on group keys or aggregates\.$",
        ErrorCode.BAD_REQUEST,
        r"is a subquery correlated on .*: it must depend only on group keys or aggregates$",
    ),
)


def error_matches(case: dict[str, Any], e: ShardexError) -> bool:
    """Whether ``e`` is the refusal the case expects (``errorCode`` or ``error``): the
    peer's text itself, or its equivalent in ``ERROR_EQUIVALENTS``."""
    if "errorCode" in case:
        return N1QL_ERROR_CODES.get(case["errorCode"]) is e.code
    want = case.get("error")
    if not isinstance(want, str):
        return False
    if want in e.message:
        return True
    for theirs, code, ours in ERROR_EQUIVALENTS:
        m = re.search(theirs, want)
        if m is not None and e.code is code:
            names = {k: re.escape(v) for k, v in m.groupdict().items()}
            return re.search(ours.format(**names), e.message) is not None
    return False


@dataclass
class CaseOutcome:
    file: str
    index: int
    statement: str
    outcome: str  # "passed" | "failed" | "unsupported"
    reason: str = ""


def canonical(value: Any) -> bytes:
    """Identity under SQL++ equality, for comparing results (see the module doc)."""
    return encode_value(value)


def _project_fields(row: Any, case: dict[str, Any]) -> Any:
    if not isinstance(row, dict):
        return row
    if "accept" in case:
        keep = set(case["accept"])
        row = {k: v for k, v in row.items() if k in keep}
    if "ignore" in case:
        drop = set(case["ignore"])
        row = {k: v for k, v in row.items() if k not in drop}
    return row


FLOAT_TOLERANCE = 1e-12  # relative; Go's math library and C's libm differ in the last bits


def same(a: Any, b: Any) -> bool:
    """SQL++ equality of two JSON values, floats within ``FLOAT_TOLERANCE`` (relative)."""
    ta, tb = type(a), type(b)
    if ta in (int, float) and tb in (int, float):
        if a == b:
            return True
        if ta is int and tb is int and max(abs(a), abs(b)) < 2**53:
            return False  # beyond 2**53 both are printed floats: compare with tolerance
        return abs(a - b) <= FLOAT_TOLERANCE * max(abs(a), abs(b))
    if ta is not tb:
        return False
    if ta is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if ta is dict:
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    return bool(a == b)


def compare_results(actual: list[Any], expected: list[Any], ordered: bool) -> str | None:
    """None when equal, else a short description of the first difference."""
    if len(actual) != len(expected):
        order = "" if ordered else " (any order)"
        return f"{len(actual)} rows, expected {len(expected)}{order}: {_short(actual)}"
    if ordered:
        for i, (x, y) in enumerate(zip(actual, expected, strict=True)):
            if not same(x, y):
                return f"row {i}: got {_short(x)}, expected {_short(y)}"
        return None
    if sorted(map(canonical, actual)) == sorted(map(canonical, expected)):
        return None
    unmatched = list(expected)  # exact multiset failed: match allowing float tolerance
    for row in actual:
        j = next((j for j, e in enumerate(unmatched) if same(row, e)), None)
        if j is None:
            return f"rows differ (any order): unexpected {_short(row)}"
        unmatched.pop(j)
    return None


def _short(v: Any, n: int = 160) -> str:
    text = json.dumps(v, default=repr, ensure_ascii=False)
    return text if len(text) <= n else text[: n - 3] + "..."


def _has_order_by(statement: str) -> bool:
    try:
        stmt = parse_statement(statement)
    except ShardexError:
        return False
    if isinstance(stmt, ExplainStmt):
        stmt = stmt.statement
    return isinstance(stmt, SelectStmt) and bool(stmt.order_by)


class Engine(Protocol):
    def execute(self, sql: str) -> Any: ...
    def query(self, sql: str, params: Any = None) -> list[Any]: ...


class ClusterEngine:
    """The runner's engine over a cluster: every statement through ``client.query`` at
    request_plus, so a case reads every write of the inserts and preStatements."""

    def __init__(self, client: Client, *, num_partitions: int = 8, timeout: float = 300.0):
        self.client = client
        self.num_partitions = num_partitions
        self.timeout = timeout

    def execute(self, sql: str) -> Any:
        return list(self.client.query(sql))

    def query(self, sql: str, params: Any = None) -> list[Any]:
        return list(self.client.query(sql, params))

    def reset(self) -> None:
        """The five keyspaces, empty, each with an ACTIVE primary index."""
        have = {k.name for k in self.client.list_keyspaces()}
        for ks in KEYSPACES:
            if ks not in have:
                self.client.create_keyspace(ks, self.num_partitions)
            if not any(i["name"] == "#primary" for i in self.client.list_indexes(ks)):
                self.execute(f"CREATE PRIMARY INDEX ON {ks}")
        for ks in KEYSPACES:
            self.client.wait_for_index(ks, "#primary", timeout=self.timeout)
            self.execute(f"DELETE FROM {ks}")


def load_folder(folder: Path, cluster: ClusterEngine | None = None) -> Engine:
    engine: Engine
    if cluster is not None:
        cluster.reset()
        engine = cluster
    else:
        engine = local = LocalEngine()
        for ks in KEYSPACES:
            local.create_keyspace(ks)
            local.execute(f"CREATE PRIMARY INDEX ON {ks}")
    insert = folder / "insert.json"
    if insert.exists():
        for item in json.loads(insert.read_text()):
            engine.execute(item["statements"])
    return engine


_DML = r"(?i)^\s*(MERGE|INSERT|UPSERT|UPDATE|DELETE)\b"


def run_case(engine: Engine, file: str, index: int, case: dict[str, Any]) -> CaseOutcome:
    statement = case["statements"]
    out = CaseOutcome(file, index, statement, "passed")
    if case.get("disabled"):
        out.outcome, out.reason = "unsupported", "disabled in the peer's suite"
        return out
    for pattern, reason in KNOWN_DIFFERENCES:
        if re.search(pattern, statement):
            out.outcome, out.reason = "unsupported", reason
            return out
    params: Any = case.get("namedArgs") or case.get("positionalArgs")
    try:
        for pre in case.get("preStatements", []) or []:
            engine.execute(pre)
        rows = engine.query(statement, params)
    except ShardexError as e:
        m = _UNKNOWN_FUNCTION.search(e.message)
        if error_matches(case, e):
            return out
        if m:
            out.outcome, out.reason = (
                "unsupported",
                f"function {m.group(1).upper()} not implemented",
            )
        else:
            out.outcome, out.reason = "failed", f"error: {e}"
        return out
    finally:
        for post in case.get("postStatements", []) or []:
            with contextlib.suppress(ShardexError):
                engine.execute(post)
    if "error" in case or "errorCode" in case:
        want = case.get("error", case.get("errorCode"))
        out.outcome, out.reason = "failed", f"expected error {want!r}, got rows"
        return out
    expected = case.get("results")
    if expected is None and case.get("matchStatements"):
        try:
            expected = engine.query(case["matchStatements"], params)
        except ShardexError as e:
            out.outcome, out.reason = "failed", f"matchStatements failed: {e}"
            return out
    if expected is None and re.match(_DML, statement):
        return out  # ran without error; the peer checks its effect with the cases after it
    if expected is None:
        out.outcome, out.reason = "unsupported", "the case has no expected results"
        return out
    actual = [_project_fields(r, case) for r in rows]
    expected = [_project_fields(r, case) for r in expected]
    diff = compare_results(actual, expected, _has_order_by(statement))
    if diff is not None:
        out.outcome, out.reason = "failed", diff
    return out


def run_all(
    root: Path = DEFAULT_DIR,
    cluster: ClusterEngine | None = None,
    folders: Sequence[str] | None = COVERED_FOLDERS,
) -> list[CaseOutcome]:
    """Every case of ``folders`` under ``root`` (every folder when None)."""
    outcomes: list[CaseOutcome] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if folders is not None and folder.name not in folders:
            continue
        engine = load_folder(folder, cluster)
        for case_file in sorted(folder.glob("case_*.json")):
            name = f"{folder.name}/{case_file.name}"
            for i, case in enumerate(json.loads(case_file.read_text())):
                outcomes.append(run_case(engine, name, i, case))
    return outcomes


def summarize(
    outcomes: Sequence[CaseOutcome], by: Callable[[str], str] = lambda file: file
) -> dict[str, dict[str, int]]:
    """Outcome counts per case file, or per ``by(file)`` (``by=folder_of``: per folder)."""
    table: dict[str, dict[str, int]] = {}
    for o in outcomes:
        row = table.setdefault(by(o.file), {"passed": 0, "failed": 0, "unsupported": 0})
        row[o.outcome] += 1
    return table


def folder_of(file: str) -> str:
    return file.split("/", 1)[0]


def _render_table(
    title: str, table: dict[str, dict[str, int]], write: Callable[[str], Any]
) -> None:
    width = max((len(f) for f in (title, *table)), default=10)
    write(f"{title:<{width}}  passed  failed  unsupported")
    totals = {"passed": 0, "failed": 0, "unsupported": 0}
    for f, row in table.items():
        write(f"{f:<{width}}  {row['passed']:>6}  {row['failed']:>6}  {row['unsupported']:>11}")
        for k in totals:
            totals[k] += row[k]
    write(
        f"{'total':<{width}}  {totals['passed']:>6}  {totals['failed']:>6}  "
        f"{totals['unsupported']:>11}   ({sum(totals.values())} cases)"
    )


def render(outcomes: Sequence[CaseOutcome], write: Callable[[str], Any] = print) -> None:
    _render_table("folder", summarize(outcomes, folder_of), write)
    write("")
    _render_table("file", summarize(outcomes), write)
    for o in outcomes:
        if o.outcome != "passed":
            stmt = " ".join(o.statement.split())
            write(f"\n[{o.outcome}] {o.file}#{o.index}: {stmt[:150]}\n    {o.reason}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m shardex.testing.sql_conformance", description=__doc__
    )
    ap.add_argument(
        "--dir", type=Path, default=Path(os.environ.get("SHARDEX_CONFORMANCE_DIR", DEFAULT_DIR))
    )
    ap.add_argument("--json", type=Path, help="also write every outcome to this file")
    ap.add_argument("--cluster", type=Path, help="run on the local cluster in this directory")
    ap.add_argument(
        "--all", action="store_true", help="every folder, not only those of implemented features"
    )
    ap.add_argument(
        "--folder", action="append", help="only this folder (repeat for more), covered or not"
    )
    args = ap.parse_args(argv)
    folders = tuple(args.folder) if args.folder else None if args.all else COVERED_FOLDERS
    if not args.dir.is_dir():
        print(f"conformance folder not found: {args.dir}", file=sys.stderr)
        return 2
    if args.cluster is not None:
        from shardex.client import connect_local

        try:
            client = connect_local(args.cluster, name="shardex-conformance")
        except ShardexError as e:
            print(f"cannot connect to the cluster in {args.cluster}: {e}", file=sys.stderr)
            return 2
        with client:
            outcomes = run_all(args.dir, ClusterEngine(client), folders)
    else:
        outcomes = run_all(args.dir, folders=folders)
    render(outcomes)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "folders": summarize(outcomes, folder_of),
                    "summary": summarize(outcomes),
                    "cases": [asdict(o) for o in outcomes],
                },
                indent=2,
                ensure_ascii=False,
            )
        )
    return 0 if all(o.outcome != "failed" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
