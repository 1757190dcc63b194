"""The merge rules of a backup chain and how a backup chooses full or incremental per
partition."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardex.api.records import Change
from shardex.backup.merge import chain_of, latest_versions, merge_partition, partition_chain
from shardex.backup.repo import (
    FULL,
    INCREMENTAL,
    KeyspaceEntry,
    Manifest,
    PartitionEntry,
    Repo,
    write_partition,
)
from shardex.backup.take import BackupEvents, _KeyspaceRun, _plan_partitions
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError

NOW = "2026-01-01T00:00:00+00:00"


def up(docid: str, seqno: int, v: int) -> Change:
    body = f'{{"v":{v}}}'.encode()
    return Change(partition=0, seqno=seqno, docid=docid, op="upsert", cas=seqno, body=body)


def rm(docid: str, seqno: int) -> Change:
    return Change(partition=0, seqno=seqno, docid=docid, op="delete", cas=seqno, body=None)


class Chain:
    """Backups of one partition of keyspace ``ks``, published into a real repository."""

    def __init__(self, path: Path) -> None:
        self.repo = Repo.open_or_init(path, NOW)
        self.last: tuple[int, int] = (0, 0)

    def add(
        self, kind: str, rows: list[Change], uuid: int = 1, *, start: tuple[int, int] | None = None
    ) -> Manifest:
        name = self.repo.next_name("20260101T000000Z")
        tmp = self.repo.tmp_dir(name)
        tmp.mkdir(parents=True)
        nbytes, sha = write_partition(tmp / "ks/p0000.parquet", rows)
        seqno = max((c.seqno for c in rows), default=self.last[0])
        frm = (0, 0) if kind == FULL else (start or self.last)
        entry = PartitionEntry(
            kind=kind,
            from_seqno=frm[0],
            from_uuid=frm[1],
            seqno=seqno,
            uuid=uuid,
            rows=len(rows),
            tombstones=sum(1 for c in rows if c.body is None),
            file="ks/p0000.parquet",
            bytes=nbytes,
            sha256=sha,
        )
        self.last = (seqno, uuid)
        ks = KeyspaceEntry(
            name="ks",
            num_partitions=1,
            num_replicas=0,
            uuid="k",
            indexes=[],
            partitions={0: entry},
        )
        m = Manifest(
            format="shardex-backup",
            version=1,
            name=name,
            parent=None,
            started=NOW,
            finished=NOW,
            keyspaces={"ks": ks},
        )
        self.repo.publish(tmp, m)
        return m

    def state(self, upto: str | None = None) -> tuple[dict[str, bytes], set[str]]:
        chain = chain_of(self.repo.backups(), "ks", upto)
        s = merge_partition(self.repo, partition_chain(self.repo, chain, "ks", 0))
        return s.live, s.deleted


def test_latest_versions_keeps_each_docids_newest_tombstones_included() -> None:
    changes = [up("a", 3, 1), up("b", 1, 1), rm("a", 5), up("b", 4, 2), up("c", 2, 1)]
    got = latest_versions(changes)
    assert [(c.docid, c.seqno, c.op) for c in got] == [
        ("c", 2, "upsert"),
        ("b", 4, "upsert"),
        ("a", 5, "delete"),
    ]


def test_full_then_incrementals_give_each_documents_newest_version(tmp_path: Path) -> None:
    c = Chain(tmp_path)
    first = c.add(FULL, [up("a", 1, 1), up("b", 2, 1), up("c", 3, 1)])
    c.add(INCREMENTAL, [up("a", 4, 2), rm("b", 5), up("d", 6, 1)])
    c.add(INCREMENTAL, [up("b", 7, 3), rm("d", 8), rm("e", 9)])
    live, deleted = c.state()
    assert live == {"a": b'{"v":2}', "b": b'{"v":3}', "c": b'{"v":1}'}
    assert deleted == {"d", "e"}  # b came back; e was made and deleted between backups
    assert c.state(first.name) == ({"a": b'{"v":1}', "b": b'{"v":1}', "c": b'{"v":1}'}, set())


def test_a_full_copy_resets_the_partition(tmp_path: Path) -> None:
    c = Chain(tmp_path)
    c.add(FULL, [up("a", 1, 1), up("gone", 2, 1)])
    c.add(INCREMENTAL, [up("a", 3, 2)])
    # After a failover the partition was copied in full; "gone" was deleted and purged
    # before it, so it has no tombstone: the full copy alone says it no longer exists.
    c.add(FULL, [up("a", 5, 3), up("new", 6, 1)], uuid=2)
    c.add(INCREMENTAL, [up("new", 7, 2)], uuid=2)
    live, deleted = c.state()
    assert live == {"a": b'{"v":3}', "new": b'{"v":2}'}
    assert deleted == set()


def test_a_broken_chain_is_a_corrupt_repository(tmp_path: Path) -> None:
    c = Chain(tmp_path)
    c.add(FULL, [up("a", 1, 1)])
    c.add(INCREMENTAL, [up("a", 9, 2)], start=(4, 1))  # should continue from (1, 1)
    with pytest.raises(ShardexError) as info:
        c.state()
    assert info.value.code is ErrorCode.STORAGE_ERROR
    assert "continues from seqno 4" in info.value.message
    assert "manifest.json" in info.value.message


def test_a_chain_without_its_full_copy_is_refused(tmp_path: Path) -> None:
    c = Chain(tmp_path)
    c.add(INCREMENTAL, [up("a", 2, 1)], start=(1, 1))
    with pytest.raises(ShardexError) as info:
        c.state()
    assert "no full copy" in info.value.message
    assert info.value.details["hint"]


def _run(num_partitions: int, uuid: str = "k") -> _KeyspaceRun:
    entry = KeyspaceEntry(
        name="ks",
        num_partitions=num_partitions,
        num_replicas=0,
        uuid=uuid,
        indexes=[],
        partitions={},
    )
    return _KeyspaceRun(entry, Path("/nonexistent"))


def _prev(seqno: int, uuid: int) -> PartitionEntry:
    return PartitionEntry(
        kind=FULL,
        from_seqno=0,
        from_uuid=0,
        seqno=seqno,
        uuid=uuid,
        rows=0,
        tombstones=0,
        file="x",
        bytes=0,
        sha256="",
    )


def test_a_backup_continues_each_partition_on_the_same_branch_else_copies_it() -> None:
    base = KeyspaceEntry(
        name="ks",
        num_partitions=3,
        num_replicas=0,
        uuid="k",
        indexes=[],
        partitions={0: _prev(10, 1), 1: _prev(10, 1), 2: _prev(10, 1)},
    )
    t0 = Timestamp({0: (15, 1), 1: (12, 9), 2: (10, 1)})
    notes: list[str] = []
    todo = _plan_partitions(_run(3), base, t0, BackupEvents(note=notes.append))
    got = [(t.partition, t.kind, t.from_seqno, t.from_uuid, t.seqno, t.uuid) for t in todo]
    assert got == [
        (0, INCREMENTAL, 10, 1, 15, 1),
        (1, FULL, 0, 0, 12, 9),  # a failover moved it to a new branch
        (2, INCREMENTAL, 10, 1, 10, 1),  # nothing new: an empty incremental
    ]
    assert todo[1].note is not None and "new branch" in todo[1].note
    assert notes == [todo[1].note]


def test_a_recreated_keyspace_or_a_first_backup_is_copied_in_full() -> None:
    t0 = Timestamp({0: (5, 1), 1: (6, 1)})
    base = KeyspaceEntry(
        name="ks",
        num_partitions=2,
        num_replicas=0,
        uuid="old",
        indexes=[],
        partitions={0: _prev(3, 1), 1: _prev(3, 1)},
    )
    for b in (None, base):
        todo = _plan_partitions(_run(2, uuid="new"), b, t0, BackupEvents())
        assert [(t.kind, t.seqno) for t in todo] == [(FULL, 5), (FULL, 6)]
    run = _run(2, uuid="old")
    run.done[0] = _prev(5, 1)  # finished before a crash: not read again
    assert [t.partition for t in _plan_partitions(run, base, t0, BackupEvents())] == [1]
