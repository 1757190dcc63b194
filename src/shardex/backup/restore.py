"""``restore_backup`` and ``verify``: a backup's documents back into a running cluster.

The target may have any number of nodes and its keyspace any partition count: documents are
written through the client (``upsert_many``, batched per owner node), so the target's own
routing places them. Per source partition, the chain's files are merged (``merge``) into each
document's newest version, the live ones upserted and the deleted ones deleted (a deletion
of a document the target lacks is nothing to do). The keyspace is created when missing
(with the backup's partition count unless told otherwise), and once every partition is in,
the index definitions are created (BUILDING: the index pipeline builds them when it runs).

Resumable: after each round of source partitions the restore records them in
``restores/BACKUP--KS--TO.json`` of the repository, with the target keyspace's identity; a
restore started again after a crash skips what it finished (writes are idempotent, so the
partition cut by the crash is simply written again). The record is removed at the end.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from shardex.api.data import OpItem
from shardex.backup.merge import PartitionState, chain_of, merge_partition, partition_chain
from shardex.backup.repo import IndexEntry, KeyspaceEntry, Manifest, Repo, repo_error
from shardex.backup.snapshot import read_snapshots
from shardex.client import Client
from shardex.client.bulk import BulkWriter
from shardex.errors import ErrorCode, ShardexError
from shardex.runtime.files import atomic_write_bytes

DELETE_CHUNK = 1000
GROUP = 16  # source partitions merged and written per round (and recorded done together)


@dataclass(slots=True)
class RestoreEvents:
    """What a restore tells its caller (the CLI's progress bar); every hook optional."""

    start: Callable[[str, int], None] = lambda keyspace, total_rows: None
    advance: Callable[[int], None] = lambda rows: None
    note: Callable[[str], None] = lambda message: None


@dataclass(slots=True)
class RestoreResult:
    backup: str
    keyspace: str
    to_keyspace: str
    documents: int = 0  # upserted
    expired: int = 0  # live in the backup but past their expiry now: not restored
    deletions: int = 0  # deletions applied (documents the target lacked count too)
    created_keyspace: bool = False
    indexes_created: list[str] = field(default_factory=list)
    indexes_existing: list[str] = field(default_factory=list)
    vector: dict[int, tuple[int, int]] = field(default_factory=dict)


class _Done(msgspec.Struct, kw_only=True):
    target_uuid: str
    partitions: list[int]


def restore_backup(
    client: Client,
    repo_path: Path,
    *,
    keyspace: str | None = None,
    to_keyspace: str | None = None,
    backup: str | None = None,
    num_partitions: int | None = None,
    batch: int = 1000,
    durability: str = "persist",
    events: RestoreEvents | None = None,
    group: int = GROUP,
) -> list[RestoreResult]:
    """Restore ``keyspace`` (None: every keyspace of the backup) as of backup ``backup``
    (None: the newest) into the cluster, as ``to_keyspace`` (default: the same name).
    ``group``: source partitions written per round, the unit a resumed restore skips."""
    ev = events or RestoreEvents()
    repo = Repo.open(repo_path)
    with repo.locked():
        backups = repo.backups()
        target = repo.find(backup)
        names = [keyspace] if keyspace is not None else sorted(target.keyspaces)
        if to_keyspace is not None and len(names) != 1:
            raise ShardexError(
                "--to-keyspace needs one keyspace to restore",
                code=ErrorCode.BAD_REQUEST,
                details={"keyspaces": names, "hint": "add --keyspace NAME"},
            )
        return [
            _restore_keyspace(
                client,
                repo,
                backups,
                target,
                ks,
                to_keyspace or ks,
                num_partitions,
                batch,
                durability,
                group,
                ev,
            )
            for ks in names
        ]


def keyspace_chain(
    repo: Repo, backups: Sequence[Manifest], target: Manifest, keyspace: str
) -> tuple[list[Manifest], KeyspaceEntry]:
    chain = chain_of(backups, keyspace, target.name)
    if not chain:
        raise repo_error(
            repo.path,
            f"no backup up to {target.name} holds keyspace {keyspace!r}",
            "shardex backup list --repo PATH shows what each backup holds",
            keyspace=keyspace,
        )
    return chain, chain[-1].keyspaces[keyspace]


def _restore_keyspace(
    client: Client,
    repo: Repo,
    backups: list[Manifest],
    target: Manifest,
    ks: str,
    to: str,
    num_partitions: int | None,
    batch: int,
    durability: str,
    group: int,
    ev: RestoreEvents,
) -> RestoreResult:
    chain, entry = keyspace_chain(repo, backups, target, ks)
    result = RestoreResult(chain[-1].name, ks, to, vector=entry.vector)
    desc = next((k for k in client.list_keyspaces() if k.name == to), None)
    if desc is None:
        desc = client.create_keyspace(to, num_partitions or entry.num_partitions)
        result.created_keyspace = True
        ev.note(f"created keyspace {to!r} with {desc.num_partitions} partitions")
    state_path = repo.restore_state_path(result.backup, ks, to)
    done = _load_done(state_path, desc.uuid)
    if done.partitions:
        ev.note(f"continuing a restore of {ks!r}: {len(done.partitions)} partition(s) done")
    todo = [p for p in range(entry.num_partitions) if p not in set(done.partitions)]
    links = {p: partition_chain(repo, chain, ks, p) for p in todo}
    ev.start(ks, sum(link.entry.rows for p in todo for link in links[p]))
    # A group of source partitions per round: one upsert_many keeps its pipeline of
    # batches full (a partition alone is often a single batch), and memory stays bounded.
    for i in range(0, len(todo), group):
        parts = todo[i : i + group]
        merged = PartitionState({}, set(), 0, 0)
        for p in parts:
            state = merge_partition(repo, links[p])
            ev.advance(sum(link.entry.rows for link in links[p]) - len(state.live))
            merged.live.update(state.live)  # a docid lives in one source partition
            merged.deleted |= state.deleted
            merged.expiries.update(state.expiries)
        _write_partitions(client, to, merged, batch, durability, ev, result)
        done.partitions.extend(parts)
        state_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(state_path, msgspec.json.encode(done))
    _create_indexes(client, to, entry.indexes, result, ev)
    state_path.unlink(missing_ok=True)
    return result


def _load_done(path: Path, target_uuid: str) -> _Done:
    try:
        done = msgspec.json.decode(path.read_bytes(), type=_Done)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return _Done(target_uuid=target_uuid, partitions=[])
    if done.target_uuid != target_uuid:  # the target keyspace was re-created: start over
        return _Done(target_uuid=target_uuid, partitions=[])
    return done


def _write_partitions(
    client: Client,
    to: str,
    state: PartitionState,
    batch: int,
    durability: str,
    ev: RestoreEvents,
    result: RestoreResult,
) -> None:
    failed: list[tuple[str, ShardexError]] = []
    # A document keeps its absolute expiry (past 30 days after the epoch: never taken for
    # a relative one); one already past it is not written back.
    now = time.time()
    items: list[tuple[str, bytes] | tuple[str, bytes, int]] = []
    for docid, body in state.live.items():
        exp = state.expiries.get(docid, 0)
        if not exp:
            items.append((docid, body))
        elif exp > now:
            items.append((docid, body, exp))
        else:
            result.expired += 1
    ev.advance(len(state.live) - len(items))
    docids = [item[0] for item in items]

    def on_chunk(start: int, results: list[object]) -> None:
        for i, r in enumerate(results, start):
            if isinstance(r, ShardexError):
                failed.append((docids[i], r))
        ev.advance(len(results))

    client.keyspace(to).upsert_many(
        items,
        chunk_size=batch,
        durability=durability,
        raise_errors=False,
        on_chunk=on_chunk,
    )
    _check_failed(to, failed)
    result.documents += len(docids)
    result.deletions += _delete_many(client, to, sorted(state.deleted), durability)


def _delete_many(client: Client, to: str, docids: list[str], durability: str) -> int:
    """Delete ``docids`` in batches per owner node; a document already absent is fine."""
    rpc = client.rpc
    failed: list[tuple[str, ShardexError]] = []
    for i in range(0, len(docids), DELETE_CHUNK):
        part = docids[i : i + DELETE_CHUNK]
        writer = BulkWriter(rpc.router, to, durability)
        ops = [(j, OpItem("delete", d)) for j, d in enumerate(part)]
        results = rpc.run(writer.write_only_chunk(ops))
        for j, r in results.items():
            if isinstance(r, ShardexError) and r.code is not ErrorCode.DOC_NOT_FOUND:
                failed.append((part[j], r))
    _check_failed(to, failed)
    return len(docids)


def _check_failed(to: str, failed: list[tuple[str, ShardexError]]) -> None:
    if failed:
        docid, first = failed[0]
        raise ShardexError(
            f"restore into {to!r}: {len(failed)} document(s) could not be written; the first, "
            f"{docid!r}: {first.code.value}: {first.message}",
            code=ErrorCode.PARTIAL_FAILURE,
            details={
                "keyspace": to,
                "failed": len(failed),
                "hint": "fix the cause and run the same restore again: it continues where it "
                "stopped",
            },
        )


def _create_indexes(
    client: Client,
    to: str,
    indexes: Sequence[IndexEntry],
    result: RestoreResult,
    ev: RestoreEvents,
) -> None:
    existing = {d["name"] for d in client.list_indexes(to, stats=False)}
    for ix in indexes:
        if ix.name in existing:
            result.indexes_existing.append(ix.name)
            continue
        replicas = ix.num_replica
        while True:
            try:
                client.create_index(
                    to,
                    ix.name,
                    ix.keys,
                    where=ix.where,
                    partition_by=ix.partition_by,
                    num_partition=None if ix.is_primary else ix.num_partition,
                    defer_build=ix.defer_build,
                    primary=ix.is_primary,
                    num_replica=replicas,
                )
                break
            except ShardexError as exc:
                # The target may have fewer indexer nodes than the replicas need.
                if exc.code is not ErrorCode.BAD_REQUEST or replicas == 0:
                    raise
                ev.note(f"index {ix.name!r}: {exc.message}; created with no replica")
                replicas = 0
        result.indexes_created.append(ix.name)


# --- verify -------------------------------------------------------------------------------


@dataclass(slots=True)
class VerifyReport:
    keyspace: str
    to_keyspace: str
    matched: int = 0
    missing: list[str] = field(default_factory=list)  # in the backup, not in the cluster
    extra: list[str] = field(default_factory=list)  # in the cluster, not in the backup
    different: list[str] = field(default_factory=list)  # in both, other content

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.different)


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


def cluster_digests(client: Client, keyspace: str) -> dict[str, bytes]:
    """docid -> digest of its body, for every document of ``keyspace`` as of its current
    high seqnos (read as a full backup reads, without blocking writers)."""
    ts = client.high_seqnos(keyspace)
    out: dict[str, bytes] = {}
    for snap in read_snapshots(client, keyspace, {p: (e.seqno, e.uuid) for p, e in ts.items()}):
        for c in snap.docs:
            assert c.body is not None  # snapshots hold live documents only
            out[c.docid] = _digest(c.body)
    return out


def verify(
    client: Client,
    repo_path: Path,
    *,
    keyspace: str,
    to_keyspace: str | None = None,
    backup: str | None = None,
) -> VerifyReport:
    """Compare keyspace ``to_keyspace`` in the cluster with ``keyspace`` in the backup: every
    document the backup holds present with equal content, and no other document."""
    repo = Repo.open(repo_path)
    to = to_keyspace or keyspace
    backups = repo.backups()
    chain, entry = keyspace_chain(repo, backups, repo.find(backup), keyspace)
    report = VerifyReport(keyspace, to)
    have = cluster_digests(client, to)
    ks = client.keyspace(to)
    now = time.time()
    for p in range(entry.num_partitions):
        state = merge_partition(repo, partition_chain(repo, chain, keyspace, p))
        for docid, body in state.live.items():
            got = have.pop(docid, None)
            if 0 < state.expiries.get(docid, 0) <= now:
                continue  # expired since the backup: gone from the cluster, as it should be
            if got is None:
                report.missing.append(docid)
            elif got == _digest(body) or _same_json(ks.get(docid), body):
                report.matched += 1
            else:
                report.different.append(docid)
    report.extra = sorted(have)
    return report


def _same_json(doc: object, body: bytes) -> bool:
    """Equal as JSON values (the bytes may differ in spacing or key order only)."""
    return doc == msgspec.json.decode(body)
