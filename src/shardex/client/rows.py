"""Index entries to scan rows, a block at a time (``ScanResult``'s rows).

A row is ``{"docid": str, "key": [parts]}`` (``key`` decoded with the index's DESC flags;
without ``covering`` only the docid), each row with its own key list. An entry is
``key + 02 + docid`` (``shardex.core.keycodec``).

Why a module of its own, and why it looks like this: the bench's clients share two cores with
the nodes, so the calling thread's CPU per row is taken from the nodes. What costs
in CPython is bytecode per row, not C work per byte, so a block is decoded with as few
bytecode steps per row as the shape of its keys allows, the rest being C calls over the whole
block (``b"".join``, ``split``, one ``decode``, ``map`` over C callables):

* **Keys of ASC strings** (an email index: every key distinct). A string is ``50 body 00
  01`` and the docid ``02 body 00 01``, where a body holds ``00`` only as the escape ``00
  FF`` and never ``FF`` otherwise (not UTF-8). So a block with no ``FF`` is joined (with
  ``01`` between entries), decoded and split at ``00 01`` in one call each; the first
  character of every piece must then be the tag its place wants (a part of another type
  would show its own tag there), and the pieces without it are the strings.
* **Other keys** (numbers, DESC parts, arrays): entries come in key order, so runs share one
  key (a (city, age) range: ~100 rows, ~10 keys). A run's key is decoded once (strings,
  small ints, null and booleans in one loop, anything else by the codec), the run's end is
  found by bisection (the entries that start with ``key + 02`` are exactly those in ``[key +
  02, key + 03)``, checked by the run's min and max, so an unordered block is safe) and its
  docids come out of one join, one replace, one decode and one split.
* Anything those checks refuse (escaped NULs) takes the same steps one entry at a time. All
  paths agree with the codec's own ``decode_entry``
  (``tests/unit/client/test_scan_client_rows.py``).

Instructions per row on 30 of the bench's blocks per case (``perf stat``), before -> after:
(city, age) range 9.6k -> ~6.5k, limit 100 8.5k -> ~5.3k, email 17k -> 5.7k; building each
row's dict and key list is ~1.8k of what is left.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from operator import itemgetter
from typing import Any, Final

from shardex.core.gcpause import gc_paused
from shardex.core.keycodec import decode_entry_key
from shardex.core.keycodec_values import (
    SMALL_INTS,
    STR_TERM,
    TAG_DOCID,
    TAG_FALSE,
    TAG_NULL,
    TAG_STR,
    TAG_TRUE,
    TAG_ZERO,
    dec_str,
)

__all__ = ["EntryRows", "Row", "string_entry"]

Row = dict[str, Any]

# Blocks of at least this many entries build their rows with the collector paused; a
# smaller one sets off at most one young collection (its threshold is 700 allocations).
GC_PAUSE_ROWS: Final = 350

_DOCID: Final = bytes((TAG_DOCID,))
_STR: Final = bytes((TAG_STR,))
_AFTER_DOCID: Final = bytes((TAG_DOCID + 1,))
_TEXT_TERM: Final = STR_TERM.decode()
_TEXT_STR: Final = _STR.decode()
_TEXT_DOCID: Final = _DOCID.decode()
_small_int = SMALL_INTS.get
_ONE_BYTE: Final[dict[int, Any]] = {TAG_NULL: None, TAG_FALSE: False, TAG_TRUE: True, TAG_ZERO: 0}
_first = itemgetter(0)
_tail = itemgetter(slice(1, None))


class EntryRows:
    """The rows of one scan's entries, block by block (a key run may cross blocks)."""

    def __init__(self, desc: Sequence[bool], covering: bool) -> None:
        self.desc = list(desc) if any(desc) else None
        self.covering = covering
        self.arity = len(desc)
        # The tags of an entry whose key is ASC strings, as text; the tags a block of n such
        # entries shows, by n.
        self._tags = None if self.desc is not None else _TEXT_STR * self.arity + _TEXT_DOCID
        self._expected: dict[int, str] = {}
        self._strings = self._tags is not None  # worth trying the block split first
        self._split_keys = self._tags is not None  # worth trying ``string_entry`` on a key
        self._marked = b""  # the previous entry's key bytes and the docid marker
        self._parts: list[Any] = []

    def of(self, block: list[bytes]) -> list[Row]:
        """The block's rows (a list: a generator's frame switch per row costs a good part of
        a row). A large block's are built with the cyclic collector paused: its rows all
        stay alive until the block is done, so each young collection they set off would walk
        and promote every one of them (``core.gcpause``)."""
        if len(block) < GC_PAUSE_ROWS:
            return self._rows(block) if block else []
        with gc_paused():
            return self._rows(block)

    def _rows(self, block: list[bytes]) -> list[Row]:
        if self._strings:
            rows = self._string_block(block)
            if rows is not None:
                self._marked = b""
                return rows
            # Not such keys (or an escape): the block split is not tried again in this scan.
            self._strings = False
        return self._runs(block)

    def _string_block(self, block: list[bytes]) -> list[Row] | None:
        """Rows of a block whose keys are all ASC strings and which holds no escaped NUL,
        else None (nothing decoded that the checks have not proved)."""
        tags = self._tags
        assert tags is not None
        n = len(block)
        width = len(tags)  # pieces per entry: its key's strings and its docid
        # Entries joined with 01, which in one entry never follows a terminator (a tag or
        # nothing does): so the pieces that start with it are the entries' first pieces.
        joined = b"\x01".join(block)
        if b"\xff" in joined:  # an escaped NUL: 00 would not only end strings
            return None
        try:
            text = joined.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return None  # the per-entry path names the bad entry
        pieces = text.split(_TEXT_TERM)
        if len(pieces) != n * width + 1 or pieces.pop():
            return None
        try:
            seen = "".join(map(_first, pieces))  # an empty piece: IndexError
        except IndexError:
            return None
        # After each terminator comes the tag its place in its entry wants: the strings'
        # tags, the docid marker, then 01 and the next entry's first tag. A part of another
        # type would show its own tag at the start of a piece: so only keys of ``arity`` ASC
        # strings pass.
        expected = self._expected.get(n)
        if expected is None:
            expected = self._expected[n] = tags + ("\x01" + tags[1:]) * (n - 1)
        if seen != expected or text.count(_TEXT_TERM + "\x01" + tags[0]) != n - 1:
            return None
        # Each piece without its tag (a C-level map); an entry's first piece also without
        # the 01 before it.
        bodies = list(map(_tail, pieces))
        bodies[width::width] = map(_tail, bodies[width::width])
        arity = width - 1
        docids = bodies[arity::width]
        if not self.covering:
            return [{"docid": d} for d in docids]
        if arity == 1:
            keys = bodies[0::width]
            return [{"docid": d, "key": [k]} for k, d in zip(keys, docids, strict=True)]
        return [
            {"docid": d, "key": bodies[i : i + arity]}
            for i, d in zip(range(0, n * width, width), docids, strict=True)
        ]

    def _runs(self, block: list[bytes]) -> list[Row]:
        """Rows of any block, a run of entries sharing one key at a time."""
        desc = self.desc
        covering = self.covering
        marked, parts = self._marked, self._parts
        out: list[Row] = []
        n = len(block)
        i = 0
        while i < n:
            entry = block[i]
            if not (marked and entry.startswith(marked)):
                split = string_entry(entry) if self._split_keys else None
                if split is not None:
                    parts, _, k = split
                else:
                    # Keys of one index mostly share their types: once a key is not all
                    # strings, the split is not tried again in this scan.
                    self._split_keys = False
                    key = _plain_key(entry) if desc is None else None
                    parts, k = key if key is not None else decode_entry_key(entry, desc)
                marked = entry[: k + 1]
            start = len(marked)
            j = i + 1
            if j < n and block[j].startswith(marked):
                # Sorted entries: the run is every entry in [key + 02, key + 03); where the
                # block is not sorted there (``ordered=False`` concatenates slices) the check
                # fails and the run is the two entries known to share the key.
                bound = marked[:-1] + _AFTER_DOCID
                j = bisect_left(block, bound, j + 1)
                # Whatever the order, entries between ``marked`` and ``bound`` start with
                # ``marked``: two C-level scans of the run check it.
                run = block[i:j]
                if min(run) < marked or max(run) >= bound:
                    j = i + 2
            docids = [_docid(entry, start)] if j == i + 1 else _docids(block[i:j], marked)
            if covering:
                out += [{"docid": d, "key": parts[:]} for d in docids]
            else:
                out += [{"docid": d} for d in docids]
            i = j
        self._marked, self._parts = marked, parts
        return out


def _plain_key(entry: bytes) -> tuple[list[Any], int] | None:
    """(key parts, offset of the docid marker) of an entry whose key is ASC strings without
    NUL, small ints, null and booleans (a (city, age) key), else None: ``decode_entry_key``
    in one loop, no call per part (a scan meets a new key every few rows)."""
    parts: list[Any] = []
    pos = 0
    try:
        while True:
            tag = entry[pos]
            if tag == TAG_STR:
                end = entry.index(STR_TERM, pos)
                body = entry[pos + 1 : end]
                if b"\x00" in body:
                    return None  # an escape
                parts.append(body.decode("utf-8", "surrogatepass"))
                pos = end + 2
            elif tag == TAG_DOCID:
                return parts, pos
            elif tag in _ONE_BYTE:
                parts.append(_ONE_BYTE[tag])
                pos += 1
            else:
                # A small int's 4 or 5 bytes (prefix-free: a whole encoding is the value);
                # other numbers and other types: the codec.
                value = _small_int(entry[pos : pos + 4])
                if value is not None:
                    pos += 4
                else:
                    value = _small_int(entry[pos : pos + 5])
                    if value is None:
                        return None
                    pos += 5
                parts.append(value)
    except (IndexError, ValueError):  # malformed: the codec's path names it
        return None


def _docid(entry: bytes, start: int) -> str:
    """The docid of an entry whose body starts at ``start`` and runs to its final ``00 01``."""
    body = entry[start:-2]
    if b"\x00" in body:  # an escaped 00 (00 FF is not UTF-8): the codec's path
        return str(dec_str(entry, start)[0])
    return body.decode("utf-8", "surrogatepass")


def _docids(run: list[bytes], marked: bytes) -> list[str]:
    """The docids of a run of entries that all start with ``marked`` (a key and the docid
    marker). Joined, each docid body is followed by its terminator and the next entry's
    ``marked``; a body holds no terminator (00 only escaped, as 00 FF), so those are the
    only places where the pair occurs: one replace marks them with a 00, and when no other
    00 is left (no escapes), one decode and one split give every docid."""
    blob = b"".join(run)[len(marked) : -2].replace(STR_TERM + marked, b"\x00")
    if blob.count(b"\x00") == len(run) - 1:
        return blob.decode("utf-8", "surrogatepass").split("\x00")
    return [_docid(e, len(marked)) for e in run]


def string_entry(entry: bytes) -> tuple[list[Any], str, int] | None:
    """(key parts, docid, offset of the docid marker) of an entry whose key parts are all
    ASC strings, else None. A string is ``50 body 00 01`` and the docid ``02 body 00 01``,
    where a body holds 00 only as the escape ``00 FF``: so ``00 01`` occurs exactly at the
    ends, and splitting on it gives every part when each piece but the last two starts with
    the string tag, the next-to-last with the docid marker and the last is empty. Anything
    else (numbers, whose bytes may hold ``00 01``; arrays; MISSING) takes the general path."""
    pieces = entry.split(STR_TERM)
    if len(pieces) < 3 or pieces[-1] or pieces[-2][:1] != _DOCID:
        return None
    parts: list[Any] = []
    n = 0
    # Each piece decoded inline, not in a helper: a key met once costs one call.
    for piece in pieces[:-2]:
        if piece[:1] != _STR:
            return None
        body = piece[1:]
        if b"\x00" in body:
            body = body.replace(b"\x00\xff", b"\x00")
        parts.append(body.decode("utf-8", "surrogatepass"))
        n += len(piece) + 2
    body = pieces[-2][1:]
    if b"\x00" in body:
        body = body.replace(b"\x00\xff", b"\x00")
    return parts, body.decode("utf-8", "surrogatepass"), n
