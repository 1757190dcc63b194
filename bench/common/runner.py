"""The shared benchmark runner: tables, JSON results, percentiles and the machine's figures.

A benchmark is a function (plain or ``async``) taking a ``BenchContext`` and returning rows:
a list of dicts with the same keys. The runner runs each one, prints every row in one table
(rich if installed, else plain aligned text) and writes all rows plus machine info to
``bench/results/<name>.json`` so runs can be compared over time.

    def main() -> None:
        run_suite("wire", [bench_a, bench_b], description="...")
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import inspect
import json
import math
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Row = dict[str, Any]
Benchmark = Callable[["BenchContext"], "list[Row] | Awaitable[list[Row]]"]

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"


@dataclass
class BenchContext:
    """What every benchmark gets: how long each measurement should run."""

    duration: float = 2.0


def load_average() -> list[float] | None:
    """The 1/5/15-minute load average, rounded, or None where the OS has none."""
    if not hasattr(os, "getloadavg"):
        return None
    return [round(x, 2) for x in os.getloadavg()]


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    load = load_average()
    if load is not None:
        # Figures on a shared machine mean little without the load they were taken under.
        info["load_avg_1_5_15"] = load
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _columns(rows: Sequence[Row]) -> list[str]:
    cols: list[str] = []
    for row in rows:
        cols.extend(k for k in row if k not in cols)
    return cols


# Columns of names, left-aligned in rich tables (the plain fallback decides per cell).
TEXT_COLUMNS = ("bench", "case", "system", "metric")


def print_table(title: str, rows: Sequence[Row]) -> None:
    cols = _columns(rows)
    cells = [[_fmt(r.get(c, "")) for c in cols] for r in rows]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
        print(title)
        print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
        print("  ".join("-" * w for w in widths))
        for row in cells:
            # Numbers right-aligned, text left-aligned, as a reader scans them.
            print(
                "  ".join(
                    v.rjust(w) if v[:1].isdigit() else v.ljust(w)
                    for v, w in zip(row, widths, strict=True)
                )
            )
        return
    table = Table(title=title)
    for c in cols:
        table.add_column(c, justify="left" if c in TEXT_COLUMNS else "right")
    for row in cells:
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # piped or in CI: do not squeeze columns to 80
    console.print(table)


def write_json(name: str, rows: Sequence[Row], extra: dict[str, Any] | None = None) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    doc = {"name": name, "machine": machine_info(), **(extra or {}), "rows": list(rows)}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def run_one(bench: Benchmark, ctx: BenchContext) -> list[Row]:
    result = bench(ctx)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return list(result)


async def _await(aw: Awaitable[list[Row]]) -> list[Row]:
    return await aw


QUICK_DURATION = 0.5  # seconds per measurement with --quick


def run_suite(
    name: str,
    benchmarks: Sequence[Benchmark],
    *,
    description: str = "",
    argv: Sequence[str] | None = None,
) -> list[Row]:
    """Parse ``--duration/--quick/--only``, run the benchmarks, print and save their rows."""
    parser = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=description)
    parser.add_argument("--duration", type=float, help="seconds per measurement (default 2)")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_DURATION:g} s per measurement"
    )
    parser.add_argument("--only", action="append", default=[], help="run benchmarks by name")
    args = parser.parse_args(argv)
    default = QUICK_DURATION if args.quick else 2.0
    ctx = BenchContext(duration=args.duration if args.duration is not None else default)
    selected = [b for b in benchmarks if not args.only or b.__name__ in args.only]
    rows: list[Row] = []
    start = time.perf_counter()
    for bench in selected:
        print(f"running {bench.__name__} ...", file=sys.stderr, flush=True)
        rows.extend(run_one(bench, ctx))
    elapsed = time.perf_counter() - start
    name = f"{name}-quick" if args.quick else name
    report(name, rows, elapsed=elapsed, extra={"duration_per_measurement": ctx.duration})
    return rows


def report(
    name: str,
    rows: Sequence[Row],
    *,
    elapsed: float,
    extra: dict[str, Any] | None = None,
    title: str | None = None,
) -> Path:
    """Print ``rows`` as one table (titled with the time taken, the load and the CPUs) and
    write them with machine info and ``extra`` to ``bench/results/<name>.json``. For
    benchmarks with their own arguments, which cannot use ``run_suite``."""
    load = load_average()
    load_text = f", load {load[0]:.1f}" if load else ""
    print_table(f"{title or name} ({elapsed:.1f} s{load_text}, {os.cpu_count()} CPUs)", rows)
    path = write_json(name, rows, {**(extra or {}), "elapsed": elapsed})
    print(f"wrote {path}", file=sys.stderr)
    return path


# --- figures shared by the benchmarks --------------------------------------------------


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def load1() -> float | None:
    load = load_average()
    return load[0] if load else None


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


def pct_ms(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of seconds, in ms."""
    return ms(percentile(sorted(values), q)) if values else float("nan")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending sequence."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


def fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (from /proc/mounts)."""
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind
