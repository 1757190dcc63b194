"""The backup repository's format: opening (new, foreign, newer, corrupt), partition files
checked against their manifest entries, backups ordered by sequence number, the lock."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest

from shardex.api.records import Change
from shardex.backup.repo import (
    FULL,
    MARKER,
    SCHEMA,
    KeyspaceEntry,
    Manifest,
    PartitionEntry,
    Repo,
    read_partition,
    write_partition,
)
from shardex.errors import ErrorCode, ShardexError

NOW = "2026-01-01T00:00:00+00:00"


def change(docid: str, seqno: int, body: bytes | None = b'{"a":1}') -> Change:
    op = "delete" if body is None else "upsert"
    return Change(partition=0, seqno=seqno, docid=docid, op=op, cas=seqno * 10, body=body)


def entry_for(path: Path, rel: str, rows: list[Change], **kw: object) -> PartitionEntry:
    nbytes, sha = write_partition(path / rel, rows)
    fields: dict = {
        "kind": FULL,
        "from_seqno": 0,
        "from_uuid": 0,
        "seqno": max((c.seqno for c in rows), default=0),
        "uuid": 7,
        "rows": len(rows),
        "tombstones": sum(1 for c in rows if c.body is None),
        "file": rel,
        "bytes": nbytes,
        "sha256": sha,
    }
    fields.update(kw)
    return PartitionEntry(**fields)


def publish(repo: Repo, stamp: str, parts: dict[int, list[Change]]) -> Manifest:
    name = repo.next_name(stamp)
    tmp = repo.tmp_dir(name)
    tmp.mkdir(parents=True)
    entries = {p: entry_for(tmp, f"ks/p{p:04d}.parquet", rows) for p, rows in parts.items()}
    ks = KeyspaceEntry(
        name="ks",
        num_partitions=len(parts),
        num_replicas=0,
        uuid="u",
        indexes=[],
        partitions=entries,
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
    repo.publish(tmp, m)
    return m


def expect_error(fn: object, *words: str) -> ShardexError:
    with pytest.raises(ShardexError) as info:
        fn()  # type: ignore[operator]
    for w in words:
        assert w in info.value.message
    assert info.value.details.get("hint")
    return info.value


def test_a_new_repository_is_made_in_an_empty_directory_and_reopened(tmp_path: Path) -> None:
    repo = Repo.open_or_init(tmp_path / "r", NOW)
    assert (tmp_path / "r" / MARKER).is_file()
    assert Repo.open(tmp_path / "r").backups() == []
    assert Repo.open_or_init(tmp_path / "r", NOW).path == repo.path


def test_foreign_missing_and_newer_repositories_are_refused_by_path(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.txt").write_text("not ours")
    e = expect_error(lambda: Repo.open_or_init(foreign, NOW), str(foreign), "not empty")
    assert e.details["path"] == str(foreign)
    assert not (foreign / MARKER).exists()  # nothing written into someone else's directory
    expect_error(lambda: Repo.open(foreign), "not a shardex backup repository")
    expect_error(lambda: Repo.open(tmp_path / "nope"), "no such directory")
    other = tmp_path / "other"
    other.mkdir()
    (other / MARKER).write_text('{"format": "tarball", "version": 1, "created": "x"}')
    expect_error(lambda: Repo.open(other), "tarball")
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / MARKER).write_text('{"format": "shardex-backup", "version": 99, "created": "x"}')
    expect_error(lambda: Repo.open(newer), "version 99")
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / MARKER).write_text("{not json")
    e = expect_error(lambda: Repo.open(garbled), "corrupt")
    assert e.code is ErrorCode.STORAGE_ERROR


def test_a_partition_file_is_open_parquet_and_reads_back(tmp_path: Path) -> None:
    rows = [change("a", 1), change("b", 2, None), change("c", 3, b'{"x":[1,2]}')]
    e = entry_for(tmp_path, "ks/p0000.parquet", rows)
    plain = pq.read_table(tmp_path / "ks/p0000.parquet")  # any Parquet reader
    assert plain.schema.equals(SCHEMA)
    assert plain.column("docid").to_pylist() == ["a", "b", "c"]
    assert plain.column("deleted").to_pylist() == [False, True, False]
    assert plain.column("body").to_pylist() == [b'{"a":1}', None, b'{"x":[1,2]}']
    assert read_partition(tmp_path, e).column("seqno").to_pylist() == [1, 2, 3]
    assert e.tombstones == 1


def test_a_truncated_altered_or_miscounted_file_is_refused(tmp_path: Path) -> None:
    rows = [change(f"d{i}", i) for i in range(1, 50)]
    e = entry_for(tmp_path, "ks/p0000.parquet", rows)
    path = tmp_path / "ks/p0000.parquet"
    good = path.read_bytes()
    path.write_bytes(good[:-10])
    expect_error(lambda: read_partition(tmp_path, e), str(path), "bytes where the manifest")
    path.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    expect_error(lambda: read_partition(tmp_path, e), "SHA-256")
    path.write_bytes(good)
    wrong = msgspec.structs.replace(e, rows=48)
    expect_error(lambda: read_partition(tmp_path, wrong), "49 rows")
    path.unlink()
    expect_error(lambda: read_partition(tmp_path, e), "cannot be read")


def test_backups_are_ordered_by_sequence_and_found_by_name(tmp_path: Path) -> None:
    repo = Repo.open_or_init(tmp_path / "r", NOW)
    # The second backup's clock is earlier: the sequence number still orders them.
    a = publish(repo, "20260102T000000Z", {0: [change("a", 1)]})
    b = publish(repo, "20260101T000000Z", {0: [change("a", 2)]})
    assert [m.name for m in repo.backups()] == [a.name, b.name]
    assert a.name.startswith("0001-") and b.name.startswith("0002-")
    assert repo.find(None).name == b.name
    assert repo.find(a.name).name == a.name
    expect_error(lambda: repo.find("0009-x"), "has no backup '0009-x'")
    assert not repo.pending()  # the temp directory was renamed into backups/


def test_a_garbled_manifest_is_refused_by_path(tmp_path: Path) -> None:
    repo = Repo.open_or_init(tmp_path / "r", NOW)
    m = publish(repo, "20260101T000000Z", {0: [change("a", 1)]})
    path = repo.backup_dir(m.name) / "manifest.json"
    path.write_text('{"format": "shardex-backup"}')
    e = expect_error(repo.backups, str(path), "corrupt")
    assert e.details["path"] == str(path)


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    repo = Repo.open_or_init(tmp_path / "r", NOW)
    with repo.locked():
        expect_error(lambda: Repo.open(repo.path).locked().__enter__(), "another backup")
    with repo.locked():  # released with the first
        pass
