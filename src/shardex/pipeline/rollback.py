"""What the driver does when the change stream reports ROLLBACK (a data partition's history
diverged from what the pipeline read: its uuid is not the one the stream's offsets hold).

The simple correct scheme of the pipeline notes:

1. every indexer of the keyspace's indexes drops queued versions above the rollback seqno,
   and every slice that applied beyond it turns ``needs_rebuild`` (scans of it get
   INDEX_IN_ROLLBACK from then on);
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

import logging
import shutil
import time
from pathlib import Path

from shardex.client import Client
from shardex.pipeline.indexers import rollback_slices
from shardex.pipeline.registry import IndexRegistry
from shardex.pipeline.source_types import RollbackInfo

__all__ = ["GENERATION_PREFIX", "current_generation", "handle_rollback", "new_generation"]

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


def handle_rollback(client: Client, registry: IndexRegistry, info: RollbackInfo) -> list[str]:
    """Steps 1-2 of the module docstring; returns the ids of the indexes to rebuild."""
    started = time.perf_counter()
    views = registry.refresh(force=True)
    nodes = sorted({n for v in views.values() for n in v.nodes})
    hit = rollback_slices(client, nodes, registry.keyspace, info.partition, info.rollback_seqno)
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
