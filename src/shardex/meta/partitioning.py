"""Which partition a document lives in, and how a partition is named on disk.

Kept free of storage imports because the client imports ``partition_of`` to route requests:
the client and every data node must compute the same slot for a docid, byte for byte.
"""

from __future__ import annotations

import re
import zlib

from shardex.errors import ErrorCode, ShardexError

DEFAULT_NUM_PARTITIONS = 64
MAX_PARTITIONS = 1024

_KEYSPACE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}")  # fullmatch: "$" passes "x\n"
_CF_PREFIX = "p/"


def partition_of(docid: str, num_partitions: int) -> int:
    """``crc32(docid as UTF-8) % num_partitions``: the slot (vbucket) that owns ``docid``."""
    return zlib.crc32(docid.encode("utf-8")) % num_partitions


def check_keyspace_name(name: object) -> str:
    """Keyspace names become part of column-family names, so they are kept to a safe alphabet
    (no ``/``, which separates the parts of a column-family name)."""
    if not isinstance(name, str) or not _KEYSPACE_NAME.fullmatch(name):
        raise ShardexError(
            f"invalid keyspace name {name!r}",
            code=ErrorCode.BAD_REQUEST,
            details={"keyspace": repr(name), "hint": "1-100 of A-Z a-z 0-9 _ . -, not first . -"},
        )
    return name


def check_num_partitions(num_partitions: object) -> int:
    if (
        isinstance(num_partitions, bool)
        or not isinstance(num_partitions, int)
        or not 1 <= num_partitions <= MAX_PARTITIONS
    ):
        raise ShardexError(
            f"num_partitions must be an integer in 1..{MAX_PARTITIONS}, got {num_partitions!r}",
            code=ErrorCode.BAD_REQUEST,
            details={"num_partitions": repr(num_partitions), "max": MAX_PARTITIONS},
        )
    return num_partitions


def partition_cf_name(keyspace: str, partition: int) -> str:
    """Column family holding one partition: ``p/<keyspace>/<partition>``."""
    return f"{_CF_PREFIX}{keyspace}/{partition}"


def parse_partition_cf_name(name: str) -> tuple[str, int] | None:
    """The (keyspace, partition) of a partition column family, or None for other families."""
    if not name.startswith(_CF_PREFIX):
        return None
    keyspace, sep, part = name[len(_CF_PREFIX) :].rpartition("/")
    if not sep or not part.isdigit():
        return None
    return keyspace, int(part)
