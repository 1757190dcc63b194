"""The scan client's row building alone: ``python -m bench.client_rows DIR [--before-src PATH]``.

``bench.client_profile`` measures a whole client operation; this isolates the calling
thread's main cost per scan, turning a block of raw index entries into rows
(``shardex.client.scan._EntryRows``), on the bench's own blocks. ``DIR`` is a
``bench.scan_profile setup`` directory: its cluster is started once to record the blocks of
``--scans`` scans per case of ``bench.scan_queries`` (``DIR/client-rows-blocks.pkl``), then
stopped. Each side decodes them in a worker process of its own (side A on the ``shardex``
package in ``--before-src``, first on its ``PYTHONPATH``; side B on this tree), the two taking
turns ``--rounds`` times; a worker reports the CPU time (``time.thread_time``) of its fastest
of ``--reps`` passes over a case's blocks, and each side keeps its fastest turn: the least
disturbed figure a shared machine gives. Prints CPU per row per side and B/A.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.pipeline_common import KEYSPACE, SEED, load1
from bench.runner import Row, report

BLOCKS = "client-rows-blocks.pkl"


def record(base: Path, scans: int) -> Path:
    """Each case's first ``scans`` scans as (DESC flags, blocks of raw entries)."""
    from bench.scan_profile import running
    from bench.scan_queries import CASES, KeyStats, build_queries
    from shardex.client import connect_local
    from shardex.demo.datagen import users

    out = base / BLOCKS
    docs = int((base / "docs.txt").read_text())
    queries = build_queries(KeyStats.of(users(docs, SEED)))
    cdir = base / "cluster"
    cases: dict[str, list[tuple[list[bool], list[list[bytes]]]]] = {}
    with running(cdir, new=False), connect_local(cdir) as client:
        for case in CASES:
            for q in queries[case][:scans]:
                result = client.scan(KEYSPACE, q.index, q.spans, limit=q.limit)
                cases.setdefault(case, []).append((list(result.started.desc), [*result.blocks()]))
    out.write_bytes(pickle.dumps(cases))
    return out


def _worker(blocks: Path, reps: int) -> None:
    """One JSON line: per case, the CPU seconds of the fastest pass and the rows per pass."""
    from shardex.client.scan import _EntryRows

    cases: dict[str, list[tuple[list[bool], list[list[bytes]]]]] = pickle.loads(blocks.read_bytes())
    out: dict[str, Any] = {}
    for case, scans in cases.items():
        best = float("inf")
        rows = 0
        for _ in range(reps):
            rows = 0
            t = time.thread_time()
            for desc, scan_blocks in scans:
                decoder = _EntryRows(desc, True)
                for block in scan_blocks:
                    rows += len(list(decoder.of(block)))
            best = min(best, time.thread_time() - t)
        out[case] = (best, rows)
    print(json.dumps(out), flush=True)


def _turn(blocks: Path, reps: int, src: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(src.resolve()), env.get("PYTHONPATH", "")) if p
        )
    cmd = [sys.executable, "-m", "bench.client_rows", str(blocks), "--worker", "--reps", str(reps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def measure(base: Path, before_src: Path | None, scans: int, rounds: int, reps: int) -> list[Row]:
    blocks = record(base, scans)
    sides = {"A": before_src, "B": None} if before_src is not None else {"B": None}
    best: dict[tuple[str, str], float] = {}
    counts: dict[str, int] = {}
    load_start = load1()
    for _ in range(rounds):
        for side, src in sides.items():
            for case, (cpu, rows) in _turn(blocks, reps, src).items():
                best[(side, case)] = min(best.get((side, case), float("inf")), cpu)
                counts[case] = rows
    out: list[Row] = []
    for case, rows in counts.items():
        row: Row = {"case": case, "rows": rows}
        for side in sides:
            row[f"ns/row {side}"] = best[(side, case)] / rows * 1e9
        if before_src is not None:
            row["B/A"] = row["ns/row B"] / row["ns/row A"]
        row["load"] = f"{load_start}->{load1()}"
        out.append(row)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.client_rows")
    ap.add_argument("dir", type=Path, help="a bench.scan_profile setup dir")
    ap.add_argument("--before-src", type=Path, help="side A's source tree (holds shardex/)")
    ap.add_argument("--scans", type=int, default=30, help="scans recorded per case")
    ap.add_argument("--rounds", type=int, default=5, help="turns of each side")
    ap.add_argument("--reps", type=int, default=10, help="passes per turn (the fastest counts)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.dir, args.reps)
        return 0
    start = time.perf_counter()
    rows = measure(args.dir, args.before_src, args.scans, args.rounds, args.reps)
    report(
        "client_rows",
        rows,
        elapsed=time.perf_counter() - start,
        extra={"before_src": str(args.before_src) if args.before_src else None},
        title="scan client: CPU per row built",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
