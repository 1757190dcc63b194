"""``shardex backup create|list|restore``: backups of keyspaces into a repository directory
(Parquet per data partition, JSON manifests), incremental after the first, and restores into
any running cluster (``shardex.backup``; docs/operations.md, "Backup and restore").

Exit code 0 on success; 1 when the cluster or the repository refuses (the error names the
path or keyspace and a hint), or when ``restore --verify`` finds differences.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from shardex.backup.repo import Repo
from shardex.backup.restore import (
    RestoreEvents,
    RestoreResult,
    VerifyReport,
    restore_backup,
    verify,
)
from shardex.backup.take import BackupEvents, create_backup
from shardex.cli.common import EXIT_FAILED, err, fail, out
from shardex.cli.keyspace import DirOption, local_client
from shardex.errors import ShardexError

app = typer.Typer(
    help="Back keyspaces up into a repository directory and restore them.",
    no_args_is_help=True,
)

RepoOption = Annotated[
    Path, typer.Option("--repo", help="Backup repository directory.", file_okay=False)
]
KeyspaceOption = Annotated[
    str | None, typer.Option("--keyspace", "-k", help="Only this keyspace (default: all).")
]


def _progress(label: str) -> Progress:
    return Progress(
        TextColumn(f"[bold]{label}[/] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=False,
    )


@app.command()
def create(
    cluster_dir: DirOption,
    repo: RepoOption,
    keyspace: KeyspaceOption = None,
) -> None:
    """Back up every keyspace (or --keyspace) at a recorded seqno vector, without blocking
    writes: a full backup into a new repository, an incremental into one that holds one."""
    progress = _progress("backup")
    task = progress.add_task("partitions", total=None)
    rows = 0

    def partition(ks: str, p: int, n: int) -> None:
        nonlocal rows
        rows += n
        progress.update(task, advance=1, description=f"{ks} ({rows:,} rows)")

    events = BackupEvents(
        start=lambda total: progress.update(task, total=total),
        partition=partition,
        note=lambda m: progress.console.print(f"[yellow]note:[/] {m}", soft_wrap=True),
    )
    with local_client(cluster_dir, timeout=120.0) as client, progress:
        manifest = create_backup(
            client, repo, keyspaces=None if keyspace is None else [keyspace], events=events
        )
    table = Table(title=f"backup {manifest.name} -> {repo}")
    for col in ("keyspace", "partitions", "full", "incremental", "documents", "tombstones"):
        table.add_column(col, justify="left" if col == "keyspace" else "right")
    for name, ks in manifest.keyspaces.items():
        fulls = sum(1 for e in ks.partitions.values() if e.kind == "full")
        table.add_row(
            name,
            str(ks.num_partitions),
            str(fulls),
            str(ks.num_partitions - fulls),
            f"{ks.documents:,}",
            f"{ks.tombstones:,}",
        )
    out.print(table)


@app.command("list")
def list_(
    repo: RepoOption,
    as_json: Annotated[bool, typer.Option("--json", help="Every manifest, as JSON.")] = False,
    vectors: Annotated[
        bool, typer.Option("--vectors", help="Also print each keyspace's seqno vector.")
    ] = False,
) -> None:
    """List the repository's backups: times, keyspaces, documents, seqno vectors."""
    try:
        backups = Repo.open(repo).backups()
    except ShardexError as e:
        fail(e)
    if as_json:
        import msgspec

        print(msgspec.json.encode(backups).decode())
        return
    table = Table(title=f"backups in {repo}")
    for col in ("backup", "finished", "keyspace", "kind", "documents", "tombstones", "vector"):
        table.add_column(col, justify="right" if col in ("documents", "tombstones") else "left")
    for m in backups:
        for name, ks in m.keyspaces.items():
            fulls = sum(1 for e in ks.partitions.values() if e.kind == "full")
            kind = "full" if fulls == len(ks.partitions) else "incremental"
            if 0 < fulls < len(ks.partitions):
                kind += f" ({fulls} full)"
            vector = ks.vector
            total = sum(s for s, _ in vector.values())
            cell = (
                " ".join(f"{p}:{s}/{u}" for p, (s, u) in vector.items())
                if vectors
                else f"{len(vector)} partitions, seqnos sum {total:,}"
            )
            table.add_row(
                m.name, m.finished, name, kind, f"{ks.documents:,}", f"{ks.tombstones:,}", cell
            )
    out.print(table)


@app.command()
def restore(
    cluster_dir: DirOption,
    repo: RepoOption,
    keyspace: KeyspaceOption = None,
    to_keyspace: Annotated[
        str | None,
        typer.Option("--to-keyspace", help="Restore into this keyspace (one --keyspace)."),
    ] = None,
    backup: Annotated[
        str | None,
        typer.Option("--backup", help="Restore as of this backup (default: the newest)."),
    ] = None,
    partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions", "-p", help="Partitions of a keyspace created (default: as backed up)."
        ),
    ] = None,
    batch: Annotated[
        int, typer.Option("--batch", min=1, max=50_000, help="Docs per batch.")
    ] = 1000,
    durability: Annotated[str, typer.Option(help="Durability of the restore's writes.")] = (
        "persist"
    ),
    check: Annotated[
        bool,
        typer.Option(
            "--verify", help="Afterwards, compare the cluster's documents with the backup's."
        ),
    ] = False,
) -> None:
    """Restore a backup into a running cluster (any size, any partition count): documents
    as of the backup, deletions applied, the keyspace created if missing, then the index
    definitions (built by the index pipeline). Run again after a crash: it continues."""
    progress = _progress("restore")
    task = progress.add_task("", total=None)
    events = RestoreEvents(
        start=lambda ks, total: progress.reset(task, total=total, description=ks),
        advance=lambda n: progress.advance(task, n),
        note=lambda m: progress.console.print(f"[yellow]note:[/] {m}", soft_wrap=True),
    )
    reports: list[VerifyReport] = []
    with local_client(cluster_dir, timeout=120.0) as client:
        with progress:
            results = restore_backup(
                client,
                repo,
                keyspace=keyspace,
                to_keyspace=to_keyspace,
                backup=backup,
                num_partitions=partitions,
                batch=batch,
                durability=durability,
                events=events,
            )
        _restored(results)
        if check:
            for r in results:
                reports.append(
                    verify(
                        client,
                        repo,
                        keyspace=r.keyspace,
                        to_keyspace=r.to_keyspace,
                        backup=r.backup,
                    )
                )
    if check and not _verified(reports):
        raise typer.Exit(EXIT_FAILED)


def _restored(results: list[RestoreResult]) -> None:
    table = Table(title="restored")
    counts = ("documents", "expired", "deletions")
    for col in ("keyspace", "into", "backup", *counts, "indexes"):
        table.add_column(col, justify="right" if col in counts else "left")
    for r in results:
        indexes = ", ".join(r.indexes_created) or "-"
        if r.indexes_existing:
            indexes += f" (existing: {', '.join(r.indexes_existing)})"
        table.add_row(
            r.keyspace,
            r.to_keyspace + (" (created)" if r.created_keyspace else ""),
            r.backup,
            f"{r.documents:,}",
            f"{r.expired:,}",
            f"{r.deletions:,}",
            indexes,
        )
    out.print(table)


def _verified(reports: list[VerifyReport]) -> bool:
    ok = True
    for rep in reports:
        if rep.ok:
            out.print(f"verify {rep.to_keyspace}: {rep.matched:,} documents equal the backup's")
            continue
        ok = False
        for what, ids in (
            ("missing", rep.missing),
            ("extra", rep.extra),
            ("different", rep.different),
        ):
            if ids:
                err.print(
                    f"[red]verify {rep.to_keyspace}:[/] {len(ids):,} {what}, e.g. "
                    + json.dumps(ids[:5])
                )
    return ok
