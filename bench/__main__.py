"""The headline benchmarks one after the other: ``python -m bench [--quick] [--only AREA]``.

Each area runs as its own process (``python -m bench.<area>``, with ``--quick`` passed on),
never two at once: they start local clusters and PostgreSQL servers that would compete for
the machine's cores. Every area prints its tables and writes its JSON as when run alone; a
failed area does not stop the others, and the exit status says whether all passed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence

# The cheap ones first, so a broken environment shows before the Spark builds run.
AREAS = (
    "wire", "data_service", "replication", "tls", "backup", "scan", "sql", "sql_breadth",
    "http", "pipeline", "spark_connector",
)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="each area's quick mode")
    ap.add_argument("--only", action="append", choices=AREAS, help="run these areas only")
    args = ap.parse_args(argv)
    failed: list[str] = []
    for area in args.only or AREAS:
        cmd = [sys.executable, "-m", f"bench.{area}", *(["--quick"] if args.quick else [])]
        print(f"== {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        t = time.monotonic()
        code = subprocess.call(cmd)
        print(f"== bench.{area}: exit {code} in {time.monotonic() - t:.0f} s", file=sys.stderr)
        if code != 0:
            failed.append(area)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
