"""Finding and deleting expired documents in one partition (the engine side of expiry).

A document's expiry is stored with it (``DocRecord.expiry``, absolute epoch seconds, see
``api/expiry.py``). Reads hide an expired document at once (``DocumentOps.get_raw``); these
two functions are what deletes it: ``find_expired`` walks a bounded stretch of the
partition's documents from a cursor, ``expire`` deletes what it found as one batch of normal
mutations (new seqnos, a tombstone and a change record each, marked ``FLAG_EXPIRED``), so
change streams, replicas and the index pipeline see the deletion like any other. The
expiry pager (``expiry_pager.py``) calls both on active copies, in the engine's threads.

Why an ``expire`` op carries the CAS seen: between the walk and the batch a client may have
rewritten or touched the document; the partition deletes only the version that was found
expired (``Partition._check``), under its lock, against the same clock.
"""

from __future__ import annotations

from shardex.api.records import MutationResult
from shardex.data.partition import Partition, PreparedOp
from shardex.data.records import PREFIX_DOC, decode_doc, next_prefix
from shardex.meta.node_defaults import DEFAULT_EXPIRY_PAGER_BATCH

# How many document records one walk may read: each costs a decode, so a pager tick stays
# a few milliseconds of a thread however large the partition.
DEFAULT_WALK_LIMIT = DEFAULT_EXPIRY_PAGER_BATCH


def find_expired(
    part: Partition, after: bytes | None, limit: int, now_ns: int
) -> tuple[list[tuple[str, int]], bytes | None, int]:
    """The (docid, cas) of expired live documents among at most ``limit`` document
    records after key ``after`` (None: from the first), the key to continue after (None:
    the walk reached the partition's end) and how many records it read."""
    lower = PREFIX_DOC if after is None else after + b"\x00"
    found: list[tuple[str, int]] = []
    seen = 0
    last: bytes | None = None
    for key, raw in part.cf.iterate(lower, next_prefix(PREFIX_DOC), chunk_size=min(limit, 1024)):
        seen += 1
        last = key
        rec = decode_doc(raw)
        if rec.expiry and not rec.deleted and rec.expiry * 1_000_000_000 <= now_ns:
            found.append((key[1:].decode("utf-8"), rec.cas))
        if seen >= limit:
            return found, last, seen
    return found, None, seen


def expire(part: Partition, items: list[tuple[str, int]], *, sync: bool) -> int:
    """Delete the documents ``items`` names ((docid, cas) found expired) as one batch on
    this active copy; how many were deleted (one rewritten or touched since is kept)."""
    if not items:
        return 0
    ops = [PreparedOp("expire", docid, b"", cas) for docid, cas in items]
    results = part.apply(ops, sync=sync)
    return sum(isinstance(r, MutationResult) for r in results)
