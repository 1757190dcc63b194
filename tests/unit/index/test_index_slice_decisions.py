"""Decisions taken as key versions arrive (``index/slice_decisions.py``): a stabilise that uses them
writes exactly what deciding from storage at the stabilise writes, whatever the order of
deliveries, cuts inside the queue, drops, purges and reloads; and a stabilise of the whole
queue reads no back row."""

from __future__ import annotations

import random

import pytest

from shardex.core.keycodec import encode_entry
from shardex.core.timestamp import Timestamp
from shardex.index import DELETE, UPSERT, UPSERT_DELETION, IndexerEngine, make_definition
from shardex.index.slice import Slice

D = make_definition(id="ix", name="ix", keyspace="ks", keys=["k"])
U = 0xFEED
PARTS = 3


def ts(seqnos: dict[int, int]) -> Timestamp:
    return Timestamp({p: (s, U) for p, s in seqnos.items() if s > 0})


class _FromStorage:
    """A slice that never decides ahead: every stabilise decides from storage (the path
    before ``slice_decisions.py``, kept for cuts inside the queue)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, eng: IndexerEngine) -> None:
        sl = eng.slice("ix", 0)
        sl._decided = None
        # A reset keeps it off: this instance only.
        monkeypatch.setattr(sl, "_reset_decided", lambda: None)


def _history(rng: random.Random, n: int) -> list[tuple]:
    seqno = dict.fromkeys(range(PARTS), 0)
    out = []
    for _ in range(n):
        d = rng.randrange(15)
        docid, part = f"d{d}", d % PARTS
        seqno[part] += 1
        r = rng.random()
        if r < 0.15:
            out.append(("ix", 0, DELETE, b"", docid, part, seqno[part]))
        elif r < 0.3:
            out.append(("ix", 0, UPSERT_DELETION, b"", docid, part, seqno[part]))
        else:
            entry = encode_entry([rng.randrange(3)], docid)  # often unchanged
            out.append(("ix", 0, UPSERT, entry, docid, part, seqno[part]))
    return out


@pytest.fixture
def pair(tmp_path, monkeypatch):
    ahead = IndexerEngine(tmp_path / "ahead", sync=False)
    plain = IndexerEngine(tmp_path / "plain", sync=False)
    for e in (ahead, plain):
        e.create_slice(D, 0)
    _FromStorage(monkeypatch, plain)
    yield ahead, plain
    ahead.close()
    plain.close()


def _same(ahead: IndexerEngine, plain: IndexerEngine, why: object) -> None:
    a, p = ahead.slice("ix", 0), plain.slice("ix", 0)
    assert a.entries() == p.entries(), why
    assert a.back_rows() == p.back_rows(), why
    assert a.items_count == p.items_count, why
    assert (a.stats.writes, a.stats.unchanged, a.stats.stale) == (
        p.stats.writes,
        p.stats.unchanged,
        p.stats.stale,
    ), why


@pytest.mark.parametrize("seed", range(16))
def test_deciding_ahead_writes_what_deciding_at_the_stabilise_writes(pair, seed: int) -> None:
    ahead, plain = pair
    rng = random.Random(seed)
    history = _history(rng, 200)
    upto = dict.fromkeys(range(PARTS), 0)
    pending = list(history)
    step = 0
    while pending:
        step += 1
        k = rng.randrange(1, 25)
        frame, pending = pending[:k], pending[k:]
        mode = rng.random()
        if mode < 0.25:
            rng.shuffle(frame)  # a late frame
        elif mode > 0.8:
            frame += rng.sample(history, 6)  # re-deliveries, some not queued yet
        early = rng.random() < 0.7  # an early delivery, or rows that come with the stabilise
        for e in (ahead, plain):
            e.enqueue(frame, ahead=early)
        if rng.random() < 0.5:  # the indexer decides after its reply; else the stabilise does
            ahead.decide_pending()
        delivered = history[: len(history) - len(pending)]
        act = rng.random()
        if act < 0.1:  # the pipeline's fallback: drop what was queued above some seqno
            p = rng.randrange(PARTS)
            for e in (ahead, plain):
                e.slice("ix", 0).drop_queued_above(p, upto[p])
            continue
        if act < 0.15:
            for e in (ahead, plain):
                e.purge_tombstones("ix", ts(upto))
        # Either the whole queue (the decided path) or a cut inside it (from storage).
        for p in range(PARTS):
            seen = max((r[6] for r in delivered if r[5] == p), default=0)
            upto[p] = seen if rng.random() < 0.6 else rng.randint(upto[p], max(seen, upto[p]))
        if not any(upto.values()):
            continue
        for e in (ahead, plain):
            e.stabilise("ix", ts(upto))
        _same(ahead, plain, (seed, step, dict(upto)))
    top = {p: max((r[6] for r in history if r[5] == p), default=0) for p in range(PARTS)}
    for e in (ahead, plain):
        e.enqueue(history)  # whatever a drop left out
        e.stabilise("ix", ts(top))
    _same(ahead, plain, (seed, "end"))
    assert ahead.slice("ix", 0).queued() == 0


def test_a_stabilise_of_the_whole_queue_reads_no_back_row(tmp_path, monkeypatch) -> None:
    eng = IndexerEngine(tmp_path / "idx", sync=False)
    try:
        eng.create_slice(D, 0)
        old = [("ix", 0, UPSERT, encode_entry([1], f"d{i}"), f"d{i}", 0, i + 1) for i in range(5)]
        eng.enqueue(old)
        eng.stabilise("ix", ts({0: 5}))
        new = [("ix", 0, UPSERT, encode_entry([2], f"d{i}"), f"d{i}", 0, i + 6) for i in range(5)]
        eng.enqueue(new)
        assert eng.decide_pending() == 5  # what the indexer runs after its reply: reads now
        reads: list[int] = []
        sl = eng.slice("ix", 0)
        real = sl._back.get_many
        monkeypatch.setattr(
            sl._back, "get_many", lambda keys: reads.append(len(keys)) or real(keys)
        )
        eng.stabilise("ix", ts({0: 10}))
        assert reads == []
        assert eng.entries("ix")[0] == sorted(r[3] for r in new)
        # A cut inside the queue decides from storage (and decides the rest again).
        eng.enqueue([("ix", 0, UPSERT, encode_entry([3], "d0"), "d0", 0, s) for s in (11, 12)])
        eng.stabilise("ix", ts({0: 11}))
        assert reads
        assert encode_entry([3], "d0") in eng.entries("ix")[0]
    finally:
        eng.close()


def test_a_commit_decides_the_remaining_versions_against_the_new_storage(tmp_path) -> None:
    """After a cut, what stays queued was decided against the storage before the commit:
    it must be decided again (an Upsert of the key the commit just wrote is unchanged)."""
    eng = IndexerEngine(tmp_path / "idx", sync=False)
    try:
        eng.create_slice(D, 0)
        e1 = encode_entry([1], "a")
        eng.enqueue([("ix", 0, UPSERT, e1, "a", 0, 1), ("ix", 0, UPSERT, e1, "a", 0, 2)])
        eng.stabilise("ix", ts({0: 1}))  # cut: seqno 2 stays queued
        sl: Slice = eng.slice("ix", 0)
        before = sl.stats.writes
        eng.stabilise("ix", ts({0: 2}))
        assert sl.stats.writes == before and sl.stats.unchanged == 1  # not a new entry
        assert sl.items_count == 1 and eng.entries("ix")[0] == [e1]
    finally:
        eng.close()


def test_a_load_decides_the_versions_queued_meanwhile_against_the_loaded_rows(
    tmp_path,
) -> None:
    eng = IndexerEngine(tmp_path / "idx", sync=False)
    try:
        eng.create_slice(D, 0)
        sl: Slice = eng.slice("ix", 0)
        e1, e2 = encode_entry([1], "a"), encode_entry([2], "a")
        sl.begin_load(ts({0: 3}))
        eng.enqueue([("ix", 0, UPSERT, e2, "a", 0, 4)])  # queued while loading: undecided
        assert sl._decided is None
        sl.bulk_load([("ix", 0, UPSERT, e1, "a", 0, 3)], ts({0: 3}))
        eng.stabilise("ix", ts({0: 4}))
        assert eng.entries("ix")[0] == [e2] and sl.items_count == 1
    finally:
        eng.close()


def test_rows_that_come_with_their_stabilise_are_decided_by_it(tmp_path) -> None:
    """Into an empty queue they stay undecided (the stabilise decides from storage); into a
    queue of decided rows they are decided too, so the decisions still cover the queue."""
    eng = IndexerEngine(tmp_path / "idx", sync=False)
    try:
        eng.create_slice(D, 0)
        sl: Slice = eng.slice("ix", 0)
        e1, e2 = encode_entry([1], "a"), encode_entry([2], "b")
        eng.enqueue([("ix", 0, UPSERT, e1, "a", 0, 1)], ahead=False)
        assert sl._decided is None
        eng.stabilise("ix", ts({0: 1}))
        assert sl._decided is not None and len(sl._decided) == 0
        eng.enqueue([("ix", 0, UPSERT, e2, "b", 0, 2)])  # early
        assert sl._decided is not None and len(sl._decided) == 0  # not yet: after the reply
        eng.decide_pending()
        eng.enqueue([("ix", 0, DELETE, b"", "a", 0, 3)], ahead=False)
        sl.decide_pending()
        assert sl._decided is not None and set(sl._decided.rows) == {"a", "b"}
        eng.stabilise("ix", ts({0: 3}))
        assert eng.entries("ix")[0] == [e2] and sl.items_count == 1
    finally:
        eng.close()
