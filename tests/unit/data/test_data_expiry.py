"""Document expiry in the data engine, on a virtual clock: what a write stores, what reads
hide, the keyspace's max_ttl, touch, and the pager's deletions (marked expirations in the
change log, with new seqnos) down to an index built by the pipeline's own parts."""

from __future__ import annotations

import datetime

import msgspec
import pytest

from shardex.api.expiry import (
    FLAG_EXPIRED,
    RELATIVE_MAX,
    is_expired,
    resolve_expiry,
    wire_expiry,
)
from shardex.api.records import OP_DELETE, OP_UPSERT, Change
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.data.engine import DataEngine
from shardex.data.reconcile import open_partitions, reconcile
from shardex.data.records import DocRecord, decode_doc
from shardex.errors import ErrorCode, ShardexError
from shardex.index import IndexerEngine
from shardex.meta.index_definition import make_definition
from shardex.meta.partitioning import partition_of
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.storage.memory import MemoryDisk, MemoryStore
from shardex.testing.index import LocalPipeline

T0 = 1_800_000_000  # epoch seconds the virtual clock starts at


class Clock:
    def __init__(self) -> None:
        self.now = float(T0)

    def ns(self) -> int:
        return int(self.now * 1_000_000_000)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _engine(path, clock: Clock, max_ttl: int = 0) -> DataEngine:
    eng = DataEngine(path, clock_ns=clock.ns)
    eng.create_keyspace("ks", 2, max_ttl=max_ttl)
    for p in range(2):
        eng.create_partition("ks", p)
    return eng


@pytest.fixture
def engine(tmp_path, clock):
    eng = _engine(tmp_path / "db", clock)
    yield eng
    eng.close()


def _changes(eng: DataEngine, docid: str) -> list[Change]:
    p = partition_of(docid, 2)
    info = eng.partition_info("ks", p)
    items = eng.stream("ks", p, 0, info.uuid)
    return [c for c in items if isinstance(c, Change) and c.docid == docid]


def _not_found(eng: DataEngine, docid: str) -> None:
    with pytest.raises(ShardexError) as err:
        eng.get("ks", docid)
    assert err.value.code == ErrorCode.DOC_NOT_FOUND


def test_wire_form_follows_the_couchbase_convention():
    now = float(T0)
    assert wire_expiry(None, now) == 0
    assert wire_expiry(10, now) == 10
    assert wire_expiry(1.2, now) == 2  # rounded up: lives at least that long
    assert wire_expiry(datetime.timedelta(days=40), now) == T0 + 40 * 86400  # made absolute
    when = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    assert wire_expiry(when, now) == int(when.timestamp())
    for bad in (-1, "10", float("nan"), True, 2**40, datetime.timedelta(seconds=-5)):
        with pytest.raises(ShardexError) as err:
            wire_expiry(bad, now)
        assert err.value.code == ErrorCode.BAD_REQUEST
    # the node: relative up to 30 days, absolute beyond; max_ttl defaults and caps
    assert resolve_expiry(10, now, 0) == T0 + 10
    assert resolve_expiry(RELATIVE_MAX + 1, now, 0) == RELATIVE_MAX + 1
    assert resolve_expiry(0, now, 60) == T0 + 60
    assert resolve_expiry(3600, now, 60) == T0 + 60
    assert resolve_expiry(30, now, 60) == T0 + 30
    assert is_expired(T0, now) and not is_expired(0, now) and not is_expired(T0 + 1, now)


def test_a_document_expires_on_the_clock(engine, clock):
    engine.upsert("ks", "a", {"v": 1}, expiry=10)
    engine.upsert("ks", "b", {"v": 2})
    raw = engine.get_raw("ks", "a")
    assert raw.expiry == T0 + 10
    clock.now = T0 + 9.5
    assert engine.get("ks", "a").doc == {"v": 1}
    clock.now = T0 + 10
    _not_found(engine, "a")
    assert engine.get("ks", "b").doc == {"v": 2}
    # gone to every check: a replace finds nothing, an insert creates it anew
    with pytest.raises(ShardexError) as err:
        engine.replace("ks", "a", {"v": 3})
    assert err.value.code == ErrorCode.DOC_NOT_FOUND
    engine.insert("ks", "a", {"v": 4})
    assert engine.get_raw("ks", "a").expiry == 0  # a write without expiry has none


def test_the_expiry_is_stored_and_in_the_change_log(engine, clock):
    engine.upsert("ks", "a", {"v": 1}, expiry=T0 + 100)  # absolute
    p = partition_of("a", 2)
    rec = msgspec.msgpack.decode(
        engine._local.held("ks", p).cf.get(b"da"),
        type=DocRecord,  # the on-disk record itself
    )
    assert rec.expiry == T0 + 100
    (change,) = _changes(engine, "a")
    assert change.expiry == T0 + 100 and change.flags == 0


def test_max_ttl_defaults_and_caps(tmp_path, clock):
    eng = _engine(tmp_path / "db", clock, max_ttl=60)
    try:
        eng.upsert("ks", "none", {})
        eng.upsert("ks", "short", {}, expiry=5)
        eng.upsert("ks", "long", {}, expiry=3600)
        assert eng.get_raw("ks", "none").expiry == T0 + 60
        assert eng.get_raw("ks", "short").expiry == T0 + 5
        assert eng.get_raw("ks", "long").expiry == T0 + 60
        eng.mutate_many("ks", [("upsert", "batch", {}, None, 0)])
        assert eng.get_raw("ks", "batch").expiry == T0 + 60
        assert eng.keyspace("ks").max_ttl == 60
    finally:
        eng.close()


def test_touch_extends_and_keeps_the_body(engine, clock):
    first = engine.upsert("ks", "a", {"v": 1}, expiry=10)
    clock.now = T0 + 8
    touched = engine.touch("ks", "a", 10)
    assert touched.seqno == first.seqno + 1 and touched.cas > first.cas
    clock.now = T0 + 15
    got = engine.get_raw("ks", "a")
    assert msgspec.json.decode(got.body) == {"v": 1} and got.expiry == T0 + 18
    with pytest.raises(ShardexError) as err:
        engine.touch("ks", "a", 10, cas=first.cas)
    assert err.value.code == ErrorCode.CAS_MISMATCH
    clock.now = T0 + 18
    with pytest.raises(ShardexError) as err:
        engine.touch("ks", "a", 10)  # expired: nothing to touch
    assert err.value.code == ErrorCode.DOC_NOT_FOUND
    with pytest.raises(ShardexError) as err:
        engine.touch("ks", "missing", 10)
    assert err.value.code == ErrorCode.DOC_NOT_FOUND


def test_the_pager_deletes_what_expired_as_marked_expirations(engine, clock):
    for i in range(20):
        engine.upsert("ks", f"d{i}", {"i": i}, expiry=10 if i % 2 else 0)
    before = {p: engine.partition_info("ks", p) for p in range(2)}
    clock.now = T0 + 10
    found: list[tuple[str, int]] = []
    for p in range(2):
        after, rounds = None, 0
        while True:  # bounded walks of 3 records, continued from their cursor
            got, after, seen = engine.find_expired("ks", p, after, 3)
            assert seen <= 3
            found += got
            n = engine.expire("ks", p, got)
            assert n == len(got)
            rounds += 1
            if after is None:
                break
        assert rounds > 1
    assert sorted(d for d, _ in found) == sorted(f"d{i}" for i in range(1, 20, 2))
    for p in range(2):
        info = engine.partition_info("ks", p)
        n = sum(1 for d, _ in found if partition_of(d, 2) == p)
        assert info.high_seqno == before[p].high_seqno + n  # new seqnos
        assert info.doc_count == before[p].doc_count - n
    (_, deletion) = _changes(engine, "d1")
    assert deletion.op == OP_DELETE and deletion.flags & FLAG_EXPIRED
    rec = decode_doc(engine._local.held("ks", partition_of("d1", 2)).cf.get(b"dd1"))
    assert rec.deleted and rec.flags & FLAG_EXPIRED
    (kept,) = _changes(engine, "d0")
    assert kept.op == OP_UPSERT
    # nothing left to find
    assert all(engine.find_expired("ks", p, None, 100)[0] == [] for p in range(2))


def test_expire_keeps_a_document_written_or_touched_since(engine, clock):
    engine.upsert("ks", "a", {}, expiry=10)
    engine.upsert("ks", "b", {}, expiry=10)
    clock.now = T0 + 10
    p_a, p_b = partition_of("a", 2), partition_of("b", 2)
    (seen_a,) = [x for x in engine.find_expired("ks", p_a, None, 100)[0] if x[0] == "a"]
    (seen_b,) = [x for x in engine.find_expired("ks", p_b, None, 100)[0] if x[0] == "b"]
    engine.upsert("ks", "a", {"again": True})  # rewritten after the walk saw it
    assert engine.expire("ks", p_a, [seen_a]) == 0
    assert engine.get("ks", "a").doc == {"again": True}
    assert engine.expire("ks", p_b, [seen_b]) == 1
    assert engine.expire("ks", p_b, [seen_b]) == 0  # already deleted


def test_a_read_of_an_expired_document_reports_it(engine, clock):
    seen: list[tuple[str, int, str, int]] = []
    engine.set_on_expired(lambda *a: seen.append(a))
    r = engine.upsert("ks", "a", {}, expiry=1)
    clock.now = T0 + 2
    _not_found(engine, "a")
    assert seen == [("ks", partition_of("a", 2), "a", r.cas)]


def test_bad_expiry_changes_nothing(engine):
    for bad in (-1, "x", 2**40):
        with pytest.raises(ShardexError) as err:
            engine.upsert("ks", "a", {}, expiry=bad)
        assert err.value.code == ErrorCode.BAD_REQUEST
        (res,) = engine.mutate_many("ks", [("upsert", "a", {}, None, bad)])
        assert isinstance(res, ShardexError) and res.code == ErrorCode.BAD_REQUEST
    _not_found(engine, "a")


def test_expirations_reach_an_index_as_deletions(tmp_path, clock):
    """The data engine's change stream (expirations included) through the pipeline's own
    projector, router and indexer engines (``LocalPipeline``): the index ends equal to the
    oracle over the documents still live, the expired ones gone from it."""
    eng = _engine(tmp_path / "db", clock)
    defs = [
        make_definition(
            id="i_v",
            name="by_v",
            keyspace="ks",
            keys=["v"],
            partition_by=["META().id"],
            num_partition=2,
        ),
        make_definition(id="i_p", name="#primary", keyspace="ks", is_primary=True),
    ]
    disk = MemoryDisk()
    indexer = IndexerEngine(tmp_path / "ix", open_store=lambda _p: MemoryStore(disk))
    placement = {d.id: dict.fromkeys(range(d.num_partition), "n1") for d in defs}
    pipe = LocalPipeline(defs, {"n1": indexer}, placement)
    pipe.create_slices()
    try:
        for i in range(30):
            eng.upsert("ks", f"d{i}", {"v": i % 7}, expiry=10 if i % 3 == 0 else 0)
        clock.now = T0 + 11
        for p in range(2):
            found, _, _ = eng.find_expired("ks", p, None, 1000)
            assert eng.expire("ks", p, found) == len(found)
        rows, highs = [], {}
        for p in range(2):
            info = eng.partition_info("ks", p)
            highs[p] = (info.high_seqno, info.uuid)
            for c in eng.stream("ks", p, 0, info.uuid):
                if isinstance(c, Change):
                    rows.append((c.docid, p, c.seqno, c.op, c.body))
        expirations = [r for r in rows if r[3] == OP_DELETE]
        assert len(expirations) == 10
        ts = Timestamp(highs)
        pipe.deliver(rows)
        pipe.stabilise(ts)
        live = {f"d{i}": {"v": i % 7} for i in range(30) if i % 3}
        pipe.check(ts, live)  # the oracle: exactly the live documents' entries
        assert sum(len(e) for e in pipe.entries("i_p", ts).values()) == len(live)
    finally:
        indexer.close()
        eng.close()


def test_reconcile_brings_the_keyspace_max_ttl_to_the_local_catalog(tmp_path, clock):
    """A node learns the keyspace's max_ttl from the cluster state (created with it, or
    changed later), kept across a restart of the engine."""
    meta = KeyspaceMeta(name="ks", num_partitions=2, uuid="u1", created_cas=1, max_ttl=60)
    topo = Topology(seq_num=1, assignment={0: "n1", 1: "n1"})

    def state(m: KeyspaceMeta) -> StateContext:
        return StateContext(cas=2, epoch=1, keyspaces={"ks": m}, data_topologies={"ks": [topo]})

    eng = DataEngine(tmp_path / "db", clock_ns=clock.ns)
    reconcile(eng, "n1", state(meta))
    assert eng.keyspace("ks").max_ttl == 60
    eng.upsert("ks", "a", {})
    assert eng.get_raw("ks", "a").expiry == T0 + 60
    # a migration's target opens the keyspace without knowing max_ttl: the recorded one stays
    open_partitions(eng, "ks", "u1", 1, 2, [])
    assert eng.keyspace("ks").max_ttl == 60
    reconcile(eng, "n1", state(msgspec.structs.replace(meta, max_ttl=5)))
    eng.close()
    eng = DataEngine(tmp_path / "db", clock_ns=clock.ns)
    try:
        assert eng.keyspace("ks").max_ttl == 5
        eng.upsert("ks", "b", {})
        assert eng.get_raw("ks", "b").expiry == T0 + 5
        assert eng.get("ks", "a").doc == {}  # nothing else changed
    finally:
        eng.close()
