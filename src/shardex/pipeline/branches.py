"""Following a data partition onto a new history branch (a failover's promotion).

A failover promotes a replica copy on a new branch: a new uuid starting at the copy's high
seqno (the failover log's newest entry). A batch's end then names the new uuid while the
indexes' applied TS (and their *ahead* TS) still name the old one, and every comparison of
the job (``Timestamp.covers`` requires the same uuid) would leave those indexes out of every
round: stability would stop.

Before a batch compares them, ``follow_branches`` asks the partition's current owner whether
each old (seqno, uuid) an index holds is still in the partition's history (the failover-log
check a stream open makes): if it is (the index applied nothing past the branch point, the
case of a majority-durable failover) the entry is the same point on the new branch and is
rewritten with the new uuid (``IndexRegistry.rebase``); if not (the index applied changes of
the lost branch, e.g. writes at durability none the promoted replica never received) the batch
fails with ROLLBACK and the driver's rollback handling rebuilds what it reached
(``rollback.py``).
"""

from __future__ import annotations

import logging

from shardex.client import Client
from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.registry import IndexRegistry
from shardex.pipeline.source.types import rollback_error

log = logging.getLogger(__name__)


def stale_entries(registry: IndexRegistry, end: Timestamp) -> dict[int, dict[int, int]]:
    """partition -> old uuid -> the highest seqno an index holds on it, for the partitions
    whose uuid in ``end`` differs from an index's applied or ahead entry."""
    out: dict[int, dict[int, int]] = {}
    for view in registry.maintained():
        for ts in (registry.applied(view.id), registry.ahead(view.id)):
            for p, entry in ts.items():
                now = end.get(p)
                if now is None or entry.seqno == 0 or entry.uuid == now.uuid:
                    continue
                olds = out.setdefault(p, {})
                olds[entry.uuid] = max(olds.get(entry.uuid, 0), entry.seqno)
    return out


def follow_branches(client: Client, registry: IndexRegistry, end: Timestamp) -> None:
    """Rebase the indexes' entries that lie on ``end``'s history; ROLLBACK for the others
    (module docstring)."""
    stale = stale_entries(registry, end)
    for p, olds in sorted(stale.items()):
        new = end[p]
        for old_uuid, seqno in sorted(olds.items()):
            rollback = _rollback_seqno(client, registry.keyspace, p, SeqnoEntry(seqno, old_uuid))
            if rollback is not None:
                raise rollback_error(
                    registry.keyspace,
                    p,
                    rollback,
                    f"partition {p} of {registry.keyspace!r} moved to a new branch; the "
                    f"indexes applied seqno {seqno} of the old one, past where it ended: roll "
                    f"back to {rollback}",
                    uuid=old_uuid,
                )
            registry.rebase(p, old_uuid, new.uuid, seqno)
            log.info(
                "partition %d of %s continues on branch %x: indexes at seqno <= %d follow it",
                p,
                registry.keyspace,
                new.uuid,
                seqno,
            )


def _rollback_seqno(client: Client, keyspace: str, partition: int, at: SeqnoEntry) -> int | None:
    """None if (seqno, uuid) ``at`` is in the partition's history, else its rollback seqno
    (a stream opened at ``at`` and closed at once: the data node's failover-log check)."""
    ks = client.keyspace(keyspace)
    try:
        with ks.stream(partition, at.seqno, at.uuid, at.seqno):
            pass
    except ShardexError as exc:
        if exc.code is ErrorCode.ROLLBACK:
            return int(exc.details.get("rollback_seqno", 0))
        raise
    return None
