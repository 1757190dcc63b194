"""Bulk loading a slice for an initial build: sorted runs, SST ingestion or batches.

An initial build hands a slice every entry of a snapshot at T0 at once. Writing them through
the memtable costs a WAL write and later compactions; writing sorted SST files and ingesting
them puts them straight into the LSM tree. Ingestion has a fixed cost (file creation, a
flush of the family, a manifest write), so small loads go through one write batch instead.
``SST_THRESHOLD`` is where the two cross on this machine (measured, see
``docs/decisions.md``, "Indexer").
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from shardex.index.keyversion import UPSERT, KeyVersion
from shardex.index.records import encode_back
from shardex.storage import ColumnFamily, SstWriter, Store

__all__ = ["SST_THRESHOLD", "sorted_load_rows", "write_sorted"]

SST_THRESHOLD = 20_000


def sorted_load_rows(
    rows: Iterable[KeyVersion],
) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """Entries and back-index rows of a load, each sorted by key bytes.

    Only ``UPSERT`` rows make entries (a snapshot read yields removals only for documents
    that are not indexed, which have nothing to load). A docid given twice keeps its highest
    seqno, so a build that read a document twice is still exact.
    """
    ups = [r for r in rows if r[2] == UPSERT]
    if len({r[4] for r in ups}) != len(ups):
        # A docid given twice (a retried chunk read the document again): the highest seqno.
        latest: dict[str, KeyVersion] = {}
        for row in ups:
            cur = latest.get(row[4])
            if cur is None or row[6] > cur[6]:
                latest[row[4]] = row
        ups = list(latest.values())
    # Comprehensions and one C sort each: the per-row cost here is paid for every entry of
    # an initial build (back keys are unique docids, so tuples compare on the key alone).
    entries = sorted([r[3] for r in ups])
    enc = encode_back
    back = sorted([(r[4].encode("utf-8"), enc(r[5], r[6], r[3])) for r in ups])
    return entries, back


def write_sorted(
    store: Store,
    entries_cf: ColumnFamily,
    back_cf: ColumnFamily,
    entries: list[bytes],
    back: list[tuple[bytes, bytes]],
    *,
    use_sst: bool | None = None,
) -> str:
    """Write a sorted load into two (empty) families; returns the method used
    (``"sst"`` or ``"batch"``). ``use_sst=None`` chooses by ``SST_THRESHOLD``."""
    if use_sst is None:
        use_sst = len(entries) >= SST_THRESHOLD
    if not use_sst:
        batch = store.batch()
        for e in entries:
            batch.put(entries_cf, e, b"")
        for k, v in back:
            batch.put(back_cf, k, v)
        store.write(batch, sync=True)
        return "batch"
    tmp = Path(store.path) / "ingest"
    tmp.mkdir(exist_ok=True)
    fd, epath = tempfile.mkstemp(dir=tmp, suffix=".sst")
    os.close(fd)
    fd, bpath = tempfile.mkstemp(dir=tmp, suffix=".sst")
    os.close(fd)
    try:
        if entries:
            w = SstWriter(epath)
            for e in entries:
                w.put(e, b"")
            w.finish()
            entries_cf.ingest([epath])
        if back:
            w = SstWriter(bpath)
            for k, v in back:
                w.put(k, v)
            w.finish()
            back_cf.ingest([bpath])
    finally:
        for p in (epath, bpath):
            if os.path.exists(p):
                os.unlink(p)
    return "sst"
