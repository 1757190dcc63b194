"""``python -m bench``: every headline area in turn, one process each with ``--quick`` passed
on, the others still run after a failure, and the exit status says whether all passed."""

from __future__ import annotations

import sys
from typing import Any

import bench.__main__ as bench_main
import pytest


def test_areas_run_one_after_the_other_and_a_failure_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[list[str]] = []

    def call(cmd: list[str], **kwargs: Any) -> int:
        calls.append(cmd)
        return 1 if cmd[2] == "bench.scan" else 0

    monkeypatch.setattr(bench_main.subprocess, "call", call)
    assert bench_main.main(["--quick"]) == 1
    assert [c[2] for c in calls] == [f"bench.{a}" for a in bench_main.AREAS]
    assert all(c[0] == sys.executable and c[1] == "-m" and c[3:] == ["--quick"] for c in calls)


def test_only_narrows_the_run_and_full_mode_passes_no_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(bench_main.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    assert bench_main.main(["--only", "wire", "--only", "sql"]) == 0
    assert calls == [[sys.executable, "-m", "bench.wire"], [sys.executable, "-m", "bench.sql"]]
