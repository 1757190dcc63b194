"""Client CPU per operation:
``python -m bench.diagnostics.client_profile DIR [--before-src PATH]``.

The concurrent-client ratios (``bench.scan``, 4-16 client processes on 2 cores) are
bounded by the CPU each client process spends per scan, so this measures exactly that: the
CPU time (user + system, ``time.process_time``) of a client process per 100-row scan
(``bench.scan.queries``' cases at not_bounded and request_plus) and per point ``get``,
divided by the operations run, and the p50 latency of an operation. ``--threads N`` runs N
threads of one client process at once (concurrent clients), so the p50 shows what the
client's CPU does to latency when its threads and the nodes share the cores; the CPU figure
is the one least moved by other work on the machine.

``DIR`` is a ``bench.diagnostics.scan_profile setup`` directory (a 3-node cluster with the
documents and both indexes built). The cluster runs on this tree's code; each side's client
runs in a worker process of its own (``--worker``): side B on this tree, side A (with
``--before-src``) on the ``shardex`` package in PATH (first on its ``PYTHONPATH``), so a
change to the client can be measured against the code before it while sharing one cluster.
The parent hands the workers rounds of ``ROUND`` operations of one kind in turn (A, B, then
B, A, ...), so a load spike from other work hits both sides alike: read the B/A ratio.
``--profile`` adds a cProfile of side B's client (the worker prints it at the end). Rows go
to ``bench/results/client_profile.json``. The cluster is stopped before the command returns.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common.dataset import KEYSPACE, SEED
from bench.common.runner import Row, load1, percentile, report

ROUND = 25  # operations of one kind per turn of one side
OPS = ("scan not_bounded", "scan request_plus", "get")
SIDES = ("A", "B")


# -- the worker (one client process) ---------------------------------------------------------


def _worker(cdir: Path, profile: bool, threads: int) -> None:
    """Read ``<op>\\t<n>`` lines, run ``n`` operations in each of ``threads`` threads,
    answer one JSON line each (CPU, wall and each operation's latency)."""
    from concurrent.futures import ThreadPoolExecutor

    from bench.scan.queries import CASES, KeyStats, build_queries
    from shardex.client import connect_local
    from shardex.demo.datagen import users

    docs = int((cdir.parent / "docs.txt").read_text())
    queries = build_queries(KeyStats.of(users(docs, SEED)))
    scans = [q for case in CASES for q in queries[case]]
    prof = cProfile.Profile() if profile else None
    loop_prof = cProfile.Profile() if profile else None  # the client's event-loop thread
    with connect_local(cdir) as client:
        ks = client.keyspace(KEYSPACE)
        counter = [0]

        def scan(consistency: str) -> None:
            q = scans[counter[0] % len(scans)]
            counter[0] += 1
            rows = list(
                client.scan(KEYSPACE, q.index, q.spans, consistency=consistency, limit=q.limit)
            )
            if len(rows) != q.expected_rows:
                raise RuntimeError(f"{q.case}: {len(rows)} rows, not {q.expected_rows}")

        def get() -> None:
            i = (counter[0] * 7919) % docs  # spread over partitions
            counter[0] += 1
            ks.get(f"user-{i:07d}")

        run: dict[str, Callable[[], None]] = {
            "scan not_bounded": lambda: scan("not_bounded"),
            "scan request_plus": lambda: scan("request_plus"),
            "get": get,
        }
        for op in OPS:  # warm: connections, routing tables, the scan preference
            for _ in range(10):
                run[op]()
        pool = ThreadPoolExecutor(threads)

        def timed(fn: Callable[[], None], n: int) -> list[float]:
            out = []
            for _ in range(n):
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
            return out

        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            op, n = line.rstrip("\n").split("\t")
            fn = run[op]
            if prof is not None and loop_prof is not None:
                prof.enable()
                _on_loop(client, loop_prof.enable)
            cpu, wall, main = time.process_time(), time.perf_counter(), time.thread_time()
            if threads == 1:
                lat = timed(fn, int(n))
            else:
                jobs = [pool.submit(timed, fn, int(n)) for _ in range(threads)]
                lat = [x for job in jobs for x in job.result()]
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            main = time.thread_time() - main
            if prof is not None and loop_prof is not None:
                prof.disable()
                _on_loop(client, loop_prof.disable)
            out = {"cpu": cpu, "wall": wall, "main": main, "lat": lat}
            print(json.dumps(out), flush=True)
        pool.shutdown()
    for title, p in (("caller thread", prof), ("event-loop thread", loop_prof)):
        if p is not None:
            print(f"--- {title} ---", file=sys.stderr)
            pstats.Stats(p, stream=sys.stderr).sort_stats("tottime").print_stats(30)


def _on_loop(client: Any, fn: Callable[[], None]) -> None:
    """Run ``fn`` on the client's event-loop thread (a profiler's enable/disable must run in
    the thread it profiles), waiting for it."""
    import asyncio

    async def call() -> None:
        fn()

    asyncio.run_coroutine_threadsafe(call(), client.rpc.loop).result(10)


# -- the parent: cluster, workers, interleaved rounds ----------------------------------------


class _Side:
    def __init__(
        self,
        cdir: Path,
        src: Path | None,
        profile: bool,
        threads: int,
        log: Path,
    ) -> None:
        env = dict(os.environ)
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(src.resolve()), env.get("PYTHONPATH", "")) if p
            )
        cmd = [sys.executable, "-m", "bench.diagnostics.client_profile", str(cdir), "--worker"]
        cmd += ["--threads", str(threads)]
        if profile:
            cmd.append("--profile")
        self._err = log.open("w")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True, env=env
        )
        self._expect("ready")

    def _expect(self, key: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"client worker exited (see {self._err.name})")
        out: dict[str, Any] = json.loads(line)
        if key not in out:
            raise RuntimeError(f"client worker said {line!r}")
        return out

    def run(self, op: str, n: int) -> tuple[float, float, float, list[float]]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{op}\t{n}\n")
        self.proc.stdin.flush()
        out = self._expect("cpu")
        return out["cpu"], out["wall"], out["main"], out["lat"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self._err.close()


def measure(
    base: Path,
    before_src: Path | None,
    ops: int,
    profile: bool,
    threads: int = 1,
) -> list[Row]:
    from bench.diagnostics.scan_profile import running

    cdir = base / "cluster"
    ab = before_src is not None
    sides = SIDES if ab else ("B",)
    totals = {(s, op): [0.0, 0.0, 0.0, 0] for s in sides for op in OPS}
    lats: dict[tuple[str, str], list[float]] = {(s, op): [] for s in sides for op in OPS}
    load_start = load1()
    with running(cdir, new=False):
        workers: dict[str, _Side] = {}
        try:
            for s in sides:
                src = before_src if s == "A" else None
                log = base / f"worker-{s}.log"
                workers[s] = _Side(cdir, src, profile and s == "B", threads, log)
            done = 0
            while done < ops:
                n = min(ROUND, ops - done)
                # The sides' order flips every round: neither always runs right after the
                # other (the nodes' state, caches and the load it leaves would favour one).
                turn = sides if (done // ROUND) % 2 == 0 else sides[::-1]
                for op in OPS:
                    for s in turn:
                        cpu, wall, main, lat = workers[s].run(op, n)
                        t = totals[(s, op)]
                        t[0] += cpu
                        t[1] += wall
                        t[2] += main
                        t[3] += n * threads
                        lats[(s, op)] += lat
                done += n
        finally:
            for w in workers.values():
                w.close()
    if profile:
        print((base / "worker-B.log").read_text(), file=sys.stderr)
    rows: list[Row] = []
    for op in OPS:
        row: Row = {"case": op, "ops": ops, "threads": threads}
        for s in sides:
            cpu, wall, main, n = totals[(s, op)]
            row[f"cpu_us {s}"] = cpu / n * 1e6
            if threads == 1:  # of cpu: the calling thread's share (with threads: the pool's)
                row[f"caller_us {s}"] = main / n * 1e6
            row[f"p50_us {s}"] = percentile(sorted(lats[(s, op)]), 50) * 1e6
        if ab:
            row["cpu B/A"] = row["cpu_us B"] / row["cpu_us A"]
            row["p50 B/A"] = row["p50_us B"] / row["p50_us A"]
        row["load"] = f"{load_start}->{load1()}"
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diagnostics.client_profile")
    ap.add_argument(
        "dir",
        type=Path,
        help="a bench.diagnostics.scan_profile setup dir (or, with --worker, a cluster dir)",
    )
    ap.add_argument("--before-src", type=Path, help="side A's source tree (holds shardex/)")
    ap.add_argument(
        "--ops", type=int, default=400, help="operations of each kind per side (per thread)"
    )
    ap.add_argument("--profile", action="store_true", help="cProfile side B's client")
    ap.add_argument("--threads", type=int, default=1, help="concurrent threads per client")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.dir, args.profile, args.threads)
        return 0
    start = time.perf_counter()
    rows = measure(args.dir, args.before_src, args.ops, args.profile, args.threads)
    report(
        "client_profile",
        rows,
        elapsed=time.perf_counter() - start,
        extra={
            "before_src": str(args.before_src) if args.before_src else None,
        },
        title="client CPU per operation",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
