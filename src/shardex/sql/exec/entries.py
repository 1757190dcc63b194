"""Index entries to scope rows on a leaf, decoding each distinct key once.

A leaf reads a slice's entries in entry order, so runs of entries share one key and differ
only in the docid (``GROUP BY city`` over an index on (city, age): a million entries, a few
thousand keys). An entry that starts with the previous entry's key bytes followed by the
docid marker has the same key parts (the encoding is prefix-free), so only the docid is
decoded, and a covering scan reuses the document it rebuilt for that key (rows never mutate
the documents they carry). The docid is not decoded at all when the query never reads
``META()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardex.core.expr.analysis import Path, static_path
from shardex.core.keycodec import decode_entry_key
from shardex.core.keycodec_values import TAG_DOCID, dec_str
from shardex.core.values import MISSING
from shardex.sql.planner.choose import covered_document
from shardex.sql.syntax.bind import META_KEY, BoundSelect

__all__ = ["DOCID_PICK", "EntryDecoder", "key_projection"]

DOCID_PICK = -1  # a projection term that reads META().id

_NO_META: dict[str, Any] = {}


class EntryDecoder:
    def __init__(self, desc: Sequence[bool], key_paths: Sequence[Path | None]) -> None:
        self.desc = list(desc) if any(desc) else None
        self.key_paths = list(key_paths)
        self._key = b""  # the last key's bytes (up to, not including, the docid marker)
        self._parts: list[Any] = []
        self._doc: dict[str, Any] | None = None
        self.decoded_keys = 0  # how many keys were decoded (the rest were reused)

    def _key_of(self, entry: bytes) -> int:
        """Make ``entry``'s key the current one; returns the docid marker's offset."""
        n = len(self._key)
        if n and entry.startswith(self._key) and len(entry) > n and entry[n] == TAG_DOCID:
            return n
        self._parts, n = decode_entry_key(entry, self.desc)
        self._key = entry[:n]
        self._doc = None
        self.decoded_keys += 1
        return n

    def docids(self, entries: Sequence[bytes]) -> list[str]:
        out = []
        for e in entries:
            pos = self._key_of(e)
            out.append(dec_str(e, pos + 1)[0])
        return out

    def covered_rows(self, entries: Sequence[bytes], alias: str, meta: bool) -> list[Any]:
        """Scope rows rebuilt from the keys (covering scans); ``META().id`` only if ``meta``.
        Without it the entries of one key share one row object (nothing mutates a scope
        row): a GROUP BY's leaf takes such a run as one row (``fragment_rows.runs``)."""
        out = []
        row: dict[str, Any] | None = None
        for e in entries:
            pos = self._key_of(e)
            doc = self._doc
            if doc is None:
                doc = self._doc = covered_document(self.key_paths, self._parts)
            if meta:
                out.append({alias: doc, META_KEY: {"id": dec_str(e, pos + 1)[0]}})
                continue
            if row is None or row[alias] is not doc:
                row = {alias: doc, META_KEY: _NO_META}
            out.append(row)
        return out

    def projected(self, entries: Sequence[bytes], picks: Sequence[tuple[str, int]]) -> list[Any]:
        """Result values straight from the keys (``key_projection``'s ``picks``): what
        ``covered_rows`` and the projection would make, without the scope rows."""
        out = []
        meta = any(i == DOCID_PICK for _, i in picks)
        for e in entries:
            pos = self._key_of(e)
            parts = self._parts
            docid = dec_str(e, pos + 1)[0] if meta else None
            value: dict[str, Any] = {}
            for name, i in picks:
                v = docid if i == DOCID_PICK else parts[i]
                if v is not MISSING:
                    value[name] = v
            out.append(value)
        return out


def key_projection(
    b: BoundSelect, key_paths: Sequence[Path | None]
) -> list[tuple[str, int]] | None:
    """(name, key part or ``DOCID_PICK``) per result term when every term reads exactly one
    key part or ``META().id`` of a covering scan, so a leaf can make its result values from
    the keys; else None. Key paths where one is a prefix of another (``a`` and ``a.b``), or
    with array steps, rebuild documents that are not the parts: those keep the scope rows."""
    if b.raw or b.distinct or b.lets:
        return None
    paths = [p for p in key_paths if p is not None]
    for p in paths:
        if any(not isinstance(step, str) for step in p):
            return None
        if any(q != p and q[: len(p)] == p for q in paths):
            return None
    picks: list[tuple[str, int]] = []
    for t in b.terms:
        path = None if t.star or t.expr is None or t.name is None else static_path(t.expr)
        if path == (META_KEY, "id"):
            picks.append((t.name, DOCID_PICK))  # type: ignore[arg-type]
            continue
        if path is None or path[0] != b.alias or path[1:] not in paths:
            return None
        picks.append((t.name, list(key_paths).index(path[1:])))  # type: ignore[arg-type]
    return picks
