"""What the driver does when the change stream reports ROLLBACK (a data partition's history
diverged from what the pipeline read: its uuid is not the one the stream's offsets hold).

The simple correct scheme of the pipeline notes:

1. every indexer node of the cluster (every member running the index service, not only the
   owners of the current index topologies) drops queued versions above the rollback seqno,
   and every slice of the keyspace that applied beyond it turns ``needs_rebuild`` (scans of
   it get INDEX_IN_ROLLBACK from then on). The owners and move targets of the current
   topologies must answer (else the rollback fails and the supervisor runs it again); any other
   indexer (retired or orphan copies, a node whose slices switched away) is told best
   effort, and one that cannot be reached is logged
   (``docs/decisions/0067-rollback-tells-every-indexer.md``);
2. those indexes leave the stream (``IndexRegistry.forget``) and get a new initial build
   from a fresh snapshot (the index stays ACTIVE in the coordinator; ``MarkIndexActive``
   records the new build TS);
3. the stream restarts in a new checkpoint generation from the current high seqnos: the
   old checkpoint's offsets belong to the lost history. Indexes that were not hit keep their
   applied TS (at or below the rollback point, so on the surviving history) and are caught
   up from it by the maintenance job.

A faster scheme (persisted rollback points per slice) is future work.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import shardex.pipeline.indexers as indexers
from shardex.api.delivery import RollbackSlices, SlicesRolledBack
from shardex.client import Client
from shardex.errors import ShardexError
from shardex.pipeline.registry import IndexRegistry
from shardex.pipeline.source.types import RollbackInfo

__all__ = [
    "GENERATION_PREFIX",
    "current_generation",
    "handle_rollback",
    "indexer_members",
    "new_generation",
    "rollback_everywhere",
]

log = logging.getLogger(__name__)

GENERATION_PREFIX = "gen-"


def current_generation(root: Path) -> Path:
    """The newest checkpoint generation under a keyspace's checkpoint root (gen-1 first)."""
    gens = sorted(
        (int(p.name[len(GENERATION_PREFIX) :]), p)
        for p in root.glob(f"{GENERATION_PREFIX}*")
        if p.name[len(GENERATION_PREFIX) :].isdigit()
    )
    return gens[-1][1] if gens else root / f"{GENERATION_PREFIX}1"


def new_generation(root: Path) -> Path:
    """A fresh generation after the current one; older generations are removed (their
    offsets belong to a history that is gone)."""
    current = current_generation(root)
    n = int(current.name[len(GENERATION_PREFIX) :]) + 1
    for old in root.glob(f"{GENERATION_PREFIX}*"):
        shutil.rmtree(old, ignore_errors=True)
    return root / f"{GENERATION_PREFIX}{n}"


def indexer_members(client: Client) -> dict[str, str]:
    """Every cluster member running the index service -> its state in the membership view of
    the node the client is connected to ("up", "down", "unknown"). Empty, with a warning, when
    the membership cannot be read: the rollback then reaches the current owners only."""
    try:
        status = client.cluster_status()
    except ShardexError as exc:  # best effort: the owners are still told
        log.warning(
            "ROLLBACK: cannot read the cluster membership (%s): only the owners of "
            "the current index topologies are told",
            exc,
        )
        return {}
    return {m.name: m.state for m in status.members if "index" in m.services}


def rollback_everywhere(
    client: Client,
    owners: Sequence[str],
    members: dict[str, str],
    keyspace: str,
    partition: int,
    seqno: int,
) -> list[tuple[str, int]]:
    """``RollbackSlices`` to ``owners`` and to every other indexer of ``members``, all at
    once; returns the (index id, index partition) slices that now need a rebuild. An owner
    that fails raises (after every node was asked); another node that fails is logged."""
    nodes = sorted(set(owners) | set(members))
    msg = RollbackSlices(keyspace=keyspace, partition=partition, seqno=seqno)

    async def go() -> list[SlicesRolledBack | BaseException]:
        sends = (indexers.to_node(client, n, msg, SlicesRolledBack) for n in nodes)
        return await asyncio.gather(*sends, return_exceptions=True)

    hit: list[tuple[str, int]] = []
    owner_error: BaseException | None = None
    for node, reply in zip(nodes, client.rpc.run(go()), strict=True):
        if isinstance(reply, SlicesRolledBack):
            hit.extend(reply.needs_rebuild)
        elif node in owners:
            owner_error = owner_error or reply
        else:
            # Its queues are memory-only: a stopped node comes back with them empty. What it
            # applied stays; outside every current topology no round stabilises it again.
            log.warning(
                "ROLLBACK of partition %d of %s to seqno %d not delivered to indexer %s "
                "(membership: %s, outside the current index topologies): %s",
                partition,
                keyspace,
                seqno,
                node,
                members.get(node, "unknown"),
                reply,
            )
    if owner_error is not None:
        raise owner_error
    return hit


def handle_rollback(client: Client, registry: IndexRegistry, info: RollbackInfo) -> list[str]:
    """Steps 1-2 of the module docstring; returns the ids of the indexes to rebuild."""
    started = time.perf_counter()
    views = registry.refresh(force=True)
    # The nodes the stream routes to: the topologies' owners and the targets of index moves.
    owners = sorted({n for v in views.values() for n in (*v.nodes, *v.moving.values())})
    members = indexer_members(client)
    hit = rollback_everywhere(
        client, owners, members, registry.keyspace, info.partition, info.rollback_seqno
    )
    rebuild = sorted({index_id for index_id, _ in hit})
    for index_id in rebuild:
        registry.forget(index_id)
    log.warning(
        "ROLLBACK of partition %d of %s to seqno %d: %d slice(s) of %s need a rebuild "
        "(handled in %.0f ms)",
        info.partition,
        registry.keyspace,
        info.rollback_seqno,
        len(hit),
        rebuild or "no index",
        (time.perf_counter() - started) * 1e3,
    )
    return rebuild
