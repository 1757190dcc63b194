"""Backup and restore on real clusters: a full and two incremental backups of a keyspace
taken while a writer upserts and deletes, one of them cut by a crash and continued, then a
restore (also cut and continued) into a fresh 2-node cluster with another partition count.
Every restored document equals its value at the last backup's vector, read independently
from the source's change log, deletions included; the index definitions are recreated."""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import run_cli, wait_for
from data_helpers import read_partition, running_cluster

from shardex.backup.repo import FULL, INCREMENTAL, Repo
from shardex.backup.restore import RestoreEvents, restore_backup
from shardex.backup.snapshot import backfill
from shardex.backup.take import BackupEvents, create_backup
from shardex.client import Client, SnapshotMarker, connect_local
from shardex.errors import ShardexError

pytestmark = pytest.mark.cluster

KS = "users"
TARGET_PARTS = 5
INDEXES = [
    {"name": "by_city", "keys": ["city"], "where": 'type = "user"'},
    {"name": "by_age", "keys": ["age DESC"], "partition_by": ["META().id"], "num_partition": 4},
]


class Crash(Exception):
    """Stands for a process dying in the middle of a backup or restore."""


class Writer:
    """Upserts and deletes over ``pool`` docids in a thread until stopped."""

    def __init__(self, client: Client, pool: int) -> None:
        self.ks = client.keyspace(KS)
        self.pool = pool
        self.rng = random.Random(7)
        self.stop = threading.Event()
        self.done = 0
        self.thread = threading.Thread(target=self._run, name="backup-writer", daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            docid = f"d{self.rng.randrange(self.pool)}"
            try:
                if self.rng.random() < 0.2:
                    self.ks.delete(docid)
                else:
                    self.ks.upsert(docid, doc(self.rng, n))
            except ShardexError:
                pass  # deleting an absent document
            self.done += 1

    def advance(self, n: int) -> None:
        """Wait until ``n`` more mutations were made."""
        start = self.done
        wait_for(lambda: self.done >= start + n, 120, what=f"{n} more writes")

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def doc(rng: random.Random, n: int) -> dict[str, Any]:
    return {
        "type": rng.choice(["user", "admin"]),
        "city": rng.choice(["paris", "rome", "oslo", "lima"]),
        "age": rng.randrange(90),
        "n": n,
        "tags": [rng.randrange(5) for _ in range(rng.randrange(3))],
    }


def documents_at(client: Client, vector: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """The source's documents at ``vector``, from each partition's change log read with the
    client's own stream (not the backup's reader)."""
    out: dict[str, Any] = {}
    ks = client.keyspace(KS)
    for p, (seqno, uuid) in vector.items():
        latest: dict[str, bytes | None] = {}
        with ks.stream(p, 0, None, seqno) as stream:
            for item in stream:
                if isinstance(item, SnapshotMarker):
                    assert item.uuid == uuid
                    continue
                latest[item.docid] = item.body
        out.update({d: json.loads(b) for d, b in latest.items() if b is not None})
    return out


def cluster_documents(client: Client, keyspace: str, num_partitions: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ks = client.keyspace(keyspace)
    for p in range(num_partitions):
        latest: dict[str, bytes | None] = {}
        for c in read_partition(ks, p)[1]:
            latest[c.docid] = c.body
        out.update({d: json.loads(b) for d, b in latest.items() if b is not None})
    return out


def definitions(client: Client, keyspace: str) -> set[tuple[Any, ...]]:
    return {
        (
            d["name"],
            tuple(d["keys"]),
            d["where"],
            None if d["partition_by"] is None else tuple(d["partition_by"]),
            d["num_partition"],
            d["is_primary"],
        )
        for d in client.list_indexes(keyspace, stats=False)
    }


def crash_after(n: int) -> Iterator[None]:
    """A progress hook that raises on its ``n``-th call."""
    for _ in range(n - 1):
        yield
    raise Crash


def crash_at(fraction: float) -> RestoreEvents:
    """Restore events that raise once ``fraction`` of the rows were written."""
    seen = limit = 0.0

    def start(_ks: str, total: int) -> None:
        nonlocal limit
        limit = total * fraction

    def advance(n: int) -> None:
        nonlocal seen
        seen += n
        if seen > limit:
            raise Crash

    return RestoreEvents(start=start, advance=advance)


def backup_and_restore(tmp_path: Path, docs: int, source_parts: int) -> None:
    """``source_parts`` keeps each partition's log under the data nodes' retention (100,000
    seqnos), so the oracle can read the source's history up to the last vector."""
    repo = tmp_path / "repo"
    with (
        running_cluster(tmp_path / "source", nodes=2) as source,
        connect_local(source.path) as client,
    ):
        client.create_keyspace(KS, source_parts)
        client.keyspace(KS).upsert_many((f"d{i}", doc(random.Random(i), 0)) for i in range(docs))
        for ix in INDEXES:
            spec = dict(ix)
            client.create_index(KS, spec.pop("name"), **spec)
        client.create_index(KS, None, primary=True)
        with Writer(client, pool=docs + docs // 4) as writer:
            writer.advance(200)
            run_cli("backup", "create", "--dir", str(source.path), "--repo", str(repo))
            writer.advance(300)
            run_cli("backup", "create", "--dir", str(source.path), "--repo", str(repo))
            writer.advance(300)
            # The third backup dies after three partitions; the next create continues it.
            hook = crash_after(4)
            with pytest.raises(Crash):
                create_backup(client, repo, events=BackupEvents(partition=lambda *_: next(hook)))
            (pending,) = Repo.open(repo).pending()
            writer.advance(100)
            proc = run_cli("backup", "create", "--dir", str(source.path), "--repo", str(repo))
            assert f"continuing backup {pending.name}" in proc.stderr
        backups = Repo.open(repo).backups()
        assert [m.name for m in backups][-1] == pending.name
        assert [m.parent for m in backups] == [None, backups[0].name, backups[1].name]
        kinds = [{e.kind for e in m.keyspaces[KS].partitions.values()} for m in backups]
        assert kinds == [{FULL}, {INCREMENTAL}, {INCREMENTAL}]
        for m in backups[1:]:
            assert 0 < m.keyspaces[KS].documents < docs  # only the changes
            assert m.keyspaces[KS].tombstones > 0  # deletions stored as tombstones
        vectors = [m.keyspaces[KS].vector for m in backups]
        for before, after in itertools.pairwise(vectors):
            assert all(after[p][0] >= before[p][0] for p in before)
            assert sum(s for s, _ in after.values()) > sum(s for s, _ in before.values())
        expected = documents_at(client, backups[-1].keyspaces[KS].vector)
        # The backfill read a purged partition falls back to: its current documents.
        snap = backfill(client, KS, 3)
        high = client.high_seqnos(KS)[3]
        assert (snap.seqno, snap.uuid) == (high.seqno, high.uuid)
        now = documents_at(client, {3: (high.seqno, high.uuid)})
        assert {c.docid: json.loads(c.body or b"") for c in snap.docs} == now
        source_defs = definitions(client, KS)
        listing = run_cli("backup", "list", "--repo", str(repo), "--json").stdout
        assert [m["name"] for m in json.loads(listing)] == [m.name for m in backups]

    with (
        running_cluster(tmp_path / "target", nodes=2) as target,
        connect_local(target.path) as client,
    ):
        # The first restore dies 40% of the way; the CLI's continues it.
        with pytest.raises(Crash):
            restore_backup(
                client,
                repo,
                num_partitions=TARGET_PARTS,
                batch=200,
                group=2,
                events=crash_at(0.4),
            )
        assert list((repo / "restores").glob("*.json"))  # what the crashed one finished
        proc = run_cli(
            "backup", "restore", "--dir", str(target.path), "--repo", str(repo), "--verify"
        )
        assert "continuing a restore" in proc.stderr
        assert f"{len(expected):,} documents equal the backup's" in proc.stdout
        desc = next(k for k in client.list_keyspaces() if k.name == KS)
        assert desc.num_partitions == TARGET_PARTS  # created by the first, cut, restore
        got = cluster_documents(client, KS, TARGET_PARTS)
        assert len(got) == len(expected)
        assert got == expected
        assert definitions(client, KS) == source_defs
        assert not list((repo / "restores").glob("*.json"))  # finished: no resume record


def test_backup_under_writes_and_restore_into_another_shape(tmp_path: Path) -> None:
    backup_and_restore(tmp_path, docs=3000, source_parts=8)


@pytest.mark.slow
def test_backup_and_restore_of_a_million_documents(tmp_path: Path) -> None:
    backup_and_restore(tmp_path, docs=1_000_000, source_parts=32)


def test_a_restore_keeps_each_documents_expiry_and_leaves_out_what_expired(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    with (
        running_cluster(tmp_path / "c", nodes=2) as cluster,
        connect_local(cluster.path) as client,
    ):
        client.create_keyspace("ttl", 4)
        ks = client.keyspace("ttl")
        ks.upsert("forever", {"n": 1})
        ks.upsert("hour", {"n": 2}, expiry=3600)
        ks.upsert("soon", {"n": 3}, expiry=8)
        hour, soon = ks.expiry_of("hour"), ks.expiry_of("soon")
        assert hour > soon > 0
        # The progress the CLI's bars show: every partition, then every row, accounted for.
        totals: list[int] = []
        done: list[int] = []
        backup_events = BackupEvents(
            start=totals.append, partition=lambda _ks, _p, rows: done.append(1)
        )
        create_backup(client, repo, keyspaces=["ttl"], events=backup_events)
        assert totals == [4] and len(done) == 4
        wait_for(lambda: time.time() > soon + 1, 30, what="the short expiry to pass")
        rows: list[int] = []
        advanced: list[int] = []
        events = RestoreEvents(start=lambda _ks, n: rows.append(n), advance=advanced.append)
        (result,) = restore_backup(client, repo, keyspace="ttl", to_keyspace="ttl2", events=events)
        assert (result.documents, result.expired) == (2, 1)
        assert rows == [3] and sum(advanced) == 3  # the expired one counted too
        back = client.keyspace("ttl2")
        assert back.expiry_of("hour") == hour  # the absolute time, not a new hour
        assert back.expiry_of("forever") == 0
        with pytest.raises(ShardexError):
            back.get("soon")
        proc = run_cli(
            "backup", "restore", "--dir", str(cluster.path), "--repo", str(repo),
            "--keyspace", "ttl", "--to-keyspace", "ttl3", "--verify",
        )  # fmt: skip
        assert "2 documents equal the backup's" in proc.stdout
