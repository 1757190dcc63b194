"""A slice's initial build: enter ``loading`` at T0, bulk-load a sorted snapshot, go active.

A part of ``Slice`` (``slice.py``), split out by job: it works on the slice's own state under
the slice lock, with the same rules (``docs/decisions/
0028-initial-builds-crashes-rollbacks.md``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.bulk import SortedLoad, sorted_load_rows, write_sorted
from shardex.index.keyversion import KeyVersion
from shardex.index.records import (
    STATE_ACTIVE,
    STATE_CREATED,
    STATE_LOADING,
    STATE_NEEDS_REBUILD,
    SliceMeta,
)

if TYPE_CHECKING:
    from shardex.index.slice import Slice


class SliceLoading:
    """The initial-build methods of ``Slice``."""

    def begin_load(self: Slice, ts0: Timestamp, *, restart: bool = False) -> None:
        """Enter ``loading`` at T0 (durably): from now on key versions with seqno <= T0[p]
        are dropped at enqueue, later ones queue up until the load is done. Idempotent for
        the same T0. ``restart``: a slice ``loading`` (at another T0) or ``needs_rebuild``
        is emptied first (a restarted build); queued versions above T0 are kept."""
        with self.lock:
            if self.state == STATE_LOADING and self._meta.load_ts == dict(ts0.to_wire()):
                return
            torn = self.state in (STATE_LOADING, STATE_NEEDS_REBUILD)
            if self.state != STATE_CREATED and not (restart and torn):
                raise ShardexError(
                    f"slice {self._name()} is {self.state}: a load needs an empty slice",
                    code=ErrorCode.BAD_REQUEST,
                    details={"hint": "reset() it first"},
                )
            meta = SliceMeta(
                definition=self.definition,
                partition=self.partition,
                state=STATE_LOADING,
                load_ts=dict(ts0.to_wire()),
            )
            if torn:  # storage of a torn load or of a rolled-back history: start empty
                self._empty(meta)
            else:
                self._write_meta(meta)
            self._drop_queued_upto(ts0)
            self._reset_decided()  # loading: the stabilise waits for the load

    def bulk_load(
        self: Slice, rows: Iterable[KeyVersion], ts0: Timestamp, *, use_sst: bool | None = None
    ) -> str:
        """Initial build: load the UPSERT key versions of a snapshot at ``ts0`` (any order;
        sorted here), record ``ts0`` as applied, snapshot it. Returns ``"sst"``/``"batch"``."""
        return self.write_load(sorted_load_rows(rows), ts0, use_sst=use_sst)

    def write_load(
        self: Slice, load: SortedLoad, ts0: Timestamp, *, use_sst: bool | None = None
    ) -> str:
        """``bulk_load`` of rows already sorted (a load session's ``sorted_load``).

        A crash before the final meta write leaves ``loading`` on disk, which ``recover``
        turns into ``needs_rebuild``: a torn load is never mistaken for a complete one."""
        with self.lock:
            self.begin_load(ts0)
            method = write_sorted(self.store, self._entries, self._back, load, use_sst=use_sst)
            meta = SliceMeta(
                definition=self.definition,
                partition=self.partition,
                state=STATE_ACTIVE,
                applied=dict(ts0.to_wire()),
                count=len(load.entries),
            )
            self._write_meta(meta, sync=True)
            self._applied = ts0
            self._drop_queued_upto(ts0)
            self._reset_decided()  # what queued during the load, against the loaded rows
            self._take_snapshot(ts0)
            return method

    def _drop_queued_upto(self: Slice, ts: Timestamp) -> None:
        for part, q in self._queue.items():
            lim = ts.seqno(part)
            for s in [s for s in q if s <= lim]:
                del q[s]
