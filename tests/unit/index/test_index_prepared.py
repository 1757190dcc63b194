"""The write batch prepared as decisions are taken (``slice_decisions.Prepared``): a stabilise
of the whole queue hands the prepared, sorted lists to its batch without gathering the decisions
again, and a replaced decision (a newer version of a docid decided before) falls back to
gathering them. What either path writes is checked against deciding from storage by
``test_index_slice_decisions.py``'s random workloads."""

from __future__ import annotations

import pytest

from shardex.core.keycodec import encode_entry
from shardex.core.timestamp import Timestamp
from shardex.index import DELETE, UPSERT, IndexerEngine, make_definition, slice_decisions
from shardex.index.slice import Slice
from shardex.index.slice_decisions import Prepared, decide

D = make_definition(id="ix", name="ix", keyspace="ks", keys=["k"])
U = 0xFEED


def ts(seqnos: dict[int, int]) -> Timestamp:
    return Timestamp({p: (s, U) for p, s in seqnos.items() if s > 0})


def _up(docid: str, key: int, seqno: int) -> tuple:
    return ("ix", 0, UPSERT, encode_entry([key], docid), docid, 0, seqno)


@pytest.fixture
def eng(tmp_path):
    e = IndexerEngine(tmp_path / "idx", sync=False)
    e.create_slice(D, 0)
    yield e
    e.close()


def _count_gathers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count calls of the gathering builder (``slice_decisions.write``) made by
    ``Decided.write``."""
    calls: list[int] = []
    real = slice_decisions.write

    def counted(*args, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(slice_decisions, "write", counted)
    return calls


def test_a_whole_queue_stabilise_writes_the_prepared_lists(eng, monkeypatch) -> None:
    eng.enqueue([_up("b", 5, 1), _up("a", 1, 2)])
    eng.stabilise("ix", ts({0: 2}))
    # Two early deliveries, each decided after its reply (new docids, a key change, a
    # delete): the prepared lists cover both and are sorted when sealed.
    eng.enqueue([_up("d", 3, 3), _up("a", 9, 4)])
    eng.decide_pending()
    eng.enqueue([_up("c", 0, 5), ("ix", 0, DELETE, b"", "b", 0, 6)])
    eng.decide_pending()
    sl: Slice = eng.slice("ix", 0)
    prep = sl._decided.prepared
    assert prep is not None and prep.sealed
    assert prep.entry_puts == sorted(prep.entry_puts) and prep.back_keys == [b"a", b"b", b"c", b"d"]
    gathers = _count_gathers(monkeypatch)
    eng.stabilise("ix", ts({0: 6}))
    assert gathers == []  # no decision gathered on the round's path
    want = sorted([encode_entry([9], "a"), encode_entry([0], "c"), encode_entry([3], "d")])
    assert eng.entries("ix")[0] == want
    assert sl.items_count == 3
    assert sl.back_rows()["b"] == (0, 6, b"")  # the delete's tombstone


def test_a_replaced_decision_falls_back_to_gathering(eng, monkeypatch) -> None:
    eng.enqueue([_up("a", 1, 1)])
    eng.decide_pending()
    eng.enqueue([_up("a", 2, 2)])  # a newer version of a decided docid
    eng.decide_pending()
    sl: Slice = eng.slice("ix", 0)
    assert sl._decided.prepared is None
    gathers = _count_gathers(monkeypatch)
    eng.stabilise("ix", ts({0: 2}))
    assert gathers == [1]
    assert eng.entries("ix")[0] == [encode_entry([2], "a")]
    # The commit starts a new, prepared set of decisions.
    assert sl._decided is not None and sl._decided.prepared is not None


def test_an_older_redelivery_keeps_the_prepared_lists(eng) -> None:
    eng.enqueue([_up("a", 1, 1), _up("a", 2, 2)])  # one frame: the newest decided once
    eng.decide_pending()
    eng.enqueue([_up("a", 7, 1)])  # already queued: dropped, nothing replaced
    eng.decide_pending()
    assert eng.slice("ix", 0)._decided.prepared is not None
    eng.stabilise("ix", ts({0: 2}))
    assert eng.entries("ix")[0] == [encode_entry([2], "a")]


def test_sealing_between_extends_gives_the_lists_of_one_gather() -> None:
    rows = [_up(f"d{i:02d}", (i * 7) % 5, i + 1) for i in range(40)]
    outcomes = [decide(r, r[4].encode(), None) for r in rows]
    once, twice = Prepared(), Prepared()
    once.extend(outcomes)
    once.seal()
    twice.extend(outcomes[::2])
    twice.seal()
    twice.extend(outcomes[1::2])
    assert not twice.sealed
    twice.seal()
    for name in ("entry_deletes", "entry_puts", "tombstone_puts", "back_keys", "back_values"):
        assert getattr(twice, name) == getattr(once, name), name
    assert once.back_keys == sorted(once.back_keys) and once.entry_puts == sorted(once.entry_puts)
    assert (twice.live_delta, twice.unchanged, twice.stale) == (40, 0, 0)


def test_a_commit_leaves_freeing_its_decisions_to_the_next_decide(eng) -> None:
    """The batch's rows and decisions are freed off the round's path: held by the commit,
    released by the next ``decide_pending`` (after an early delivery's reply)."""
    eng.enqueue([_up("a", 1, 1), _up("b", 2, 2)])
    eng.decide_pending()
    sl: Slice = eng.slice("ix", 0)
    used = sl._decided
    eng.stabilise("ix", ts({0: 2}))
    assert any(r is used for r in sl._retired)
    assert sl._decided is not used and len(sl._decided) == 0
    eng.enqueue([_up("c", 3, 3)])
    eng.decide_pending()
    assert sl._retired == []
    eng.stabilise("ix", ts({0: 3}))
    assert eng.entries("ix")[0] == sorted(
        [encode_entry([1], "a"), encode_entry([2], "b"), encode_entry([3], "c")]
    )
