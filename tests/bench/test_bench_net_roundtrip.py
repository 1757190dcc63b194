"""``bench/diagnostics/net_roundtrip.py``: a short run end to end (server and client processes,
the JSON
it writes), and the parsers of ``perf stat -x,`` and ``strace -c`` output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.diagnostics.net_roundtrip import _perf_instructions, _strace_calls, main

pytestmark = pytest.mark.timeout(120)


def test_a_short_run_writes_one_row_per_configuration(tmp_path: Path) -> None:
    out = tmp_path / "net.json"
    argv = ["--requests", "30", "--rounds", "2", "--clients", "1", "--clients", "2"]
    assert main([*argv, "--mode", "sync", "--msg", "ping", "--msg", "rpc", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {(r["mode"], r["msg"], r["clients"]): r for r in doc["rows"]}
    assert set(rows) == {("sync", m, c) for m in ("ping", "rpc") for c in (1, 2)}
    for (_, _, clients), row in rows.items():
        b = row["B"]
        assert b["requests"] == 30 * 2 * clients
        assert 0 < b["p50_us"] <= b["p90_us"]
        assert b["client_cpu_us"] > 0 and b["server_cpu_us"] > 0
        assert "A" not in row  # no --before-src: one side


def test_perf_and_strace_outputs_are_parsed(tmp_path: Path) -> None:
    perf = tmp_path / "p"
    perf.write_text("# started on ...\n\n123456,,instructions:u,1000,100.00,,\n")
    assert _perf_instructions(perf) == 123456
    perf.write_text("<not counted>,,instructions,0,0.00,,\n")
    assert _perf_instructions(perf) != _perf_instructions(perf)  # nan: nothing counted
    strace = tmp_path / "s"
    strace.write_text(
        "% time     seconds  usecs/call     calls    errors syscall\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        " 60.00    0.006000           3      2000           epoll_pwait\n"
        " 30.00    0.003000           3      1000           write\n"
        " 10.00    0.001000           1      1000        12 read\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        "100.00    0.010000           2      4000        12 total\n"
    )
    assert _strace_calls(strace) == {"epoll_pwait": 2000, "write": 1000, "read": 1000}
