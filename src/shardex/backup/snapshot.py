"""Each partition's live documents as of a given (seqno, uuid), without blocking writers:
what a full backup copies and what ``verify`` compares.

The pipeline's snapshot reads (``chunk_groups(..., snapshot=True)``: the change log (0,
seqno], each docid's last version, tombstones dropped) do the work, ``GROUP`` partitions at
a time. Two refusals are handled here rather than failing the whole read:

* SNAPSHOT_TOO_OLD: the log below the seqno is purged (the data nodes keep the last 100,000
  seqnos per partition). The partition is read by one backfill stream instead, its current
  documents at the stream's own snapshot, whose (seqno, uuid) the result carries.
* ROLLBACK: a failover moved the partition to another branch after the seqno was taken, and
  the history it names may be lost. The partition's high seqno is taken again and read
  (at most ``MAX_RETAKES`` times).

Either refusal restarts its group's other reads, so a group bounds the restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from shardex.api.records import OP_DELETE, Change, SnapshotMarker
from shardex.backup.merge import latest_versions
from shardex.client import Client
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.source.read import chunk_groups
from shardex.pipeline.source.types import PartitionRange

GROUP = 16  # partitions read per round (their documents are held at once)
MAX_RETAKES = 3  # a partition's seqno taken again after a branch change, at most


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One partition's live documents (seqno order) as of (seqno, uuid)."""

    partition: int
    seqno: int
    uuid: int
    docs: list[Change]


def read_snapshots(
    client: Client,
    keyspace: str,
    wanted: Mapping[int, tuple[int, int]],
    note: Callable[[str], None] = lambda message: None,
) -> Iterator[Snapshot]:
    """A ``Snapshot`` of every partition of ``wanted`` (partition -> (seqno, uuid)), each as
    its read completes; ``note`` hears of every fallback."""
    parts = sorted(wanted)
    for i in range(0, len(parts), GROUP):
        todo = {p: wanted[p] for p in parts[i : i + GROUP]}
        yield from _read_group(client, keyspace, todo, note)


def _read_group(
    client: Client,
    keyspace: str,
    todo: dict[int, tuple[int, int]],
    note: Callable[[str], None],
) -> Iterator[Snapshot]:
    retakes: dict[int, int] = {}
    while todo:
        ranges = [PartitionRange(p, 0, 0, s, u) for p, (s, u) in todo.items()]
        try:
            for group in chunk_groups(client, keyspace, ranges, 1, snapshot=True):
                for chunk in group:
                    seqno, uuid = todo.pop(chunk.partition)
                    yield Snapshot(chunk.partition, seqno, uuid, chunk.changes)
        except ShardexError as exc:
            p = exc.details.get("partition")
            if p not in todo:
                raise
            if exc.code is ErrorCode.SNAPSHOT_TOO_OLD:
                del todo[p]
                snap = backfill(client, keyspace, p)
                note(
                    f"partition {p} of {keyspace!r}: its change log below seqno "
                    f"{exc.details.get('purge_seqno', '?')} is purged; read its documents as "
                    f"of seqno {snap.seqno} instead"
                )
                yield snap
            elif exc.code is ErrorCode.ROLLBACK and retakes.get(p, 0) < MAX_RETAKES:
                retakes[p] = retakes.get(p, 0) + 1
                cur = client.high_seqnos(keyspace)[p]
                note(
                    f"partition {p} of {keyspace!r} changed branch while it was read "
                    f"({exc.message}): reading it again at seqno {cur.seqno} (uuid {cur.uuid})"
                )
                todo[p] = (cur.seqno, cur.uuid)
            else:
                raise
            continue
        for p, (seqno, uuid) in todo.items():  # empty partitions (seqno 0): nothing to read
            yield Snapshot(p, seqno, uuid, [])
        todo = {}


def backfill(client: Client, keyspace: str, partition: int) -> Snapshot:
    """The partition's current documents, read by one backfill stream (no end seqno: the
    only read a purged log allows) at the stream's snapshot."""
    changes: list[Change] = []
    seqno = uuid = 0
    with client.keyspace(keyspace).stream(partition, 0) as stream:
        for item in stream:
            if isinstance(item, SnapshotMarker):
                seqno, uuid = max(seqno, item.end), item.uuid
            else:
                changes.append(item)
    live = [c for c in latest_versions(changes) if c.op != OP_DELETE]
    return Snapshot(partition, seqno, uuid, live)
