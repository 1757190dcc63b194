"""Two code versions side by side: ``python -m bench.scan_ab DIR --before-src PATH``.

A/B for the scan path on a shared, noisy machine. ``bench.scan_profile setup DIR`` made a
cluster in ``DIR/cluster``; this makes its twin ``DIR/twin`` once (a copy with other
ports and another secret, so the two never talk to each other), starts ``cluster`` on the
code in ``--before-src`` (its nodes get it first on ``PYTHONPATH``) and ``twin`` on this
tree, and runs the scans of every case against both from one process, the two taking turns
in rounds of 20 scans per consistency. A load spike from other work lands on both alike, so
read the B/A ratios: p50 and CPU per scan of the three node processes (user + system, from
``/proc``; a node's background work - heartbeats, reconcile - counts on both sides alike).
The client is this tree's on both sides (compare client-side changes with a micro-benchmark);
``--threads N`` runs N clients at once (threads of this process, so its GIL bounds them).
Both clusters are stopped before the command returns.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.data_service import percentile
from bench.local_cluster import free_base_port
from bench.pipeline_common import KEYSPACE, SEED, load1
from bench.scan_profile import CONSISTENCIES, ROUND, cpu_seconds, node_pids, running
from bench.scan_queries import CASES, KeyStats, build_queries

SIDES = ("A", "B")


def twin(base: Path) -> Path:
    """``base/twin``: a copy of ``base/cluster`` on free ports with its own secret (not
    named ``cluster...``: ``node_pids`` finds a cluster's nodes by its path, a prefix)."""
    from shardex.meta.cluster_dir import HTTP_PORT_OFFSET

    src, dst = base / "cluster", base / "twin"
    if dst.exists():
        return dst
    tmp = base / "twin.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("node.lock", "*.txt", "*.log"))
    old = _ports(tmp / "cluster.json")
    new_base = free_base_port(len(old) // 2, HTTP_PORT_OFFSET)
    old_base = min(old)
    mapping = {p: new_base + (p - old_base) for p in old}
    pattern = re.compile(r"\b(" + "|".join(str(p) for p in mapping) + r")\b")
    for f in [tmp / "cluster.json", *tmp.glob("*/node.toml"), *tmp.glob("*/members.json")]:
        text = f.read_text()
        f.write_text(pattern.sub(lambda m: str(mapping[int(m.group(1))]), text))
    secret = tmp / "secret"
    secret.write_text(secrets.token_hex(32) + "\n")
    os.chmod(secret, 0o600)
    tmp.rename(dst)
    return dst


def _ports(cluster_json: Path) -> list[int]:
    import json

    spec = json.loads(cluster_json.read_text())
    return sorted(p for n in spec["nodes"] for p in (n["port"], n["http_port"]))


def compare(
    base: Path,
    before_src: Path,
    scans: int,
    cases: Sequence[str],
    consistencies: Sequence[str],
    threads: int = 1,
) -> None:
    from shardex.client import connect_local
    from shardex.demo.datagen import users

    docs = int((base / "docs.txt").read_text())
    queries = build_queries(KeyStats.of(users(docs, SEED)))
    dirs = {"A": base / "cluster", "B": twin(base)}
    env_a = dict(os.environ)
    env_a["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(before_src.resolve()), os.environ.get("PYTHONPATH", "")) if p
    )
    with ExitStack() as stack:
        stack.enter_context(running(dirs["A"], new=False, env=env_a))
        stack.enter_context(running(dirs["B"], new=False))
        clients = {
            s: [stack.enter_context(connect_local(dirs[s])) for _ in range(threads)] for s in SIDES
        }
        pool = stack.enter_context(ThreadPoolExecutor(threads))
        pids = {s: node_pids(dirs[s]) for s in SIDES}
        for case in cases:
            qs = queries[case]
            lat: dict[tuple[str, str], list[float]] = {}
            cpu: dict[tuple[str, str], float] = {}
            load = load1()
            for s in SIDES:
                for c in consistencies:
                    for client in clients[s]:
                        for q in qs[:10]:  # warm
                            list(client.scan(KEYSPACE, q.index, q.spans, consistency=c))
            k = 0
            while k < scans:
                n = min(ROUND, scans - k)
                for c in consistencies:
                    for s in SIDES:
                        before = cpu_seconds(pids[s])[0]
                        jobs = [
                            pool.submit(
                                _scans, client, [qs[(i + j) % len(qs)] for i in range(k, k + n)], c
                            )
                            for j, client in enumerate(clients[s])
                        ]
                        for job in jobs:
                            lat.setdefault((s, c), []).extend(job.result())
                        cpu[(s, c)] = cpu.get((s, c), 0.0) + cpu_seconds(pids[s])[0] - before
                k += n
            for c in consistencies:
                row: dict[str, Any] = {}
                for s in SIDES:
                    ls = sorted(lat[(s, c)])
                    row[s] = (percentile(ls, 50), cpu[(s, c)] / len(ls))
                (pa, ca), (pb, cb) = row["A"], row["B"]
                print(
                    f"{case:20} {c:13} p50 A {pa * 1e3:6.2f} B {pb * 1e3:6.2f} ms "
                    f"(B/A {pb / pa:.2f})  node cpu/scan A {ca * 1e3:5.2f} B {cb * 1e3:5.2f} ms "
                    f"(B/A {cb / ca:.2f})  load {load}",
                    flush=True,
                )


def _scans(client: Any, qs: Sequence[Any], consistency: str) -> list[float]:
    """Run ``qs`` one after the other on ``client``: their latencies (checked row counts)."""
    out = []
    for q in qs:
        t = time.perf_counter()
        rows = list(client.scan(KEYSPACE, q.index, q.spans, consistency=consistency, limit=q.limit))
        out.append(time.perf_counter() - t)
        if len(rows) != q.expected_rows:
            raise RuntimeError(f"{q.case}: {len(rows)} rows, not {q.expected_rows}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scan_ab")
    ap.add_argument("dir", type=Path, help="a directory made by `bench.scan_profile setup`")
    ap.add_argument("--before-src", type=Path, required=True, help="A's code: a src/ dir")
    ap.add_argument("--scans", type=int, default=200)
    ap.add_argument("--case", action="append", choices=CASES)
    ap.add_argument("--consistency", action="append", choices=CONSISTENCIES)
    ap.add_argument(
        "--threads", type=int, default=1, help="concurrent clients (threads of this process)"
    )
    args = ap.parse_args(argv)
    compare(
        args.dir,
        args.before_src,
        args.scans,
        args.case or CASES,
        args.consistency or CONSISTENCIES,
        args.threads,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
