"""Helpers shared by the phases of ``bench.scan`` and ``bench.sql`` (``bench/scan/phases.py``,
``bench/sql/phases.py``): a phase's output, the row-count check, PostgreSQL's ``docs`` table and
the measurement grid (case x setting x clients) over a ``bench.common.clients.ClientPool``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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


def pg_load_docs(conn: Any, files: Sequence[Path], ddl: Iterable[str], n_docs: int) -> int:
    """``docs(id, body jsonb)`` from the JSONL ``files``, then ``ddl`` (the twin indexes),
    VACUUM ANALYZE and a checkpoint; the count, checked to be ``n_docs``."""
    from bench.common.dataset import copy_files

    conn.execute(
        "CREATE TABLE docs (id text GENERATED ALWAYS AS (body->>'id') STORED "
        "PRIMARY KEY, body jsonb NOT NULL)"
    )
    copy_files(conn, files)
    for statement in ddl:
        conn.execute(statement)
    conn.execute("VACUUM (ANALYZE) docs")
    conn.execute("CHECKPOINT")
    count = conn.execute("SELECT count(*) FROM docs").fetchone()[0]
    if count != n_docs:
        raise RuntimeError(f"postgresql holds {count} documents, expected {n_docs}")
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
    column: str,
    label: Callable[[Any], str],
    rate: str,
) -> list[Row]:
    """Every case with every setting at every concurrency: one row each, the setting's
    ``label`` in ``column``; ``rate`` is the summary's per-second key (for the log)."""
    rows: list[Row] = []
    for case in cases:
        for setting in settings:
            for n in levels:
                load = load1()
                m = pool.measure(queries[case], setting, n, seconds)
                row: Row = {
                    "system": system,
                    "case": case,
                    column: label(setting),
                    "clients": n,
                    **m.summary(),
                    "load_1m": load,
                }
                if m.errors:
                    row["first error"] = m.errors[0]
                rows.append(row)
                log(
                    f"{system} {case} {row[column]} x{n}: p50 {row['p50 ms']} ms, "
                    f"{row[rate]} {rate} (load {load})"
                )
    return rows
