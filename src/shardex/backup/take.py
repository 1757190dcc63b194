"""``create_backup``: every partition of the chosen keyspaces up to a recorded seqno vector,
into a new backup of the repository, without blocking a write.

How a consistent copy is read without stopping writers: the index pipeline's initial build
does the same (docs/architecture.md, "Spark change-stream source"). The keyspace's high
seqnos are taken first (``Client.high_seqnos``: the vector T0); each partition is then read
up to exactly its T0 seqno through the pipeline's change readers (``iter_chunks``), from the
change log, which writes after T0 only extend. So the backup holds each partition as of its
T0 entry, and T0 is what the manifest records.

* A full copy reads (0, T0] in snapshot mode (``snapshot.read_snapshots``): each docid's
  last version, tombstones dropped. When the log below T0 is purged, the partition is read
  by a backfill stream instead, and when a failover moved it to another branch meanwhile, at
  its new high seqno: the seqno and uuid it was read at are the partition's entry of the
  vector.
* An incremental reads (last backup's seqno, T0] on the last backup's uuid: every change,
  each docid's newest version kept, deletions as tombstones. A partition whose uuid changed
  since the last backup (a failover), or whose log no longer reaches back (ROLLBACK), is
  copied in full and the entry says why (``note``); so is every partition of a keyspace that
  was dropped and re-created.
* Crash safety: the backup is written under ``tmp/NAME/`` and renamed into ``backups/`` with
  its manifest at the end. Each finished partition leaves its entry beside its file, so a
  ``create`` after a crash continues the same backup, keeping the partitions already done
  whose files still match their entries.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import msgspec

from shardex.api.records import OP_DELETE, Change
from shardex.backup.merge import chain_of, latest_versions
from shardex.backup.repo import (
    FORMAT,
    FULL,
    INCREMENTAL,
    VERSION,
    IndexEntry,
    KeyspaceEntry,
    Manifest,
    PartitionEntry,
    Repo,
    intact,
    write_partition,
    write_replace,
)
from shardex.backup.snapshot import GROUP, read_snapshots
from shardex.client import Client
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import DELETED, INIT, READY
from shardex.pipeline.source.read import chunk_groups
from shardex.pipeline.source.types import PartitionRange
from shardex.runtime.files import atomic_write_bytes

T = TypeVar("T")

PLAN = "plan.json"


class Plan(msgspec.Struct, kw_only=True, frozen=True):
    """What a backup under way is: kept in its temp directory so a later ``create``
    continues it instead of starting over."""

    name: str
    parent: str | None
    keyspaces: list[str]
    started: str


@dataclass(slots=True)
class BackupEvents:
    """What a backup tells its caller (the CLI's progress bar); every hook optional."""

    start: Callable[[int], None] = lambda total_partitions: None
    partition: Callable[[str, int, int], None] = lambda keyspace, partition, rows: None
    note: Callable[[str], None] = lambda message: None


@dataclass(slots=True)
class _Todo:
    keyspace: str
    partition: int
    kind: str
    from_seqno: int
    from_uuid: int
    seqno: int
    uuid: int
    note: str | None = None


@dataclass(slots=True)
class _KeyspaceRun:
    entry: KeyspaceEntry  # partitions filled in as they finish
    dir: Path
    done: dict[int, PartitionEntry] = field(default_factory=dict)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def create_backup(
    client: Client,
    repo_path: Path,
    *,
    keyspaces: Sequence[str] | None = None,
    events: BackupEvents | None = None,
    now: Callable[[], dt.datetime] = utc_now,
) -> Manifest:
    """Back ``keyspaces`` (None: every keyspace) up into the repository at ``repo_path``
    (made if missing); an incremental of each keyspace the repository already holds."""
    ev = events or BackupEvents()
    started = now()
    repo = Repo.open_or_init(repo_path, started.isoformat())
    with repo.locked():
        backups = repo.backups()
        names = _keyspaces(client, keyspaces)
        parent = backups[-1].name if backups else None
        plan, tmp = _resume_or_plan(repo, parent, names, started, ev)
        runs = {ks: _prepare(client, tmp, ks, ev) for ks in names}
        ev.start(sum(r.entry.num_partitions for r in runs.values()))
        for ks, run in runs.items():
            for p, e in run.done.items():
                ev.partition(ks, p, e.rows)
            _copy_keyspace(client, run, backups, ev)
        manifest = Manifest(
            format=FORMAT,
            version=VERSION,
            name=plan.name,
            parent=plan.parent,
            started=plan.started,
            finished=now().isoformat(),
            keyspaces={
                ks: msgspec.structs.replace(r.entry, partitions=dict(sorted(r.done.items())))
                for ks, r in runs.items()
            },
        )
        repo.publish(tmp, manifest)
        return manifest


def _keyspaces(client: Client, wanted: Sequence[str] | None) -> list[str]:
    existing = sorted(k.name for k in client.list_keyspaces())
    if wanted is None:
        if not existing:
            raise ShardexError(
                "the cluster has no keyspace to back up",
                code=ErrorCode.KEYSPACE_NOT_FOUND,
                details={"hint": "shardex keyspace list shows them"},
            )
        return existing
    for name in wanted:
        if name not in existing:
            raise ShardexError(
                f"keyspace {name!r} not found",
                code=ErrorCode.KEYSPACE_NOT_FOUND,
                details={"keyspace": name, "hint": f"the keyspaces are {existing}"},
            )
    return sorted(set(wanted))


def _resume_or_plan(
    repo: Repo, parent: str | None, names: list[str], started: dt.datetime, ev: BackupEvents
) -> tuple[Plan, Path]:
    """The backup a crash left under ``tmp/`` when it continues the same parent with the same
    keyspaces; else a new one (leftovers that no longer fit are removed)."""
    for d in repo.pending():
        plan = _read(d / PLAN, Plan)
        if plan is not None and plan.parent == parent and plan.keyspaces == names:
            ev.note(f"continuing backup {plan.name} left unfinished (its finished partitions kept)")
            return plan, d
        ev.note(
            f"removing unfinished backup {d.name}: it was of other keyspaces, or a newer "
            "backup was finished since"
        )
        shutil.rmtree(d)
    plan = Plan(
        name=repo.next_name(started.strftime("%Y%m%dT%H%M%SZ")),
        parent=parent,
        keyspaces=names,
        started=started.isoformat(),
    )
    tmp = repo.tmp_dir(plan.name)
    tmp.mkdir(parents=True)
    atomic_write_bytes(tmp / PLAN, msgspec.json.encode(plan))
    return plan, tmp


def _read(path: Path, kind: type[T]) -> T | None:
    """A file the backup under way wrote, or None when it is missing or torn (a crash
    before or while it was written): what it stood for is done again."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def _prepare(client: Client, tmp: Path, ks: str, ev: BackupEvents) -> _KeyspaceRun:
    """The keyspace's definitions, and the partitions a resumed backup already holds."""
    desc = next(k for k in client.list_keyspaces() if k.name == ks)
    indexes = [
        IndexEntry(
            name=d["name"],
            keys=list(d["keys"]),
            where=d["where"],
            partition_by=d["partition_by"],
            num_partition=d["num_partition"],
            is_primary=d["is_primary"],
            num_replica=d["num_replica"],
            defer_build=bool(d["defer_build"]) and d["state"] == READY,
        )
        for d in client.list_indexes(ks, stats=False)
        if d["state"] not in (INIT, DELETED)
    ]
    entry = KeyspaceEntry(
        name=ks,
        num_partitions=desc.num_partitions,
        num_replicas=desc.num_replicas,
        uuid=desc.uuid,
        indexes=indexes,
        partitions={},
    )
    run = _KeyspaceRun(entry, tmp / ks)
    ks_file = run.dir / "keyspace.json"
    old = _read(ks_file, KeyspaceEntry)
    if old is not None:
        if old.uuid == entry.uuid:
            for f in sorted(run.dir.glob("p*.json")):
                e = _read(f, PartitionEntry)
                if e is not None and intact(run.dir.parent, e):
                    run.done[int(f.stem[1:])] = e
        else:
            ev.note(f"keyspace {ks!r} was re-created since the backup began: copying it anew")
            shutil.rmtree(run.dir)
    run.dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(ks_file, msgspec.json.encode(entry))
    return run


def _plan_partitions(
    run: _KeyspaceRun, base: KeyspaceEntry | None, t0: Timestamp, ev: BackupEvents
) -> list[_Todo]:
    """Full or incremental, per partition not yet done."""
    entry = run.entry
    if base is not None and (
        base.uuid != entry.uuid or base.num_partitions != entry.num_partitions
    ):
        ev.note(f"keyspace {entry.name!r} was re-created since the last backup: full copy")
        base = None
    todo: list[_Todo] = []
    for p in range(entry.num_partitions):
        if p in run.done:
            continue
        cur = t0.get(p)
        seqno, uuid = (cur.seqno, cur.uuid) if cur is not None else (0, 0)
        prev = None if base is None else base.partitions.get(p)
        if prev is None:
            todo.append(_Todo(entry.name, p, FULL, 0, 0, seqno, uuid))
        elif prev.uuid != uuid or prev.seqno > seqno:
            note = (
                f"partition {p} of {entry.name!r} is on a new branch since the last backup "
                f"(uuid {prev.uuid} at seqno {prev.seqno}, now {uuid} at {seqno}, a "
                "failover): full copy"
            )
            ev.note(note)
            todo.append(_Todo(entry.name, p, FULL, 0, 0, seqno, uuid, note))
        else:
            todo.append(_Todo(entry.name, p, INCREMENTAL, prev.seqno, prev.uuid, seqno, uuid))
    return todo


def _copy_keyspace(
    client: Client, run: _KeyspaceRun, backups: list[Manifest], ev: BackupEvents
) -> None:
    ks = run.entry.name
    chain = chain_of(backups, ks, None)
    base = chain[-1].keyspaces[ks] if chain else None
    t0 = client.high_seqnos(ks)
    todo = _plan_partitions(run, base, t0, ev)
    fulls = [t for t in todo if t.kind == FULL]
    incs = [t for t in todo if t.kind == INCREMENTAL]
    for i in range(0, len(incs), GROUP):
        fulls.extend(_read_incrementals(client, run, incs[i : i + GROUP], ev))
    _read_fulls(client, run, fulls, ev)


def _read_incrementals(
    client: Client, run: _KeyspaceRun, todo: list[_Todo], ev: BackupEvents
) -> list[_Todo]:
    """Read ``todo``'s changes and write their files; returns the partitions whose log no
    longer reaches back (to copy in full instead)."""
    ks = run.entry.name
    fallback: list[_Todo] = []
    while todo:
        by_part = {t.partition: t for t in todo}
        changes: dict[int, list[Change]] = {p: [] for p in by_part}
        ranges = [
            PartitionRange(t.partition, t.from_seqno, t.from_uuid, t.seqno, t.uuid) for t in todo
        ]
        try:
            for group in chunk_groups(client, ks, ranges, 1):
                for chunk in group:
                    changes[chunk.partition].extend(chunk.changes)
        except ShardexError as exc:
            p = exc.details.get("partition")
            if exc.code is not ErrorCode.ROLLBACK or p not in by_part:
                raise
            t = by_part[p]
            t.note = (
                f"partition {p} of {ks!r} cannot continue from seqno {t.from_seqno} (uuid "
                f"{t.from_uuid}) of the last backup ({exc.message}): full copy"
            )
            ev.note(t.note)
            t.kind, t.from_seqno, t.from_uuid = FULL, 0, 0
            fallback.append(t)
            todo = [x for x in todo if x.partition != p]
            continue
        for t in todo:
            _finish(run, t, latest_versions(changes[t.partition]), ev)
        todo = []
    return fallback


def _read_fulls(client: Client, run: _KeyspaceRun, todo: list[_Todo], ev: BackupEvents) -> None:
    """Read ``todo``'s documents as of their T0 entries (or the later ones the reader
    falls back to) and write their files, each as its read completes."""
    by_part = {t.partition: t for t in todo}
    wanted = {t.partition: (t.seqno, t.uuid) for t in todo}
    for snap in read_snapshots(client, run.entry.name, wanted, ev.note):
        t = by_part[snap.partition]
        t.seqno, t.uuid = snap.seqno, snap.uuid
        _finish(run, t, snap.docs, ev)


def _finish(run: _KeyspaceRun, t: _Todo, rows: Sequence[Change], ev: BackupEvents) -> None:
    """Write the partition's file and, after it, its entry (what a resume trusts)."""
    rel = f"{t.keyspace}/p{t.partition:04d}.parquet"
    nbytes, sha = write_partition(run.dir.parent / rel, rows)
    entry = PartitionEntry(
        kind=t.kind,
        from_seqno=t.from_seqno,
        from_uuid=t.from_uuid,
        seqno=t.seqno,
        uuid=t.uuid,
        rows=len(rows),
        tombstones=sum(1 for c in rows if c.op == OP_DELETE),
        file=rel,
        bytes=nbytes,
        sha256=sha,
        note=t.note,
    )
    write_replace(run.dir / f"p{t.partition:04d}.json", msgspec.json.encode(entry))
    run.done[t.partition] = entry
    ev.partition(t.keyspace, t.partition, len(rows))
