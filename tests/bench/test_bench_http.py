"""The pure parts of ``bench.http``: the query service request and how its response becomes
rows or an error, the wire naming each measurement row, the HTTP / Python client ratios and
the point cases' goal; the HTTP runner's one keep-alive connection against a local stand-in
server; and a slow smoke test that runs ``python -m bench.http --quick`` end to end."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from bench.common.phases import measure_grid
from bench.http.clients import (
    CLIENT,
    HTTP,
    HTTP_PLAIN,
    HttpTarget,
    WireRunner,
    WireVariant,
    basic_auth,
    request_body,
    results,
)
from bench.http.run import (
    CASES,
    HTTP_P50_GOAL,
    HTTP_QPS_GOAL,
    VARIANTS,
    merge_rounds,
    parse_args,
    ratio_tables,
)
from bench.sql.clients import Measure
from bench.sql.queries import COVERING, POINT_KEY, Query
from bench.sql.tables import MET, NOT_MET, p50_mark, qps_mark

REPO = Path(__file__).resolve().parents[2]


def test_request_is_couchbases_json_form() -> None:
    body = json.loads(request_body("SELECT $1", ["x", 3], "request_plus"))
    assert body == {
        "statement": "SELECT $1",
        "args": ["x", 3],
        "scan_consistency": "request_plus",
        "timeout": "600s",
    }
    assert basic_auth("admin", "pw") == "Basic YWRtaW46cHc="


def test_response_gives_rows_or_an_error_naming_status_and_errors() -> None:
    ok = json.dumps({"status": "success", "results": [{"a": 1}, {"a": 2}]}).encode()
    assert results(200, ok) == [{"a": 1}, {"a": 2}]
    failed = json.dumps({"status": "fatal", "errors": [{"code": 3000, "msg": "syntax"}]})
    with pytest.raises(RuntimeError, match=r"HTTP 400, fatal: .*3000"):
        results(400, failed.encode())
    # A 200 whose statement failed mid-stream is an error too.
    late = json.dumps({"status": "timeout", "results": [{"a": 1}], "errors": [{"code": 1080}]})
    with pytest.raises(RuntimeError, match="timeout"):
        results(200, late.encode())
    with pytest.raises(RuntimeError, match="not JSON"):
        results(502, b"<html>bad gateway</html>")


class FakePool:
    def measure(self, queries: Any, setting: Any, clients: int, seconds: float, **kw: Any) -> Any:
        return Measure([0.001] * 10, 10, seconds, [])


def test_each_measurement_row_names_its_wire() -> None:
    rows = measure_grid(
        CLIENT, FakePool(), {POINT_KEY: [Query(POINT_KEY, ("k",), 1)]}, [POINT_KEY],
        VARIANTS, [1], 1.0, columns=lambda v: v.columns(), rate="q/s",
    )  # fmt: skip
    assert [(r["system"], r["consistency"]) for r in rows] == [
        (CLIENT, "request_plus"),
        (HTTP, "request_plus"),
        (CLIENT, "not_bounded"),
        (HTTP, "not_bounded"),
    ]


def row(system: str, case: str, consistency: str, p50: float, qps: float) -> dict[str, Any]:
    return {
        "system": system,
        "case": case,
        "consistency": consistency,
        "variant": "current",
        "clients": 1,
        "p50 ms": p50,
        "p99 ms": p50,
        "q/s": qps,
    }


def test_http_is_compared_with_the_client_at_the_same_consistency() -> None:
    rows = [
        row("postgresql", POINT_KEY, "read committed", 0.1, 5000.0),
        row(CLIENT, POINT_KEY, "request_plus", 1.0, 1000.0),
        row(HTTP, POINT_KEY, "request_plus", 1.3, 770.0),  # exactly at the goal
        row(CLIENT, POINT_KEY, "not_bounded", 0.5, 2000.0),
        row(HTTP, POINT_KEY, "not_bounded", 1.0, 1000.0),  # 2x: not met
        row(CLIENT, COVERING, "request_plus", 2.0, 500.0),
        row(HTTP, COVERING, "request_plus", 4.0, 250.0),  # not a point case
    ]
    tables = ratio_tables(rows)
    wire = tables["ratios HTTP / Python client"]
    p50, qps = p50_mark(HTTP_P50_GOAL), qps_mark(HTTP_QPS_GOAL)
    assert [(r["case"], r["consistency"], r["p50 x"], r[p50], r[qps]) for r in wire] == [
        (POINT_KEY, "request_plus", 1.3, MET, MET),
        (POINT_KEY, "not_bounded", 2.0, NOT_MET, NOT_MET),
        (COVERING, "request_plus", 2.0, NOT_MET, NOT_MET),
    ]
    (rp, nb) = tables["point cases meeting the HTTP goal"]
    assert (rp["cases"], rp["both met"], nb["cases"], nb[f"{p50} met"]) == (1, 1, 1, 0)
    vs_pg = tables["ratios HTTP / PostgreSQL"]
    assert [(r["consistency"], r["p50 x"]) for r in vs_pg] == [
        ("request_plus", 13.0),
        ("not_bounded", 10.0),
    ]
    assert [r["p50 x"] for r in tables["ratios Python client / PostgreSQL"]] == [10.0, 5.0]


def test_rounds_merge_into_medians_and_sums() -> None:
    rounds = [
        [{**row(CLIENT, POINT_KEY, "request_plus", p50, qps), "queries": n, "errors": e,
          "client CPU ms/query": cpu}]
        for p50, qps, n, e, cpu in ((1.0, 900.0, 90, 0, None), (5.0, 300.0, 30, 1, 0.2),
                                    (2.0, 500.0, 50, 0, 0.4))
    ]  # fmt: skip
    (merged,) = merge_rounds(rounds)
    assert (merged["p50 ms"], merged["q/s"], merged["queries"], merged["errors"]) == (
        2.0,
        500.0,
        170,
        1,
    )
    assert (merged["client CPU ms/query"], merged["clients"], merged["rounds"]) == (0.3, 1, 3)
    other = [[row(HTTP, POINT_KEY, "request_plus", 1.0, 1.0)]]
    with pytest.raises(RuntimeError, match="different grids"):
        merge_rounds([rounds[0], *other])


def test_quick_plan_is_the_issues() -> None:
    plan, path = parse_args(["--quick"])
    assert (plan.docs, plan.levels, path.name) == (20_000, (1, 4), "http-quick.json")
    assert parse_args([])[0].levels == (1, 4, 16)
    assert "group by city" not in CASES


class Service(http.server.BaseHTTPRequestHandler):
    """A stand-in query service: echoes the statement, counts the connections it saw;
    with ``hang_up`` it closes a connection after answering, without saying so (as a
    server dropping an idle keep-alive connection)."""

    protocol_version = "HTTP/1.1"  # keep-alive
    peers: ClassVar[set[int]] = set()
    hang_up: ClassVar[bool] = False

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Service.peers.add(self.client_address[1])
        assert self.headers["Authorization"] == basic_auth("u", "p")
        out = json.dumps({"status": "success", "results": [{"s": body["statement"]}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
        self.close_connection = Service.hang_up

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def service() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Service)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("wire", [HTTP, HTTP_PLAIN])
def test_http_runner_keeps_one_connection_and_reopens_a_closed_one(
    service: http.server.ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch, wire: str
) -> None:
    # The Python client's half needs a cluster: only the HTTP half is built here.
    monkeypatch.setattr("bench.sql.clients.clients.TargetRunner.__init__", lambda *a: None)
    monkeypatch.setattr("bench.sql.clients.clients.TargetRunner.close", lambda self: None)
    port = service.server_address[1]
    target = HttpTarget("shardex", username="u", password="p", http_addresses=[f"127.0.0.1:{port}"])
    runner = WireRunner(target)
    Service.peers.clear()
    q = Query(POINT_KEY, ("k",), 1)
    http_rp = WireVariant(wire=wire)
    for _ in range(3):
        assert runner.rows(q, http_rp) == [{"s": runner.SX[POINT_KEY]}]
    assert len(Service.peers) == 1  # one keep-alive connection
    Service.hang_up = True
    try:
        assert runner.rows(q, http_rp) == [{"s": runner.SX[POINT_KEY]}]
    finally:
        Service.hang_up = False
    # The next request finds the connection gone: reopened once, answered.
    assert runner.rows(q, http_rp) == [{"s": runner.SX[POINT_KEY]}]
    assert (runner.reopened, len(Service.peers)) == (1, 2)
    runner.close()


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_quick_run_end_to_end(tmp_path: Path) -> None:
    """``python -m bench.http --quick``: both wires checked equal to PostgreSQL and
    measured beside it, every ratio present."""
    out = tmp_path / "http.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'src'}"}
    cmd = [sys.executable, "-m", "bench.http", "--quick", "--seconds", "1", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    tables = json.loads(out.read_text())["tables"]
    mix = tables["query mix over HTTP, the Python client and PostgreSQL"]
    assert {(r["system"], r["case"], r["clients"]) for r in mix} == {
        (s, c, n) for s in ("postgresql", CLIENT, HTTP) for c in CASES for n in (1, 4)
    }
    assert all(r["errors"] == 0 and r["queries"] > 0 for r in mix)
    assert len(tables["ratios HTTP / Python client"]) == len(CASES) * 2 * 2
