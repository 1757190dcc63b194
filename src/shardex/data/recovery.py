"""Detecting that "memory" durability may have lost acknowledged writes, and branching.

A write with ``durability="memory"`` is acknowledged once it is in the WAL's OS buffers: it
survives a process crash (the kernel still writes the page cache out) but not a power loss or
kernel crash. If such a loss happened, the partition's history after the last fsync is gone and
consumers that saw it have diverged, so the partition must start a new branch (new uuid) at its
recovered high seqno; consumers that saw more then get ROLLBACK to that branch point.

How it is detected, cheaply and without false losses after a mere process crash:

* Before the first unsynced write to a partition since its last fsync, a *dirty mark*
  ``data/dirty/<cf>`` holding the machine's boot id is written to the default column family with
  ``sync=True`` (one fsync per partition per clean period, not per write).
* Any synced write to the partition removes the mark in its own batch (the fsync covers every
  earlier write); ``DataEngine.sync()`` and a clean ``close()`` fsync and remove all marks.
* The periodic WAL sync (``sync(keep_busy_marks=True)``, every second) fsyncs too but leaves
  the mark of a partition written unsynced since the previous one: under steady writes the
  mark would otherwise be removed and fsynced again every second for every partition (two
  fsyncs per partition per second, each making a write wait). A mark kept on a partition
  whose writes are all synced costs, after a reboot, only a new branch at its high seqno,
  where every consumer continues without a ROLLBACK; it is removed at the first sync after
  an idle second.
* On open, a remaining mark means the last run ended with unsynced writes outstanding. If the
  boot id differs from the current one, the machine restarted, writes may be lost: new branch.
  If it is the same boot, only the process died and the kernel kept every WAL byte: no branch.
"""

from __future__ import annotations

from pathlib import Path

from shardex.data.partition import Partition
from shardex.storage import Batch, Store

DIRTY_PREFIX = b"data/dirty/"


def current_boot_id() -> str:
    """The kernel's boot id (changes on every boot); "" when unknown, which the caller treats
    as "cannot prove it is the same boot" and so branches conservatively."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _mark_key(part: Partition) -> bytes:
    return DIRTY_PREFIX + part.cf.name.encode("utf-8")


class DirtyMarks:
    """Keeps the dirty marks of one store's partitions (see module docstring)."""

    def __init__(self, store: Store, boot_id: str) -> None:
        self._store = store
        self._default = store.column_family()
        self._boot_id = boot_id

    def detach(self) -> None:
        """Forget the store's handles (the store is closing)."""
        del self._default

    def attach(self, part: Partition) -> None:
        part.before_unsynced = self._before_unsynced
        part.clear_mark_into = self._clear_into

    def _before_unsynced(self, part: Partition) -> None:
        if part.dirty:
            return
        self._default.put(_mark_key(part), self._boot_id.encode(), sync=True)
        part.dirty = True

    def _clear_into(self, part: Partition, batch: Batch) -> None:
        batch.delete(self._default, _mark_key(part))

    def clear(self, parts: list[Partition], *, keep_busy: bool = False) -> None:
        """Fsync the WAL and remove the marks of ``parts`` (``keep_busy``: not of those written
        unsynced since the last such call, module docstring). Holds every dirty partition's
        lock (in a fixed order; writers hold at most one) so no unsynced write slips in
        between the fsync and the mark's removal."""
        dirty = sorted((p for p in parts if p.dirty), key=lambda p: p.cf.name)
        for p in dirty:
            p.lock.acquire()
        try:
            batch = self._store.batch()
            batch.put(self._default, b"data/last-sync", self._boot_id.encode())
            cleared = [p for p in dirty if not (keep_busy and p.wrote_unsynced)]
            for p in cleared:
                batch.delete(self._default, _mark_key(p))
            self._store.write(batch, sync=True)
            for p in dirty:
                p.synced_high = p.meta.high_seqno
                p.wrote_unsynced = False
            for p in cleared:
                p.dirty = False
        finally:
            for p in reversed(dirty):
                p.lock.release()

    def recover(self, parts_by_cf: dict[str, Partition]) -> list[Partition]:
        """Branch the partitions whose marks survived a reboot; drop every mark. Returns the
        partitions that were given a new branch."""
        branched: list[Partition] = []
        batch = self._store.batch()
        upper = DIRTY_PREFIX[:-1] + bytes([DIRTY_PREFIX[-1] + 1])
        for key, boot in self._default.iterate(DIRTY_PREFIX, upper):
            part = parts_by_cf.get(key[len(DIRTY_PREFIX) :].decode("utf-8"))
            if part is not None and (not self._boot_id or boot.decode() != self._boot_id):
                part.new_branch()
                branched.append(part)
            batch.delete(self._default, key)
        self._store.write(batch, sync=True)
        return branched
