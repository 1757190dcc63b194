"""``Prepared.decide_sorted``, the stabilise's per-docid loop with ``decide``'s rule inlined,
must build exactly the lists that ``extend(map(decide, ...))`` builds, on every kind of row
against every kind of back row (absent, older, as new, newer, tombstone, same entry), in one
run or several (runs of docids that interleave make ``seal`` sort the back rows)."""

from __future__ import annotations

import random

import pytest

from shardex.core.keycodec import encode_entry
from shardex.index import DELETE, UPSERT, UPSERT_DELETION
from shardex.index.records import encode_back
from shardex.index.slice_decisions import Decided, Prepared, decide

FIELDS = (
    "entry_deletes",
    "entry_puts",
    "tombstone_puts",
    "back_keys",
    "back_values",
    "live_delta",
    "unchanged",
    "stale",
)


def _case(rng: random.Random, i: int) -> tuple[tuple, bytes, bytes | None]:
    docid = f"d{i:04d}"
    part, seqno = rng.randrange(4), rng.randrange(2, 50)
    key = rng.randrange(4)
    kind = rng.choice([UPSERT, UPSERT, UPSERT_DELETION, DELETE])
    entry = encode_entry([key], docid) if kind == UPSERT else b""
    row = ("ix", 0, kind, entry, docid, part, seqno)
    back = rng.choice(["none", "older", "same_seqno", "newer", "tombstone", "same_entry"])
    held = encode_entry([rng.randrange(4)], docid)
    raw: bytes | None
    if back == "none":
        raw = None
    elif back == "older":
        raw = encode_back(part, seqno - 1, held)
    elif back == "same_seqno":
        raw = encode_back(part, seqno, held)
    elif back == "newer":
        raw = encode_back(part, seqno + 1, held)
    elif back == "tombstone":
        raw = encode_back(part, seqno - 1, b"")
    else:
        raw = encode_back(part, seqno - 1, entry or held)
    return row, docid.encode(), raw


def _state(p: Prepared) -> tuple:
    p.seal()
    return tuple(getattr(p, f) for f in FIELDS)


@pytest.mark.parametrize("seed", range(20))
def test_decide_sorted_equals_extend_of_decide(seed: int) -> None:
    rng = random.Random(seed)
    cases = [_case(rng, i) for i in range(rng.randrange(1, 200))]
    rows, keys, raws = (list(c) for c in zip(*cases, strict=True))
    gathered = Prepared()
    gathered.extend(map(decide, rows, keys, raws))
    fused = Prepared()
    # Two runs whose docids interleave (odd then even positions): seal must sort the back
    # rows of the second run in among the first's.
    fused.decide_sorted(rows[1::2], keys[1::2], raws[1::2])
    fused.decide_sorted(rows[::2], keys[::2], raws[::2])
    assert not fused.back_sorted
    assert _state(fused) == _state(gathered)
    one = Prepared()
    one.decide_sorted(rows, keys, raws)
    assert one.back_sorted  # one run in docid order: nothing to sort
    assert _state(one) == _state(gathered)


def test_a_replacement_decides_every_docid_again_from_rows_and_back_rows() -> None:
    """``Decided`` keeps no ``Outcome`` while its lists are prepared; a replacement rebuilds
    every docid's from the kept rows and back rows, equal to deciding each directly."""

    class Back:
        def __init__(self, rows: dict[bytes, bytes]) -> None:
            self.rows = rows

        def get_many(self, keys: list[bytes]) -> list[bytes | None]:
            return [self.rows.get(k) for k in keys]

    rng = random.Random(7)
    cases = [_case(rng, i) for i in range(60)]
    back = Back({k: raw for _, k, raw in cases if raw is not None})
    d = Decided()
    d.add([row for row, _, _ in cases], back, ordered=False)  # type: ignore[arg-type]
    assert d.prepared is not None and d.outcomes == {}
    row = cases[3][0]
    newer = (*row[:6], row[6] + 100)
    d.add([newer], back, ordered=True)  # type: ignore[arg-type]
    assert d.prepared is None
    want = {r[4]: decide(r, k, raw) for r, k, raw in cases}
    want[row[4]] = decide(newer, cases[3][1], cases[3][2])
    assert d.outcomes == want
