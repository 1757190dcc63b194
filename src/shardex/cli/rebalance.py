"""``shardex rebalance``: balance every keyspace's partitions over the data nodes that are up.

A progress bar per partition (copy, hand-over, publish), then a summary: partitions moved,
bytes and documents copied, duration, and the write pause of each partition (how long its
writes were refused and retried by clients). Exit code 0 when every move completed, 1 when
some did not (each failed move's partition stays where it was, serving).
"""

from __future__ import annotations

import json
import statistics
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from shardex.cli.common import EXIT_FAILED, err, out
from shardex.cli.keyspace import DirOption, local_client
from shardex.client import RebalanceError, RebalanceResult
from shardex.client.types import MoveResult

_STEP = {
    "planned": 0,
    "preparing": 1,
    "copying": 1,
    "hand-over": 2,
    "catching up": 2,
    "publishing": 3,
    "switching": 3,
    "resolving": 3,
    "aborting": 3,
}


def rebalance(
    cluster_dir: DirOption,
    max_parallel: Annotated[
        int, typer.Option("--max-parallel", min=1, max=8, help="Migrations at a time.")
    ] = 2,
    rate_limit: Annotated[
        float, typer.Option("--rate-limit", min=0, help="MB/s per copy (0: unlimited).")
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="The result as one JSON object.")] = False,
    eject: Annotated[
        list[str] | None,
        typer.Option(
            "--eject",
            help="Remove this node from the cluster (repeatable): its index slices move to "
            "other indexers and its copies to the other data nodes first, then it leaves the "
            "member list; stop it afterwards.",
        ),
    ] = None,
) -> None:
    """Balance every keyspace's partitions over the up data nodes (after add-node) and
    rebuild lost index copies, or with --eject move everything off some nodes and remove
    them from the cluster."""
    failed = False
    with local_client(cluster_dir, timeout=30.0) as client:
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=err,
            disable=as_json,
        )
        # One index partition may have two moves (off an ejected node, a new copy): by target.
        tasks: dict[tuple[str, str, int, str], TaskID] = {}

        def on_progress(r: RebalanceResult) -> None:
            for m in r.moves:
                key = (m.keyspace, m.index, m.partition, m.target)
                if key not in tasks:
                    desc = f"{_what(m)} {m.source} -> {m.target}"
                    if m.kind == "add":
                        desc += " (new copy)"
                    tasks[key] = progress.add_task(desc, total=4, status=m.status)
                step = 4 if m.status not in ("planned", "moving") else _STEP.get(m.phase, 0)
                label = m.phase if m.status == "moving" and m.phase else m.status
                if m.status == "done":
                    label = f"done, paused writes {m.pause_ms:.0f} ms"
                elif m.error:
                    label = f"[red]{m.status}[/]: {m.error[:60]}"
                progress.update(tasks[key], completed=step, status=label)

        with progress:
            try:
                result = client.rebalance(
                    max_parallel=max_parallel,
                    rate_limit=int(rate_limit * 1e6),
                    eject=eject or [],
                    on_progress=on_progress,
                )
            except RebalanceError as e:
                result, failed = e.result, True
    if as_json:
        print(json.dumps(result.to_dict(), sort_keys=True))
    else:
        _summary(result)
    if failed:
        raise typer.Exit(EXIT_FAILED)


def _what(m: MoveResult) -> str:
    """``keyspace/partition`` of a data move, ``keyspace.index/partition`` of an index's."""
    return f"{m.keyspace}.{m.index}/{m.partition}" if m.index else f"{m.keyspace}/{m.partition}"


def _summary(r: RebalanceResult) -> None:
    if not r.moves:
        if r.kind == "eject":
            out.print(f"[green]{r.message or 'ejected'}[/] (no active copy had to move)")
        elif r.message:  # replica copies moved, no active had to
            out.print(f"[green]{r.message}[/] (no active copy had to move)")
        else:
            out.print("[green]already balanced:[/] nothing to move")
        return
    table = Table(title=f"rebalance {r.id[:8]}: {r.state}")
    for col in ("partition", "from", "to", "status", "docs", "MB", "copy s", "pause ms"):
        table.add_column(
            col, justify="right" if col in ("docs", "MB", "copy s", "pause ms") else "left"
        )
    for m in r.moves:
        ok = m.status == "done"
        table.add_row(
            _what(m),
            m.source,
            f"{m.target} (new copy)" if m.kind == "add" else m.target,
            m.status if ok else f"[red]{m.status}[/] {m.error[:50]}",
            f"{m.docs:,}" if ok else "-",
            f"{m.bytes / 1e6:.2f}" if ok else "-",
            f"{m.copy_seconds:.2f}" if ok else "-",
            f"{m.pause_ms:.0f}" if ok else "-",
        )
    out.print(table)
    pauses = [m.pause_ms for m in r.moved]
    total = Table(show_header=False, title="summary")
    total.add_column("what")
    total.add_column("value", justify="right")
    total.add_row("partitions moved", f"{len(r.moved)} of {len(r.moves)}")
    total.add_row("bytes copied", f"{r.bytes / 1e6:,.2f} MB")
    total.add_row("documents copied", f"{r.docs:,}")
    total.add_row("duration", f"{r.duration:.2f} s")
    if r.kind == "rebalance" and r.message:
        total.add_row("replica chains", r.message)
    if pauses:
        total.add_row(
            "write pause per partition",
            f"median {statistics.median(pauses):.0f} ms, max {max(pauses):.0f} ms",
        )
    out.print(total)
    if r.kind == "eject" and r.state == "done":
        out.print(f"[green]{r.message}[/]: the ejected nodes hold nothing: stop their processes")
    if r.failed:
        err.print(f"[bold red]{len(r.failed)} move(s) did not complete[/]: {r.message}")
