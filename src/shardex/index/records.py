"""On-disk layout of an index slice.

A slice (one index partition on one indexer node) is three column families of the node's
``Store``, so dropping or rebuilding a slice is dropping three families:

* ``ix/<index id>/<partition>/e`` entries: encoded entry (``key + 02 + docid``) -> ``b""``.
  Byte order is collation order, so a scan is a byte range.
* ``ix/<index id>/<partition>/b`` back index: docid (UTF-8) -> ``BackRow`` packed as
  ``partition (2 bytes) + seqno (8 bytes) + entry``; an empty entry is a tombstone that
  remembers the seqno of the removal.
* ``ix/<index id>/<partition>/m`` slice meta: ``m`` -> ``SliceMeta`` (msgpack), and the
  tombstone log ``t + partition (2) + seqno (8) + docid`` -> ``b""``, which lets
  ``purge_tombstones`` find removable tombstones by range instead of scanning the back index.

Everything a stabilise changes (entries, back rows, tombstone log, meta with the applied TS)
goes into one write batch, so the applied TS on disk always describes the entries on disk.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

import msgspec

from shardex.meta.index_definition import IndexDefinition

__all__ = [
    "META_KEY",
    "STATE_ACTIVE",
    "STATE_CREATED",
    "STATE_LOADING",
    "STATE_NEEDS_REBUILD",
    "BackRow",
    "SliceMeta",
    "cf_names",
    "decode_back",
    "decode_meta",
    "encode_back",
    "encode_meta",
    "pack_back_head",
    "parse_cf_name",
    "tombstone_log_key",
    "tombstone_log_range",
]

STATE_CREATED: Final = "created"  # allocated, empty; may be streamed into from seqno 0
STATE_LOADING: Final = "loading"  # initial build in progress (crash here => rebuild)
STATE_ACTIVE: Final = "active"  # applied TS is meaningful; stabilises and scans allowed
STATE_NEEDS_REBUILD: Final = "needs_rebuild"  # rolled back past its applied TS, or torn load

META_KEY: Final = b"m"
_TLOG: Final = b"t"
_BACK_HEAD: Final = struct.Struct(">HQ")
_TLOG_HEAD: Final = struct.Struct(">HQ")
_CF_PREFIX: Final = "ix/"


class BackRow(NamedTuple):
    partition: int
    seqno: int
    entry: bytes  # b"" = tombstone


# ``pack_back_head(partition, seqno)``: a back row without its entry (a tombstone); hot
# loops add the entry themselves instead of calling ``encode_back`` per row.
pack_back_head = _BACK_HEAD.pack


def encode_back(partition: int, seqno: int, entry: bytes) -> bytes:
    return _BACK_HEAD.pack(partition, seqno) + entry


def decode_back(value: bytes) -> BackRow:
    p, s = _BACK_HEAD.unpack_from(value)
    return BackRow(p, s, value[_BACK_HEAD.size :])


def tombstone_log_key(partition: int, seqno: int, docid: str) -> bytes:
    return _TLOG + _TLOG_HEAD.pack(partition, seqno) + docid.encode("utf-8")


def tombstone_log_range(partition: int, max_seqno: int) -> tuple[bytes, bytes]:
    """``[low, high)`` of the log keys of ``partition`` with seqno <= ``max_seqno``."""
    low = _TLOG + _TLOG_HEAD.pack(partition, 0)
    return low, _TLOG + _TLOG_HEAD.pack(partition, max_seqno + 1)


def parse_tombstone_log_key(key: bytes) -> tuple[int, int, str]:
    p, s = _TLOG_HEAD.unpack_from(key, 1)
    return p, s, key[1 + _TLOG_HEAD.size :].decode("utf-8")


class SliceMeta(msgspec.Struct, kw_only=True):
    """Durable state of a slice, rewritten in every stabilise batch.

    ``applied``: the applied TS in wire form (partition -> (seqno, uuid)); ``load_ts``: the
    initial build's T0 while loading; ``count``: live entries (``items_count``).
    """

    definition: IndexDefinition
    partition: int
    state: str = STATE_CREATED
    applied: dict[int, tuple[int, int]] = msgspec.field(default_factory=dict)
    load_ts: dict[int, tuple[int, int]] | None = None
    count: int = 0


_enc = msgspec.msgpack.Encoder()
encode_meta = _enc.encode
decode_meta = msgspec.msgpack.Decoder(SliceMeta).decode


def cf_names(index_id: str, partition: int) -> tuple[str, str, str]:
    """(entries, back index, meta) column-family names of a slice."""
    base = f"{_CF_PREFIX}{index_id}/{partition}/"
    return base + "e", base + "b", base + "m"


def parse_cf_name(name: str) -> tuple[str, int, str] | None:
    """(index id, partition, role) of a slice column family, or None for other families."""
    if not name.startswith(_CF_PREFIX):
        return None
    parts = name[len(_CF_PREFIX) :].split("/")
    if len(parts) != 3 or not parts[1].isdigit() or parts[2] not in ("e", "b", "m"):
        return None
    return parts[0], int(parts[1]), parts[2]
