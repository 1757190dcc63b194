"""The distributed plan's fragment kinds and size limits (shared by the planner, its
EXPLAIN and the key-lookup fast path)."""

from __future__ import annotations

__all__ = ["INLINE_KEYS", "LATE_MAX_ROWS", "LEAF_KIND", "ROOT_KIND"]

ROOT_KIND = "sql.root"
LEAF_KIND = "sql.leaf"
INLINE_KEYS = 64  # a key lookup naming at most this many ids runs without any fragment
# Late materialization up to this many rows (offset + limit): the root holds every leaf's
# candidates (leaves x this many sort keys and docids) and projects on its loop.
LATE_MAX_ROWS = 256
