"""The TSs a scan's slices were read at, as the scan coordinator settles them.

Every indexer node answers ``ScanSlices`` with the stability TS it read (a 64-partition
timestamp is ~900 bytes on the wire; decoding one costs ~76k instructions, converting it into
a ``Timestamp`` ~30 us and comparing two ~5 us on this machine), and the coordinator's own
slices hand over theirs in-process. The coordinator keeps them encoded
(``Timestamp.packed``, canonical: equal TSs are equal bytes): in the common case they all
read one snapshot, which one bytes comparison per node settles, and the bytes go on into
``IndexScanStarted`` as they came. Only when they differ does ``oldest_packed`` decode the
distinct ones and pick, with ``oldest_common``, the TS to pin; ``covers_seqnos`` is a
request_plus scan's check of its snapshot against the keyspace's high seqnos.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import msgspec

from shardex.core.timestamp import Timestamp

__all__ = ["covers_seqnos", "oldest_common", "oldest_packed"]

_PACKER: Final = msgspec.msgpack.Encoder()


def oldest_common(tss: list[Timestamp]) -> Timestamp:
    """The TS every other one covers (the oldest of one history); without one (diverged
    branches), the one with the fewest seqnos: its snapshot errors tell the caller."""
    for t in tss:
        if all(o.covers(t) for o in tss):
            return t
    return min(tss, key=lambda t: sum(e.seqno for e in t.values()))


def oldest_packed(packed: list[bytes]) -> tuple[bytes, Timestamp]:
    """``oldest_common`` of encoded TSs (``Timestamp.packed``): its bytes - one of
    ``packed``, so the nodes that read it compare equal - and the ``Timestamp``. Each
    distinct TS is decoded once."""
    if not packed:
        raise ValueError("oldest_packed needs at least one TS")
    distinct = {b: Timestamp.from_packed(b) for b in dict.fromkeys(packed)}
    pin = oldest_common(list(distinct.values()))
    return next(b for b, t in distinct.items() if t is pin), pin


def covers_seqnos(
    packed: bytes | None, seqnos: Mapping[int, tuple[int, int]], snapshot: Timestamp | None = None
) -> bool:
    """Whether the encoded snapshot TS ``packed`` (None: the tips, no TS) covers the high
    seqnos ``seqnos`` (a wire dict in any order, ``ClusterView.high_seqnos_wire``).

    An index that caught up holds exactly the high seqnos. With ``snapshot``, the
    ``Timestamp`` whose ``packed()`` that is (the coordinator's own read), that is one
    C-level check that each entry of ``seqnos`` is one of the snapshot's (no sort, no
    encoding); otherwise the high seqnos are encoded in partition order and compared with
    the TS's own bytes, without decoding the TS (~76k instructions) or building a
    ``Timestamp`` (~30 us). Anything else decodes both for ``Timestamp.covers``."""
    if packed is None:
        return False
    if snapshot is not None and snapshot.packed() == packed:
        if snapshot.to_wire().items() >= seqnos.items():
            return True
    elif packed == _PACKER.encode({p: seqnos[p] for p in sorted(seqnos)}):
        return True
    return Timestamp.from_packed(packed).covers(Timestamp.from_wire(seqnos))
