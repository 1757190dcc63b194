"""Instructions the node running a SQL query runs per query:
``python -m bench.diagnostics.sql_callgrind DIR [--case C] [--queries N]``.

CPU time per query (``sql_profile``) moves with the machine's other work, up to 2x between
runs on a shared VM without hardware counters; instructions counted by valgrind do not. On
the cluster of ``sql_profile setup DIR``: the cluster starts (no pipeline), one client runs
the case once to learn the node that runs it (``details["node"]``: the route a client
follows), that node is stopped and started again under ``valgrind --tool=callgrind
--instr-atstart=no`` with its own config, and is counted (``callgrind_control -i on``) only
over ``--queries`` queries of the case at request_plus, after a warm-up. It suits a case
whose replies route the client to one node (the point queries: the index's node, the key's
owner); a case that runs wherever the client connects may land elsewhere once that node
restarts, which is reported as such. Only that node is
counted (the other nodes' share of a point query is their ``HighSeqnos`` and ``GetMany``
answers). The node's code is the one on ``PYTHONPATH`` (a copy of ``src/`` first for the
code before a change). The cluster is stopped before the command returns.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.dataset import SEED
from bench.diagnostics.node_callgrind import counted, counting, start_under_callgrind, stop_node
from bench.diagnostics.scan_profile import running
from bench.sql.queries import CASES, POINT_EMAIL, SX_SQL, DocStats, build_queries

WARM = 100  # queries before counting (caches, routes, the node's first slow runs)


def per_query(base: Path, case: str, n: int) -> float:
    """Instructions per query of ``case`` of the node that runs it."""
    from shardex.client import connect_local
    from shardex.demo.datagen import users

    docs = int((base / "docs.txt").read_text())
    qs = build_queries(DocStats.of(users(docs, SEED)))[case]
    cdir = base / "cluster"

    def run(client: Any, k: int) -> str:
        q = qs[k % len(qs)]
        rows = client.query(SX_SQL[case], list(q.params))
        got = len(list(rows))
        if got != q.expected_rows:
            raise RuntimeError(f"{case}: {got} rows, not {q.expected_rows}")
        return str(rows.metrics.details["node"])

    with running(cdir, new=False):
        with connect_local(cdir) as client:
            run(client, 0)
            name = run(client, 1)  # the route followed: the node that runs the case
        node = cdir / name
        stop_node(node / "node.pid")
        out = Path(tempfile.mkdtemp(prefix="sql-callgrind-"))
        vg = start_under_callgrind(node, out)
        try:
            with connect_local(cdir) as client:
                deadline = time.monotonic() + 600  # a node under valgrind starts slowly
                while True:
                    try:
                        ran_at = run(client, 0)
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                    else:
                        if ran_at == name:
                            break
                        if time.monotonic() > deadline:
                            raise RuntimeError(
                                f"{case} runs on {ran_at}, not on {name} under valgrind: "
                                "only a case whose replies route it to one node can be counted"
                            )
                    time.sleep(1)
                for k in range(WARM):
                    run(client, k)
                with counting(vg.pid):
                    for k in range(n):
                        if run(client, k) != name:
                            raise RuntimeError(f"{case}: a query ran away from {name}")
        finally:
            os.killpg(vg.pid, signal.SIGTERM)
            vg.wait(120)
        return counted(out) / n


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diagnostics.sql_callgrind")
    ap.add_argument("dir", type=Path, help="a directory made by `sql_profile setup`")
    ap.add_argument("--case", choices=CASES, default=POINT_EMAIL)
    ap.add_argument("--queries", type=int, default=500)
    args = ap.parse_args(argv)
    if args.queries < 1:
        ap.error(f"--queries must be >= 1, got {args.queries}")
    found = per_query(args.dir, args.case, args.queries)
    print(f"{args.case}: its node runs {found:,.0f} instructions per query", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
