"""``shardex load KEYSPACE FILE``: bulk-load JSON Lines with progress, summary, error report.

Good lines are upserted in batches (``Keyspace.upsert_many``: grouped by owner node, sent in
parallel, pipelined); a bad line (not JSON, not an object, no id field, too large, or refused
by the node) is reported with its line number and reason and never stops the load. Exit code
0 when every line was loaded, 1 when some were not.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from shardex.cli.common import EXIT_FAILED, err, fail, out
from shardex.cli.keyspace import DirOption, local_client
from shardex.cli.loadfile import BadLine, Doc, read_lines
from shardex.client.bulk import Result
from shardex.errors import ShardexError


def load(
    keyspace: Annotated[str, typer.Argument(help="Keyspace to load into (must exist).")],
    file: Annotated[
        Path, typer.Argument(help="JSON Lines file: one JSON object per line.", dir_okay=False)
    ],
    cluster_dir: DirOption,
    id_field: Annotated[
        str | None,
        typer.Option("--id-field", help="Top-level field holding the docid (default: a uuid4)."),
    ] = None,
    batch: Annotated[
        int, typer.Option("--batch", min=1, max=50_000, help="Docs per batch.")
    ] = 1000,
    durability: Annotated[
        str,
        typer.Option(
            help="none | persist_active (persist) | majority | majority_persist_active | "
            "persist_majority (see docs/operations.md: Replicas and durable writes)."
        ),
    ] = "persist",
    show_errors: Annotated[
        int, typer.Option("--show-errors", help="Bad lines to print (all go to --errors-file).")
    ] = 20,
    errors_file: Annotated[
        Path | None, typer.Option("--errors-file", help="Write every bad line as JSON Lines.")
    ] = None,
) -> None:
    """Load a JSON Lines file into a keyspace."""
    try:
        size = file.stat().st_size
        fh = file.open("rb")
    except OSError as e:
        fail(ShardexError(f"cannot read {file}: {e.strerror}", details={"path": str(file)}))
    bad: list[BadLine] = []
    pending: dict[int, Doc] = {}  # item index -> its line, until its result is in
    loaded = 0
    with fh, local_client(cluster_dir, timeout=120.0) as client:
        ks = client.keyspace(keyspace)
        ks.partition_of("probe")  # KEYSPACE_NOT_FOUND now, not after reading the file
        progress = Progress(
            TextColumn("[bold]loading[/] {task.fields[docs]:,} docs"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=False,
        )
        task = progress.add_task("load", total=size, docs=0)
        counter = iter(range(1 << 62))

        def items() -> Iterator[tuple[str, bytes]]:
            for item in read_lines(fh, id_field=id_field):
                if isinstance(item, BadLine):
                    bad.append(item)
                    progress.advance(task, item.nbytes)
                    continue
                pending[next(counter)] = item
                yield item.docid, item.body

        def on_chunk(start: int, results: list[Result]) -> None:
            nonlocal loaded
            done = 0
            for i, r in enumerate(results, start):
                doc = pending.pop(i)
                done += doc.nbytes
                if isinstance(r, ShardexError):
                    bad.append(BadLine(doc.line, doc.nbytes, f"{r.code.value}: {r.message}"))
                else:
                    loaded += 1
            progress.update(task, advance=done, docs=loaded)

        started = time.perf_counter()
        with progress:
            ks.upsert_many(
                items(),
                chunk_size=batch,
                durability=durability,
                raise_errors=False,
                on_chunk=on_chunk,
            )
        seconds = time.perf_counter() - started

    bad.sort(key=lambda b: b.line)
    _summary(keyspace, file, loaded, len(bad), seconds, size)
    if errors_file is not None:
        with errors_file.open("w", encoding="utf-8") as fh_err:
            for b in bad:
                fh_err.write(json.dumps({"line": b.line, "reason": b.reason}) + "\n")
    if bad:
        for b in bad[:show_errors]:
            err.print(f"[red]line {b.line}:[/] {b.reason}", markup=True, highlight=False)
        if len(bad) > show_errors:
            where = f" (all in {errors_file})" if errors_file else " (use --errors-file FILE)"
            err.print(f"... and {len(bad) - show_errors} more bad line(s){where}")
        err.print(f"[bold red]{len(bad)} line(s) were not loaded[/]; {loaded:,} were.")
        raise typer.Exit(EXIT_FAILED)


def _summary(
    keyspace: str, file: Path, loaded: int, failed: int, seconds: float, size: int
) -> None:
    table = Table(title=f"load {file.name} -> {keyspace}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("documents loaded", f"{loaded:,}")
    table.add_row("bad lines", f"[red]{failed:,}[/]" if failed else "0")
    table.add_row("seconds", f"{seconds:.2f}")
    table.add_row("docs/s", f"{loaded / seconds:,.0f}" if seconds > 0 else "-")
    table.add_row("MB/s", f"{size / seconds / 1e6:.1f}" if seconds > 0 else "-")
    out.print(table)
