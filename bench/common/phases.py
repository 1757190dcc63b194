"""Helpers shared by the phases of ``bench.scan`` and ``bench.sql`` (``bench/scan/phases.py``,
``bench/sql/phases.py``): a phase's output, the row-count check, PostgreSQL's ``docs`` table and
the measurement grid (case x setting x clients) over a ``bench.common.clients.ClientPool``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common.runner import Row, load1, log


@dataclass
class Phase:
    """One system's output: measurement rows, the answers its check queries returned (for
    the other system's checks) and what else it reports."""

    rows: list[Row] = field(default_factory=list)
    answers: dict[tuple[str, int], Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def check_rows(system: str, case: str, params: Any, got: int, expected: int) -> None:
    """A check query returned ``expected`` rows, or a ``RuntimeError`` naming it."""
    if got != expected:
        raise RuntimeError(f"{system}: {case} {params} returned {got} rows, expected {expected}")


def pg_load_docs(
    conn: Any, files: Sequence[Path], ddl: Iterable[str], n_docs: int, table: str = "docs"
) -> int:
    """``table(id, body jsonb)`` from the JSONL ``files``, then ``ddl`` (the twin indexes),
    VACUUM ANALYZE and a checkpoint; the count, checked to be ``n_docs``."""
    from bench.common.dataset import copy_files

    t = time.perf_counter()
    conn.execute(
        f"CREATE TABLE {table} (id text GENERATED ALWAYS AS (body->>'id') STORED "
        "PRIMARY KEY, body jsonb NOT NULL)"
    )
    copy_files(conn, files, table)
    log(f"postgresql: COPY of {n_docs:,} {table} done after {time.perf_counter() - t:.0f} s")
    for statement in ddl:
        conn.execute(statement)
        log(f"postgresql: {statement} done after {time.perf_counter() - t:.0f} s")
    conn.execute(f"VACUUM (ANALYZE) {table}")
    conn.execute("CHECKPOINT")
    log(f"postgresql: VACUUM ANALYZE and CHECKPOINT done after {time.perf_counter() - t:.0f} s")
    count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    if count != n_docs:
        raise RuntimeError(f"postgresql holds {count} {table}, expected {n_docs}")
    return int(count)


def measure_grid(
    system: str,
    pool: Any,
    queries: dict[str, list[Any]],
    cases: Sequence[str],
    settings: Sequence[Any],
    levels: Sequence[int],
    seconds: float,
    *,
    columns: Callable[[Any], Mapping[str, Any]],
    rate: str,
    server_cpu: Callable[[], float] | None = None,
) -> list[Row]:
    """Every case with every setting at every concurrency: one row each, ``columns(setting)``
    naming the setting; ``rate`` is the summary's per-second key (for the log).
    ``server_cpu``: the servers' CPU counter, for the CPU-per-query columns."""
    rows: list[Row] = []
    for case in cases:
        for setting in settings:
            for n in levels:
                load = load1()
                m = pool.measure(queries[case], setting, n, seconds, server_cpu=server_cpu)
                named = dict(columns(setting))
                row: Row = {
                    "system": system,
                    "case": case,
                    **named,
                    "clients": n,
                    **m.summary(),
                    "load_1m": load,
                }
                if m.errors:
                    row["first error"] = m.errors[0]
                rows.append(row)
                cpu = row.get(f"server CPU ms/{m.OP}")
                log(
                    f"{system} {case} {' '.join(map(str, named.values()))} x{n}: "
                    f"p50 {row['p50 ms']} ms, {row[rate]} {rate}, server CPU {cpu} ms/{m.OP} "
                    f"(load {load})"
                )
    return rows
