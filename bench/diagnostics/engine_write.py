"""Instructions per write of ``DataEngine.mutate_many`` alone:
``python -m bench.diagnostics.engine_write``.

The data node's write path without the network, the event loop or the fsync: a temporary
engine with a 64-partition keyspace, ``--docs`` of the pipeline bench's users preloaded, then
the same number of updates in calls of ``--group`` (memory durability unless ``--persist``).
Each measurement runs this module twice under ``perf stat -e instructions:u`` (with the
timed loop and without it, everything else equal) and reports the difference per write, a
figure a loaded machine barely moves, with the loop's thread CPU beside. ``--baseline-src
DIR`` (e.g. ``git archive HEAD src | tar -x -C DIR``, then ``DIR/src``) alternates the two
trees ``--rounds`` times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

KEYSPACE = "people"
PARTITIONS = 64
ROOT = Path(__file__).resolve().parent.parent


def child(docs: int, group: int, persist: bool, loop: bool) -> None:
    """Build the engine and the updates; run the loop only when ``loop``."""
    from bench.common.dataset import updates
    from shardex.data.engine import DataEngine

    with tempfile.TemporaryDirectory(prefix="engine-write-") as d:
        eng = DataEngine(Path(d) / "data")
        eng.create_keyspace(KEYSPACE, num_partitions=PARTITIONS)
        for p in range(PARTITIONS):
            eng.create_partition(KEYSPACE, p)
        first = [("upsert", k, b, None) for k, b in updates(docs, docs, 7)]
        for i in range(0, docs, 500):
            eng.mutate_many(KEYSPACE, first[i : i + 500], durability="memory")
        ops = [("upsert", k, b, None) for k, b in updates(docs, docs, 8)]
        calls = [ops[i : i + group] for i in range(0, docs, group)]
        durability = "persist" if persist else "memory"
        t = time.thread_time()
        if loop:
            for call in calls:
                eng.mutate_many(KEYSPACE, call, durability=durability)
        print(f"thread_cpu_us {1e6 * (time.thread_time() - t) / docs:.1f}")
        eng.close()


def instructions(src: Path, args: argparse.Namespace, loop: bool) -> tuple[int, float]:
    cmd = ["perf", "stat", "-e", "instructions:u", "-x", ",", sys.executable, "-m"]
    cmd += [
        "bench.diagnostics.engine_write",
        "--child",
        "--docs",
        str(args.docs),
        "--group",
        str(args.group),
    ]
    cmd += ["--persist"] * args.persist + ["--loop"] * loop
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    count = next(int(line.split(",")[0]) for line in out.stderr.splitlines() if "instr" in line)
    cpu = float(out.stdout.split()[-1])
    return count, cpu


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.diagnostics.engine_write", description=__doc__
    )
    ap.add_argument("--docs", type=int, default=20_000, help="documents, and updates timed")
    ap.add_argument("--group", type=int, default=16, help="ops per mutate_many call")
    ap.add_argument("--persist", action="store_true", help="fsync each call (default: memory)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-src", type=Path, help="a shardex src dir to compare against")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.docs <= 0 or args.group <= 0 or args.rounds <= 0:
        ap.error("--docs, --group and --rounds must be > 0")
    if args.child:
        child(args.docs, args.group, args.persist, args.loop)
        return 0
    if shutil.which("perf") is None:
        ap.error("needs perf (linux-tools) on PATH")
    trees = [("current", ROOT / "src")]
    if args.baseline_src is not None:
        if not (args.baseline_src / "shardex").is_dir():
            ap.error(f"--baseline-src {args.baseline_src} has no shardex package")
        trees.append(("baseline", args.baseline_src))
    for r in range(args.rounds):
        for name, src in trees if r % 2 == 0 else trees[::-1]:
            base, _ = instructions(src, args, loop=False)
            full, cpu = instructions(src, args, loop=True)
            per = (full - base) / args.docs
            print(f"round {r} {name}: {per / 1e3:.1f}k instructions/write, {cpu} us CPU/write")
    return 0


if __name__ == "__main__":
    sys.exit(main())
