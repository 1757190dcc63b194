"""request_plus in one round trip (scan-request flow step 9), for the scan coordinator: the
slices are opened at their newest common snapshot while the keyspace's high seqnos are in flight,
and that read is kept when its TS covers them.

* ``SeqnoRide``: the high seqnos riding in a scan's own ``ScanSlices`` (the indexer nodes
  that also own data partitions read them on arrival);
* ``Speculation``: whether a scan opens speculatively (backs off on an index that just
  missed), the check of the read against the seqnos, and the outcomes counted.

The fan-out itself (``ScanSlices`` to every node, stability) stays in
``shardex.scan.coordinator``, which hands it in as ``open_with``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec

from shardex.api.scan import STABILITY_NONE, IndexScan, ScanSlices
from shardex.api.scan_streams import Source, cancel_all
from shardex.core.timestamp import Timestamp
from shardex.scan.cluster_view import ClusterView
from shardex.scan.scan_ts import covers_seqnos

__all__ = ["SPECULATE_BACKOFF", "SeqnoRide", "Speculation"]

# After a request_plus scan found its index behind the high seqnos, that index's scans wait
# for them first (no speculative read) for this long.
SPECULATE_BACKOFF: Final = 1.0

# What an open returns: the TS read (encoded, ``scan_ts``; None for the tips) and the streams.
Opened = tuple[bytes | None, list[Source]]


class SeqnoRide:
    """A request_plus scan's high seqnos riding in its ``ScanSlices``: ``plan`` names, per
    indexer node that is also a data owner, the data partitions of ``keyspace`` it reads on
    arrival; ``got`` collects what the replies carried; ``snapshot`` is the TS this node's
    own slices were read at (None: none read here, or the tips)."""

    __slots__ = ("got", "keyspace", "plan", "snapshot")

    def __init__(self, keyspace: str, plan: dict[str, list[int]]) -> None:
        self.keyspace = keyspace
        self.plan = plan
        self.got: dict[int, tuple[int, int]] = {}
        self.snapshot: Timestamp | None = None


class Speculation:
    """One coordinator's speculative request_plus opens: ``missed`` maps an index id to the
    loop time of its last miss (the snapshot read did not cover the seqnos); ``counts``
    counts the outcomes (hit, miss, skipped)."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.missed: dict[str, float] = {}
        self.counts: Counter[str] = Counter()

    def wanted(self, msg: IndexScan, index_id: str, by_node: dict[str, list[int]]) -> bool:
        """Whether a request_plus scan opens its slices while the high seqnos are fetched
        (``open``): it needs a labelled snapshot (scan stability, nothing pinned), slices to
        read, and no recent miss on this index (the pipeline lagged a moment ago: the
        wasted read would likely be wasted again)."""
        if msg.stability == STABILITY_NONE or msg.pinned is not None or not by_node:
            return False
        missed = self.missed.get(index_id)
        if missed is not None:
            if asyncio.get_running_loop().time() - missed < SPECULATE_BACKOFF:
                self.counts["skipped"] += 1
                return False
            del self.missed[index_id]
        return True

    async def open(
        self,
        index_id: str,
        base: ScanSlices,
        seqnos: asyncio.Future[dict[int, tuple[int, int]]],
        ride: SeqnoRide,
        open_with: Callable[..., Awaitable[Opened]],
    ) -> Opened:
        """request_plus in one round trip instead of two: the slices are opened at their newest
        common snapshot while ``seqnos`` (the keyspace's high seqnos, asked after the scan arrived)
        are in flight. A snapshot whose TS covers them holds every write acknowledged before the
        scan - all the guarantee asks (scan-request flow step 9), whenever it was read - so it is
        kept. Otherwise (the index is behind) the reads are cancelled and the slices opened again
        the ordinary way, waiting for a snapshot covering them.

        ``seqnos`` holds what the owners outside ``ride.plan`` answered; those in it answer
        in their ``SlicesOpened`` (``ride.got``). Whatever is still missing - a reply
        without them, a partition that moved - is asked of its owner before the check."""
        try:
            ts, sources = await open_with(base, ride)
        except BaseException:
            seqnos.cancel()
            await asyncio.gather(seqnos, return_exceptions=True)
            raise
        try:
            known = await seqnos  # may be shared: not modified
            known = {**known, **ride.got} if ride.got else known
            got = await self.view.high_seqnos_wire(ride.keyspace, known=known)
            # BAD_REQUEST on a malformed TS: reads closed.
            hit = covers_seqnos(ts, got, ride.snapshot)
        except BaseException:
            await cancel_all(sources)
            raise
        if hit:
            self.counts["hit"] += 1
            return ts, sources
        self.counts["miss"] += 1
        self.missed[index_id] = asyncio.get_running_loop().time()
        await cancel_all(sources)
        wait_for = Timestamp.from_wire(got).to_wire()
        return await open_with(msgspec.structs.replace(base, wait_for=wait_for))
