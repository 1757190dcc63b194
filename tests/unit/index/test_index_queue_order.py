"""A slice's queue in and out of seqno order: stabilise takes exactly the versions up to
the TS and decides each docid by its newest one, whether the partition's queue was filled
in ascending order (the fast path: the last version wins) or not (seqnos compared)."""

from __future__ import annotations

import random

import pytest

from shardex.core.keycodec import encode_entry
from shardex.core.timestamp import Timestamp
from shardex.index import DELETE, UPSERT, IndexerEngine, make_definition

D = make_definition(id="ix", name="ix", keyspace="ks", keys=["k"])
U = 0xFEED
PARTS = 3


def ts(seqnos: dict[int, int]) -> Timestamp:
    return Timestamp({p: (s, U) for p, s in seqnos.items() if s > 0})


@pytest.fixture
def eng(tmp_path):
    e = IndexerEngine(tmp_path / "idx", sync=False)
    e.create_slice(D, 0)
    yield e
    e.close()


def _history(rng: random.Random, n: int) -> list[tuple]:
    """Key versions of ``n`` mutations over a few docids, seqnos ascending per partition
    (a docid lives in one data partition, as ``partition_of`` guarantees)."""
    seqno = dict.fromkeys(range(PARTS), 0)
    out = []
    for _ in range(n):
        d = rng.randrange(12)
        docid, part = f"d{d}", d % PARTS
        seqno[part] += 1
        if rng.random() < 0.2:
            out.append(("ix", 0, DELETE, b"", docid, part, seqno[part]))
        else:
            entry = encode_entry([rng.randrange(4)], docid)
            out.append(("ix", 0, UPSERT, entry, docid, part, seqno[part]))
    return out


def _expected(history: list[tuple], upto: dict[int, int]) -> list[bytes]:
    """The entries a slice holds at ``upto``: each docid's newest version at or below it."""
    newest: dict[str, tuple] = {}
    for row in history:
        if row[6] <= upto.get(row[5], 0):
            cur = newest.get(row[4])
            if cur is None or row[6] > cur[6]:
                newest[row[4]] = row
    return sorted(r[3] for r in newest.values() if r[2] == UPSERT)


@pytest.mark.parametrize("seed", range(12))
def test_any_delivery_order_and_ts_sequence_gives_the_model(eng, seed: int) -> None:
    rng = random.Random(seed)
    history = _history(rng, 120)
    upto = dict.fromkeys(range(PARTS), 0)
    top = {p: max((r[6] for r in history if r[5] == p), default=0) for p in range(PARTS)}
    pending = list(history)
    while any(upto[p] < top[p] for p in range(PARTS)):
        # a few frames: in order, shuffled (a late frame), or repeating delivered rows
        k = rng.randrange(1, 30)
        frame, pending = pending[:k], pending[k:]
        mode = rng.random()
        if mode < 0.3:
            rng.shuffle(frame)
        if mode > 0.7:
            frame += rng.sample(history, 5)  # re-deliveries, possibly not queued yet
        eng.enqueue(frame)
        delivered = history[: len(history) - len(pending)]
        for p in range(PARTS):  # a TS anywhere up to the highest seqno delivered so far
            seen = max((r[6] for r in delivered if r[5] == p), default=0)
            upto[p] = rng.randint(upto[p], max(seen, upto[p]))
        if not pending:
            upto = dict(top)
        eng.stabilise("ix", ts(upto))
        assert eng.entries("ix")[0] == _expected(history, upto), (seed, upto)
    assert eng.slice("ix", 0).queued() == 0


def test_a_partial_take_of_an_ordered_queue_leaves_the_rest(eng) -> None:
    rows = [("ix", 0, UPSERT, encode_entry([i], "a"), "a", 0, i) for i in range(1, 11)]
    eng.enqueue(rows)
    eng.stabilise("ix", ts({0: 4}))
    assert eng.entries("ix")[0] == [rows[3][3]]  # seqno 4 wins among 1..4
    assert eng.slice("ix", 0).queued() == 6
    eng.stabilise("ix", ts({0: 10}))
    assert eng.entries("ix")[0] == [rows[9][3]]


def test_an_out_of_order_queue_still_takes_the_newest(eng) -> None:
    rows = [("ix", 0, UPSERT, encode_entry([i], "a"), "a", 0, i) for i in (5, 9, 2, 7)]
    eng.enqueue(rows)
    eng.stabilise("ix", ts({0: 8}))  # takes 5, 2, 7: 7 wins; 9 stays queued
    assert eng.entries("ix")[0] == [rows[3][3]]
    assert eng.slice("ix", 0).queued() == 1
    eng.stabilise("ix", ts({0: 9}))
    assert eng.entries("ix")[0] == [rows[1][3]]
