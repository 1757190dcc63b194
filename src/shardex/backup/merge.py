"""The merge rules of a backup chain, pure (no I/O but the partition files read through
``repo``).

* A backup's partition file holds each document's newest version in its seqno range, a
  deletion as a tombstone row (``latest_versions``).
* A document's value at a backup is its row in the newest backup of the chain that has one:
  a partition's chain is its newest full copy and every incremental after it, each starting
  where the one before ended (same seqno and uuid; anything else is a corrupt repository,
  ``partition_chain``).
* A full copy holds the live documents only, so it resets the partition: what an older
  backup held and the full copy lacks was deleted before it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shardex.api.records import Change
from shardex.backup.repo import (
    FULL,
    INCREMENTAL,
    Manifest,
    PartitionEntry,
    Repo,
    corrupt,
    read_partition,
    repo_error,
)


def latest_versions(changes: Iterable[Change]) -> list[Change]:
    """The newest version of each docid among ``changes`` (any order), by seqno; in seqno
    order. Deletions stay (as tombstones)."""
    latest: dict[str, Change] = {}
    for c in changes:
        old = latest.get(c.docid)
        if old is None or c.seqno > old.seqno:
            latest[c.docid] = c
    return sorted(latest.values(), key=lambda c: c.seqno)


def chain_of(backups: Sequence[Manifest], keyspace: str, upto: str | None) -> list[Manifest]:
    """The backups up to ``upto`` (None: all) that hold ``keyspace``, oldest first."""
    out: list[Manifest] = []
    for m in backups:
        if keyspace in m.keyspaces:
            out.append(m)
        if m.name == upto:
            break
    return out


@dataclass(frozen=True, slots=True)
class Link:
    backup: str
    entry: PartitionEntry


def partition_chain(
    repo: Repo, chain: Sequence[Manifest], keyspace: str, partition: int
) -> list[Link]:
    """The backups whose files make up ``partition`` at the chain's last backup: its newest
    full copy, then every incremental after it, oldest first."""
    links: list[Link] = []
    for m in reversed(chain):
        entry = m.keyspaces[keyspace].partitions.get(partition)
        if entry is None:
            raise corrupt(
                repo.backup_dir(m.name) / "manifest.json",
                f"keyspace {keyspace!r} lacks partition {partition}",
            )
        links.append(Link(m.name, entry))
        if entry.kind == FULL:
            break
        if entry.kind != INCREMENTAL:
            raise corrupt(
                repo.backup_dir(m.name) / "manifest.json",
                f"partition {partition} of {keyspace!r} has kind {entry.kind!r}",
            )
    else:
        raise repo_error(
            repo.path,
            f"partition {partition} of {keyspace!r} has no full copy in the chain "
            f"ending at {chain[-1].name if chain else None!r}",
            "an older backup it depends on was removed; take a new full backup",
        )
    links.reverse()
    for before, after in itertools.pairwise(links):
        b, a = before.entry, after.entry
        if (a.from_seqno, a.from_uuid) != (b.seqno, b.uuid):
            raise corrupt(
                repo.backup_dir(after.backup) / "manifest.json",
                f"partition {partition} of {keyspace!r} continues from seqno {a.from_seqno} "
                f"(uuid {a.from_uuid}), but {before.backup} ended at {b.seqno} (uuid {b.uuid})",
            )
    return links


@dataclass(slots=True)
class PartitionState:
    """A partition's documents at the end of its chain: docid -> JSON body, the docids
    deleted since its full copy, and the live documents' expiries (absolute epoch seconds;
    only those that have one)."""

    live: dict[str, bytes]
    deleted: set[str]
    seqno: int
    uuid: int
    expiries: dict[str, int] = field(default_factory=dict)


def merge_partition(repo: Repo, links: Sequence[Link]) -> PartitionState:
    """Apply the chain's files in order: each row replaces the docid's earlier one."""
    live: dict[str, bytes] = {}
    deleted: set[str] = set()
    expiries: dict[str, int] = {}
    for link in links:
        table = read_partition(repo.backup_dir(link.backup), link.entry)
        docids = table.column("docid").to_pylist()
        dels = table.column("deleted").to_pylist()
        bodies = table.column("body").to_pylist()
        expiry = table.column("expiry").to_pylist()
        for docid, dead, body, exp in zip(docids, dels, bodies, expiry, strict=True):
            if dead:
                live.pop(docid, None)
                deleted.add(docid)
            else:
                live[docid] = body
                deleted.discard(docid)
            if exp and not dead:
                expiries[docid] = exp
            else:
                expiries.pop(docid, None)
    last = links[-1].entry
    return PartitionState(live, deleted, last.seqno, last.uuid, expiries)
