"""Couchbase's SQL++ conformance cases through the runner (shardex.testing.sql_conformance).

Every case the runner classifies as in scope must pass; the pass count must not drop below
the floor reached when the runner was written (raise the floor as more cases pass). The
default run covers the folders whose data loads in seconds; the full run is marked slow
(``any_functions`` and ``comp_functions`` load 3 MB of INSERT statements).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.testing import sql_conformance as conformance

ROOT = Path(os.environ.get("SHARDEX_CONFORMANCE_DIR", conformance.DEFAULT_DIR))
HEAVY = {"any_functions", "comp_functions"}
FULL_CASES = 718
FULL_PASS_FLOOR = 706  # the other 12 are unsupported with a stated reason
LIGHT_PASS_FLOOR = 681

pytestmark = pytest.mark.skipif(not ROOT.is_dir(), reason=f"no conformance cases at {ROOT}")


def _run(folders: list[Path]) -> list[conformance.CaseOutcome]:
    out: list[conformance.CaseOutcome] = []
    for folder in folders:
        engine = conformance.load_folder(folder)
        for case_file in sorted(folder.glob("case_*.json")):
            for i, case in enumerate(json.loads(case_file.read_text())):
                out.append(conformance.run_case(engine, f"{folder.name}/{case_file.name}", i, case))
    return out


def _check(outcomes: list[conformance.CaseOutcome], floor: int) -> None:
    failed = [
        f"{o.file}#{o.index}: {o.statement[:80]} -> {o.reason}"
        for o in outcomes
        if o.outcome == "failed"
    ]
    assert not failed, "in-scope cases failed:\n" + "\n".join(failed)
    passed = sum(o.outcome == "passed" for o in outcomes)
    assert passed >= floor, f"{passed} cases passed, floor is {floor}"
    for o in outcomes:
        if o.outcome == "unsupported":
            assert o.reason, f"{o.file}#{o.index} is unsupported without a reason"


def test_light_folders_pass() -> None:
    folders = sorted(
        p
        for p in ROOT.iterdir()
        if p.is_dir() and p.name in conformance.COVERED_FOLDERS and p.name not in HEAVY
    )
    _check(_run(folders), LIGHT_PASS_FLOOR)


@pytest.mark.slow
def test_every_folder_passes() -> None:
    outcomes = conformance.run_all(ROOT)
    assert len(outcomes) == FULL_CASES
    _check(outcomes, FULL_PASS_FLOOR)


def test_comparison_rules() -> None:
    # Multiset without ORDER BY, in order with it; 1 == 1.0 but TRUE is not 1.
    assert conformance.compare_results([{"a": 1}, {"a": 2}], [{"a": 2}, {"a": 1.0}], False) is None
    assert conformance.compare_results([{"a": 1}, {"a": 2}], [{"a": 2}, {"a": 1}], True)
    assert conformance.compare_results([{"a": True}], [{"a": 1}], False)
    assert conformance.compare_results([{"a": 0.1 + 0.2}], [{"a": 0.3}], True) is None
    assert conformance.compare_results([{"a": 0.31}], [{"a": 0.3}], True)
    assert conformance.compare_results([{}], [{}, {}], False)


def test_error_cases_compare_by_substring() -> None:
    engine = conformance.load_folder(ROOT / "case_functions")
    ok = conformance.run_case(engine, "x", 0, {"statements": "SELEC 1", "error": "line 1"})
    assert ok.outcome == "passed"
    bad = conformance.run_case(engine, "x", 0, {"statements": "SELECT 1", "error": "boom"})
    assert bad.outcome == "failed"
    unknown = conformance.run_case(
        engine, "x", 0, {"statements": "SELECT NO_SUCH(1)", "results": []}
    )
    assert unknown.outcome == "unsupported" and "NO_SUCH" in unknown.reason


def test_the_command_runs_the_folders_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert conformance.main(["--dir", str(ROOT), "--folder", "case_functions"]) == 0
    out = capsys.readouterr().out
    assert "case_functions/case_case.json" in out and "date_functions" not in out


def test_render_tallies_each_folder() -> None:
    outcomes = [
        conformance.CaseOutcome("a_functions/case_1.json", 0, "SELECT 1", "passed"),
        conformance.CaseOutcome("a_functions/case_2.json", 0, "SELECT 2", "failed", "boom"),
        conformance.CaseOutcome("b_functions/case_1.json", 0, "SELECT 3", "unsupported", "x"),
    ]
    lines: list[str] = []
    conformance.render(outcomes, lines.append)
    rows = {line.split()[0]: line.split()[1:4] for line in lines if line.strip()}
    assert rows["a_functions"] == ["1", "1", "0"]
    assert rows["b_functions"] == ["0", "0", "1"]
    assert rows["a_functions/case_2.json"] == ["0", "1", "0"]


@pytest.mark.parametrize(
    ("case", "error", "matches"),
    [
        ({"errorCode": 3000}, ShardexError("x", code=ErrorCode.SQL_SYNTAX), True),
        ({"errorCode": 3000}, ShardexError("x", code=ErrorCode.BAD_REQUEST), False),
        (
            {"error": "Duplicate result alias 'id' (near line 1, column 19)."},
            ShardexError(
                "duplicate result name 'id' in the projection", code=ErrorCode.BAD_REQUEST
            ),
            True,
        ),
        (
            {"error": "Duplicate result alias 'id' (near line 1, column 19)."},
            ShardexError(
                "duplicate result name 'name' in the projection", code=ErrorCode.BAD_REQUEST
            ),
            False,
        ),
        (
            {"error": "Number of arguments to function META must be between 0 and 1 (near ...)"},
            ShardexError(
                "unexpected '1'; expected ')' (META takes at most a keyspace alias)",
                code=ErrorCode.SQL_SYNTAX,
            ),
            True,
        ),
        (
            {"error": "Invalid function array_vg (resolving to dimestore:array_vg)"},
            ShardexError("unknown function 'array_vg' at line 1", code=ErrorCode.SQL_SYNTAX),
            True,
        ),
        (
            {"error": "syntax error - line 1, column 20, near 'SELECT x', at: AS"},
            ShardexError("unexpected 'AS' at line 1, column 20", code=ErrorCode.SQL_SYNTAX),
            True,
        ),
        (
            {"error": "syntax error - line 1, column 20, near 'SELECT x', at: AS"},
            ShardexError("division by zero", code=ErrorCode.EXPRESSION_EVAL),
            False,
        ),
    ],
)
def test_an_expected_error_matches_the_same_refusal(
    case: dict, error: ShardexError, matches: bool
) -> None:
    # The peer's wording and columns are its own: the same refusal, not the same text.
    assert conformance.error_matches(case, error) is matches
