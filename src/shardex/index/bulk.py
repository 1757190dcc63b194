"""Bulk loading a slice for an initial build: sorted runs, SST ingestion or batches.

An initial build hands a slice every entry of a snapshot at T0 at once. Writing them through
the memtable costs a WAL write and later compactions; writing sorted SST files and ingesting
them puts them straight into the LSM tree. Ingestion has a fixed cost (file creation, a
flush of the family, a manifest write), so small loads go through one write batch instead.
``SST_THRESHOLD`` is where the two cross on this machine (measured, see
``docs/decisions/0028-initial-builds-crashes-rollbacks.md``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

from shardex.index.keyversion import UPSERT, KeyVersion, unpack_entries
from shardex.index.records import pack_back_head
from shardex.storage import ColumnFamily, SstWriter, Store

__all__ = ["SST_THRESHOLD", "SortedLoad", "sorted_load_rows", "write_sorted"]

SST_THRESHOLD = 20_000
_DOCID = itemgetter(4)


class SortedLoad(NamedTuple):
    """A load ready to write: entries sorted, back-index keys sorted with their values."""

    entries: list[bytes]
    back_keys: list[bytes]
    back_values: list[bytes]


def sorted_load_rows(rows: Iterable[KeyVersion]) -> SortedLoad:
    """Entries and back-index rows of a load, each sorted by key bytes.

    Only ``UPSERT`` rows make entries (a snapshot read yields removals only for documents
    that are not indexed, which have nothing to load). A docid given twice keeps its highest
    seqno, so a build that read a document twice is still exact.
    """
    ups = [r for r in rows if r[2] == UPSERT]
    if len(set(map(_DOCID, ups))) != len(ups):
        # A docid given twice (a retried chunk read the document again): the highest seqno.
        latest: dict[str, KeyVersion] = {}
        for row in ups:
            cur = latest.get(row[4])
            if cur is None or row[6] > cur[6]:
                latest[row[4]] = row
        ups = list(latest.values())
    # Comprehensions and one C sort each: the per-row cost here is paid for every entry of
    # an initial build. The back index sorts the docid strings, not (key, value) tuples: str
    # order is code-point order, which is UTF-8 byte order, and a str sort is far cheaper.
    entries = sorted([r[3] for r in ups])
    ups.sort(key=_DOCID)
    pack = pack_back_head
    back_keys = [r[4].encode("utf-8") for r in ups]
    back_values = [pack(r[5], r[6]) + r[3] for r in ups]
    return SortedLoad(entries, back_keys, back_values)


def write_sorted(
    store: Store,
    entries_cf: ColumnFamily,
    back_cf: ColumnFamily,
    load: SortedLoad,
    *,
    use_sst: bool | None = None,
    packed: bool = False,
) -> tuple[str, int]:
    """Write a sorted load into two (empty) families; returns the method used
    (``"sst"`` or ``"batch"``) and the number of entries written. ``use_sst=None`` chooses by
    ``SST_THRESHOLD``. ``packed``: an array index's load, each entry value a document's
    packed entries (unpacked here)."""
    entries, back_keys, back_values = load
    if packed:
        entries = sorted([e for p in entries for e in unpack_entries(p)])
    if use_sst is None:
        use_sst = len(entries) >= SST_THRESHOLD
    if not use_sst:
        batch = store.batch()
        batch.put_many(entries_cf, entries)
        batch.put_many(back_cf, back_keys, back_values)
        store.write(batch, sync=True)
        return "batch", len(entries)
    tmp = Path(store.path) / "ingest"
    tmp.mkdir(exist_ok=True)
    fd, epath = tempfile.mkstemp(dir=tmp, suffix=".sst")
    os.close(fd)
    fd, bpath = tempfile.mkstemp(dir=tmp, suffix=".sst")
    os.close(fd)
    try:
        if entries:
            w = SstWriter(epath, bloom=False)  # entries are range-scanned, never point-read
            w.put_many(entries)
            w.finish()
            entries_cf.ingest([epath])
        if back_keys:
            w = SstWriter(bpath)
            w.put_many(back_keys, back_values)
            w.finish()
            back_cf.ingest([bpath])
    finally:
        for p in (epath, bpath):
            if os.path.exists(p):
                os.unlink(p)
    return "sst", len(entries)
