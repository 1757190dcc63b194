"""Pausing Python's cyclic garbage collector around a hot loop that builds many containers
which stay alive until it ends: a micro-batch's projection, a scan block's rows, the decode
of a large frame.

Projecting and routing a batch creates a few tuples per change (key versions, Arrow column
lists) and frees almost none until the batch ends, so the collector's allocation counter
fires over and over and every young collection walks objects that are all still alive; in
the Spark driver, whose heap also holds py4j and pyspark state, the older generations are
large too. Measured on the development machine (one process, the same 9,600 changes read,
projected and routed, alternating): 1.80 s with the collector on and 0.90 s with it paused
(load 15, so the ratio is the figure, not the times). Nothing leaks: the batch's size is
capped (``max_records_per_batch``) and collection resumes, with one young collection, at
the end of the batch.

A scan client building a block's rows (a dict and a key list per row, ``client/rows.py``)
met the same: the whole block survives every young collection it triggers, so it is walked
again and promoted, and the promotions set off full collections of the caller's heap.

A large frame (a delivery of key versions to an indexer, a piece of a change stream) decodes
into one list of thousands of tuples or structs: every young collection the decode sets off
walks that list whole while it is young, so the decode's cost grew with the square of the
frame. Measured with ``python -m bench.diagnostics.indexer_round`` (frames of ~13k key
versions): 0.9 us per key version decoded with the collector on, 0.5 with the decode paused
(the closing young collection included); ``docs/decisions/0136-pipeline-cpu-per-mutation.md``.

Reference-counted, so overlapping holders (batches of two keyspaces' queries, each
``foreachBatch`` in its own thread; a frame decoded on another thread meanwhile) pause it
once and resume it when the last one ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the body with the cyclic collector disabled (unless another holder already
    paused it); the last holder to leave restores the state found by the first."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
                gc.collect(0)
