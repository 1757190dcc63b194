"""How a backup reads each partition when the log does not cooperate: an incremental the
node refuses (ROLLBACK) becomes a full copy, a full copy whose log is purged is read by a
backfill stream at its own seqno, and a partition that changes branch mid-read is read again
at a new T0 entry. The change readers are replaced by a model of the partitions' logs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import shardex.backup.snapshot as snapshot
import shardex.backup.take as take
from shardex.api.records import Change, SnapshotMarker
from shardex.backup.merge import latest_versions
from shardex.backup.repo import (
    FULL,
    INCREMENTAL,
    KeyspaceEntry,
    Manifest,
    PartitionEntry,
    Repo,
    read_partition,
)
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.source.checks import Chunk
from shardex.pipeline.source.types import PartitionRange

NOW = "2026-01-01T00:00:00+00:00"


def up(p: int, docid: str, seqno: int) -> Change:
    return Change(partition=p, seqno=seqno, docid=docid, op="upsert", cas=seqno, body=b"{}")


def rm(p: int, docid: str, seqno: int) -> Change:
    return Change(partition=p, seqno=seqno, docid=docid, op="delete", cas=seqno, body=None)


class Cluster:
    """Three partitions' logs, their (high seqno, uuid), and errors to raise once."""

    def __init__(self) -> None:
        self.log = {
            0: [up(0, "a", 1), up(0, "b", 2), rm(0, "a", 3), up(0, "c", 4)],
            1: [up(1, "x", 1), up(1, "y", 2), up(1, "x", 3)],
            2: [up(2, "q", 1), rm(2, "q", 2), up(2, "r", 3)],
        }
        self.uuid = {0: 1, 1: 1, 2: 1}
        self.fail: dict[tuple[int, bool], ShardexError] = {}
        self.after_t0: list[Change] = []  # written just after the backup takes T0
        self.read: list[int] = []  # partitions read, in order

    def high_seqnos(self, _ks: str) -> Timestamp:
        t0 = Timestamp({p: (log[-1].seqno, self.uuid[p]) for p, log in self.log.items()})
        for c in self.after_t0:
            self.log[c.partition].append(c)
        self.after_t0 = []
        return t0

    def chunk_groups(
        self, _client: Any, _ks: str, ranges: list[PartitionRange], _rows: int, *, snapshot=False
    ) -> Iterator[list[Chunk]]:
        for r in ranges:
            err = self.fail.pop((r.partition, snapshot), None)
            if err is not None:
                raise err
        for r in ranges:
            self.read.append(r.partition)
            if r.end_seqno <= r.start_seqno:
                continue
            rows = [c for c in self.log[r.partition] if r.start_seqno < c.seqno <= r.end_seqno]
            if snapshot:
                rows = [c for c in latest_versions(rows) if c.op != "delete"]
            yield [Chunk(r.partition, r.end_uuid, rows)]

    def list_keyspaces(self) -> list[Any]:
        return [SimpleNamespace(name="ks", num_partitions=3, num_replicas=0, uuid="k")]

    def list_indexes(self, _ks: str, *, stats: bool) -> list[dict[str, Any]]:
        return []

    def keyspace(self, _name: str) -> Any:
        cluster = self

        class Ks:
            @contextlib.contextmanager
            def stream(self, p: int, from_seqno: int) -> Iterator[list[Any]]:
                assert from_seqno == 0
                log = cluster.log[p]
                high = log[-1].seqno
                yield [SnapshotMarker(p, 1, high, cluster.uuid[p], backfill=True)] + [
                    c for c in latest_versions(log)
                ]

        return Ks()


def base_manifest(cluster: Cluster, upto: int) -> Manifest:
    """A previous backup that ended at seqno ``upto`` of every partition, on uuid 1."""
    parts = {
        p: PartitionEntry(
            kind=FULL,
            from_seqno=0,
            from_uuid=0,
            seqno=upto,
            uuid=1,
            rows=0,
            tombstones=0,
            file="x",
            bytes=0,
            sha256="",
        )
        for p in cluster.log
    }
    ks = KeyspaceEntry(
        name="ks", num_partitions=3, num_replicas=0, uuid="k", indexes=[], partitions=parts
    )
    return Manifest(
        format="shardex-backup",
        version=1,
        name="0001-x",
        parent=None,
        started=NOW,
        finished=NOW,
        keyspaces={"ks": ks},
    )


def run_backup(
    tmp_path: Path, cluster: Cluster, base: Manifest | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[int, PartitionEntry], list[str]]:
    for module in (take, snapshot):  # incrementals, full copies
        monkeypatch.setattr(module, "chunk_groups", cluster.chunk_groups)
    entry = KeyspaceEntry(
        name="ks", num_partitions=3, num_replicas=0, uuid="k", indexes=[], partitions={}
    )
    run = take._KeyspaceRun(entry, tmp_path / "ks")
    run.dir.mkdir()
    notes: list[str] = []
    backups = [] if base is None else [base]
    take._copy_keyspace(cluster, run, backups, take.BackupEvents(note=notes.append))  # type: ignore[arg-type]
    return run.done, notes


def docids(tmp_path: Path, e: PartitionEntry) -> list[tuple[str, bool]]:
    t = read_partition(tmp_path, e)
    return list(zip(t.column("docid").to_pylist(), t.column("deleted").to_pylist(), strict=True))


def test_a_refused_incremental_becomes_a_full_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Cluster()
    c.fail[(1, False)] = ShardexError(
        "cannot stream from seqno 1: roll back to 0",
        code=ErrorCode.ROLLBACK,
        details={"partition": 1, "rollback_seqno": 0},
    )
    done, notes = run_backup(tmp_path, c, base_manifest(c, 1), monkeypatch)
    assert [done[p].kind for p in range(3)] == [INCREMENTAL, FULL, INCREMENTAL]
    assert done[1].note is not None and "roll back to 0" in done[1].note
    assert notes == [done[1].note]
    # The incremental keeps the deletion of "a" as a tombstone; the full copy only live docs.
    assert docids(tmp_path, done[0]) == [("b", False), ("a", True), ("c", False)]
    assert docids(tmp_path, done[1]) == [("y", False), ("x", False)]
    assert (done[1].from_seqno, done[1].seqno) == (0, 3)
    assert docids(tmp_path, done[2]) == [("q", True), ("r", False)]


def test_a_purged_log_is_read_by_a_backfill_at_its_own_seqno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Cluster()
    c.fail[(2, True)] = ShardexError(
        "history purged", code=ErrorCode.SNAPSHOT_TOO_OLD, details={"partition": 2}
    )
    c.after_t0 = [up(2, "late", 4), up(0, "late", 5)]
    done, notes = run_backup(tmp_path, c, None, monkeypatch)
    assert {e.kind for e in done.values()} == {FULL}
    # The backfill holds the partition as of its own snapshot (seqno 4), the others as of T0.
    assert docids(tmp_path, done[2]) == [("r", False), ("late", False)]
    assert (done[2].seqno, done[2].uuid) == (4, 1)
    assert docids(tmp_path, done[0]) == [("b", False), ("c", False)]
    assert done[0].seqno == 4
    assert any("purged" in n for n in notes)


def test_a_branch_change_mid_read_takes_the_partitions_entry_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Cluster()
    c.fail[(0, True)] = ShardexError(
        "partition 0 moved to branch 9", code=ErrorCode.ROLLBACK, details={"partition": 0}
    )
    original = c.chunk_groups

    def failover_then_read(*args: Any, **kw: Any) -> Iterator[list[Chunk]]:
        c.uuid[0] = 9  # the failover the error reports
        return original(*args, **kw)

    c.chunk_groups = failover_then_read  # type: ignore[method-assign]
    done, notes = run_backup(tmp_path, c, None, monkeypatch)
    assert (done[0].seqno, done[0].uuid) == (4, 9)
    assert any("changed branch" in n for n in notes)
    assert docids(tmp_path, done[0]) == [("b", False), ("c", False)]


class Crash(Exception):
    pass


def test_a_backup_cut_by_a_crash_continues_keeping_its_intact_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Cluster()
    for module in (take, snapshot):
        monkeypatch.setattr(module, "chunk_groups", c.chunk_groups)
    finished: list[int] = []

    def crash_at_second(_ks: str, p: int, _rows: int) -> None:
        finished.append(p)
        if len(finished) == 2:
            raise Crash

    repo_path = tmp_path / "repo"
    with pytest.raises(Crash):
        take.create_backup(c, repo_path, events=take.BackupEvents(partition=crash_at_second))  # type: ignore[arg-type]
    (pending,) = Repo.open(repo_path).pending()
    assert finished == [0, 1]
    torn = pending / "ks" / "p0000.parquet"  # a power loss kept its entry but not all of it
    torn.write_bytes(torn.read_bytes()[:20])
    c.read.clear()
    notes: list[str] = []
    m = take.create_backup(c, repo_path, events=take.BackupEvents(note=notes.append))  # type: ignore[arg-type]
    assert m.name == pending.name
    assert any("continuing backup" in n for n in notes)
    assert sorted(c.read) == [0, 2]  # partition 1 was kept
    repo = Repo.open(repo_path)
    assert [b.name for b in repo.backups()] == [m.name] and not repo.pending()
    for e in m.keyspaces["ks"].partitions.values():
        read_partition(repo.backup_dir(m.name), e)  # every file whole and as recorded
