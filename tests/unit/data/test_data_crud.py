"""Data engine: CRUD, CAS, validation that changes nothing, batches, concurrent writers."""

from __future__ import annotations

import itertools
import threading
import zlib

import msgspec
import pytest

from shardex.api.records import MutationResult, SnapshotMarker
from shardex.data.engine import DataEngine
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.partitioning import partition_of


def _open(path) -> DataEngine:
    eng = DataEngine(path)
    eng.create_keyspace("ks", 4)
    for p in range(4):
        eng.create_partition("ks", p)
    return eng


@pytest.fixture
def engine(tmp_path):
    eng = _open(tmp_path / "db")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def shared_engine(tmp_path_factory):
    """One engine for the many bad-input cases (each checks its own before/after state)."""
    eng = _open(tmp_path_factory.mktemp("shared") / "db")
    yield eng
    eng.close()


def log_of(engine: DataEngine, keyspace: str = "ks") -> list:
    """Every partition's full change log (what a consumer from 0 would see)."""
    out = []
    for p in engine.partitions(keyspace):
        out += [i for i in engine.stream(keyspace, p, 0, 0) if not isinstance(i, SnapshotMarker)]
    return out


def test_partition_of_is_crc32_mod_n():
    for docid in ["a", "user::42", "ü-ß", "x" * 250]:
        assert partition_of(docid, 64) == zlib.crc32(docid.encode()) % 64
    assert partition_of("a", 1) == 0


def test_crud_roundtrip_and_seqnos(engine):
    r1 = engine.insert("ks", "doc1", {"name": "ada", "tags": [1, 2]})
    assert isinstance(r1, MutationResult)
    p = r1.partition
    assert p == partition_of("doc1", 4) and r1.seqno == 1
    assert r1.uuid == engine.partition_info("ks", p).uuid
    doc, cas, seqno = engine.get("ks", "doc1")
    assert doc == {"name": "ada", "tags": [1, 2]} and cas == r1.cas and seqno == 1

    r2 = engine.upsert("ks", "doc1", '{"name": "bob"}')
    r3 = engine.replace("ks", "doc1", b'{"name": "cy"}', cas=r2.cas)
    assert (r2.seqno, r3.seqno) == (2, 3)
    assert r1.cas < r2.cas < r3.cas
    assert engine.get("ks", "doc1").doc == {"name": "cy"}
    assert engine.get_raw("ks", "doc1").body == b'{"name": "cy"}'

    r4 = engine.delete("ks", "doc1", cas=r3.cas)
    assert r4.seqno == 4
    with pytest.raises(ShardexError) as err:
        engine.get("ks", "doc1")
    assert err.value.code is ErrorCode.DOC_NOT_FOUND
    # Insert over a tombstone is allowed: the document does not exist.
    assert engine.insert("ks", "doc1", {"again": True}).seqno == 5
    assert engine.partition_info("ks", p).doc_count == 1


def test_error_cases_name_the_problem(engine):
    r = engine.insert("ks", "d", {"v": 1})
    with pytest.raises(ShardexError) as err:
        engine.insert("ks", "d", {"v": 2})
    assert err.value.code is ErrorCode.DOC_EXISTS
    with pytest.raises(ShardexError) as err:
        engine.replace("ks", "d", {"v": 2}, cas=r.cas + 1)
    assert err.value.code is ErrorCode.CAS_MISMATCH
    assert err.value.details["expected"] == r.cas + 1
    assert err.value.details["actual"] == r.cas
    with pytest.raises(ShardexError) as err:
        engine.delete("ks", "d", cas=12345)
    assert err.value.code is ErrorCode.CAS_MISMATCH
    with pytest.raises(ShardexError) as err:
        engine.upsert("ks", "d", {"v": 3}, cas=999)  # upsert with cas behaves as replace
    assert err.value.code is ErrorCode.CAS_MISMATCH
    for call in (
        lambda: engine.replace("ks", "missing", {"v": 1}),
        lambda: engine.delete("ks", "missing"),
        lambda: engine.upsert("ks", "missing", {"v": 1}, cas=5),
    ):
        with pytest.raises(ShardexError) as err:
            call()
        assert err.value.code is ErrorCode.DOC_NOT_FOUND
        assert err.value.details["docid"] == "missing"
    engine.delete("ks", "d")
    with pytest.raises(ShardexError) as err:
        engine.delete("ks", "d")
    assert err.value.code is ErrorCode.DOC_NOT_FOUND
    with pytest.raises(ShardexError) as err:
        engine.get("ks", "d")
    assert err.value.code is ErrorCode.DOC_NOT_FOUND


BAD_INPUTS = [
    ("", {"a": 1}, ErrorCode.BAD_REQUEST, "empty"),
    (None, {"a": 1}, ErrorCode.BAD_REQUEST, "string"),
    ("x" * 251, {"a": 1}, ErrorCode.BAD_REQUEST, "250"),
    ("ü" * 126, {"a": 1}, ErrorCode.BAD_REQUEST, "252 UTF-8 bytes"),
    ("\ud800", {"a": 1}, ErrorCode.BAD_REQUEST, "Unicode"),
    ("d", "[1, 2]", ErrorCode.BAD_REQUEST, "JSON object"),
    ("d", "42", ErrorCode.BAD_REQUEST, "JSON object"),
    ("d", [1, 2], ErrorCode.BAD_REQUEST, "got list"),
    ("d", 42, ErrorCode.BAD_REQUEST, "got int"),
    ("d", '{"a": 1,, }', ErrorCode.BAD_REQUEST, "not valid JSON"),
    ("d", b"\xff{}", ErrorCode.BAD_REQUEST, "not valid JSON"),
    ("d", {"a": object()}, ErrorCode.BAD_REQUEST, "serialisable"),
    ("d", {"a": "x" * (1024 * 1024)}, ErrorCode.DOC_TOO_LARGE, "limit is 1048576"),
    ("d", '{"a": "' + "x" * (1024 * 1024) + '"}', ErrorCode.DOC_TOO_LARGE, "bytes"),
]


@pytest.mark.parametrize(("docid", "doc", "code", "text"), BAD_INPUTS)
def test_bad_input_is_rejected_and_changes_nothing(shared_engine, docid, doc, code, text):
    engine = shared_engine
    engine.upsert("ks", "d", {"before": True})
    before_ts = engine.high_seqnos("ks")
    before_log = log_of(engine)
    with pytest.raises(ShardexError) as err:
        engine.upsert("ks", docid, doc)
    assert err.value.code is code
    assert text in err.value.message
    assert engine.high_seqnos("ks") == before_ts
    assert log_of(engine) == before_log
    assert engine.get("ks", "d").doc == {"before": True}


def test_parse_error_reports_position_and_size_error_reports_limit(engine):
    with pytest.raises(ShardexError) as err:
        engine.insert("ks", "d", '{"a": 1,, }')
    assert err.value.details["position"] == 8
    with pytest.raises(ShardexError) as err:
        engine.insert("ks", "d", {"a": "x" * 2_000_000})
    assert err.value.details["limit"] == 1024 * 1024
    assert err.value.details["size"] > 2_000_000


def test_bad_parameters(engine, tmp_path):
    cases = [
        (lambda: engine.upsert("nope", "d", {}), ErrorCode.KEYSPACE_NOT_FOUND),
        (lambda: engine.upsert("ks", "d", {}, durability="fast"), ErrorCode.BAD_REQUEST),  # type: ignore[arg-type]
        (lambda: engine.replace("ks", "d", {}, cas=-1), ErrorCode.BAD_REQUEST),
        (lambda: engine.replace("ks", "d", {}, cas="1"), ErrorCode.BAD_REQUEST),  # type: ignore[arg-type]
        (lambda: engine.create_keyspace("ks", 4), ErrorCode.KEYSPACE_EXISTS),
        (lambda: engine.create_keyspace("a/b", 4), ErrorCode.BAD_REQUEST),
        (lambda: engine.create_keyspace("zz", 0), ErrorCode.BAD_REQUEST),
        (lambda: engine.create_partition("ks", 4), ErrorCode.BAD_REQUEST),
    ]
    for call, code in cases:
        with pytest.raises(ShardexError) as err:
            call()
        assert err.value.code is code, call
    assert engine.create_keyspace("ks", 4, exist_ok=True).num_partitions == 4
    assert engine.high_seqnos("ks").seqno(0) == 0


def test_not_owned_partition_is_not_my_partition(tmp_path):
    with DataEngine(tmp_path / "db") as eng:
        eng.create_keyspace("ks", 2)
        eng.create_partition("ks", 0)
        docid = next(f"d{i}" for i in range(100) if partition_of(f"d{i}", 2) == 1)
        with pytest.raises(ShardexError) as err:
            eng.upsert("ks", docid, {})
        assert err.value.code is ErrorCode.NOT_MY_PARTITION
        assert err.value.details == {
            "keyspace": "ks",
            "partition": 1,
            "state": "absent",
            "retryable": False,
        }
        assert list(eng.high_seqnos("ks")) == [0]


def test_upsert_many_groups_by_partition_and_reports_bad_items(engine):
    items = [(f"doc{i}", {"i": i}) for i in range(200)]
    items.insert(7, ("bad", "[not an object]"))
    items.insert(50, ("", {}))
    items.append(("doc3", {"i": "last"}))  # same docid twice in a batch: both applied, in order
    results = engine.upsert_many("ks", items)
    assert len(results) == len(items)
    assert results[7].code is ErrorCode.BAD_REQUEST
    assert results[50].code is ErrorCode.BAD_REQUEST
    ok = [r for r in results if isinstance(r, MutationResult)]
    assert len(ok) == 201
    for p in range(4):
        seqnos = sorted(r.seqno for r in ok if r.partition == p)
        assert seqnos == list(range(1, len(seqnos) + 1))
    assert engine.get("ks", "doc3").doc == {"i": "last"}
    assert sum(engine.partition_info("ks", p).doc_count for p in range(4)) == 200


def test_mutate_many_applies_checks_in_order(engine):
    res = engine.mutate_many(
        "ks",
        [
            ("insert", "a", {"v": 1}, None),
            ("insert", "a", {"v": 2}, None),  # exists (inserted just before, same batch)
            ("replace", "a", {"v": 3}, None),
            ("delete", "a", None, None),
            ("replace", "a", {"v": 4}, None),  # deleted just before
            ("frobnicate", "a", {}, None),
        ],
        durability="memory",
    )
    codes = [r.code if isinstance(r, ShardexError) else "ok" for r in res]
    assert codes == [
        "ok",
        ErrorCode.DOC_EXISTS,
        "ok",
        "ok",
        ErrorCode.DOC_NOT_FOUND,
        ErrorCode.BAD_REQUEST,
    ]
    assert [r.seqno for r in res if isinstance(r, MutationResult)] == [1, 2, 3]


def test_concurrent_writers_get_gap_free_seqnos(tmp_path):
    with DataEngine(tmp_path / "db") as eng:
        eng.create_keyspace("one", 1)
        eng.create_partition("one", 0)
        results: list[MutationResult] = []
        lock = threading.Lock()

        def writer(t: int) -> None:
            for i in range(60):
                durability = "persist" if i % 10 == 0 else "memory"
                r = eng.upsert("one", f"t{t}-{i % 7}", {"t": t, "i": i}, durability=durability)
                with lock:
                    results.append(r)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(r.seqno for r in results) == list(range(1, 481))
        by_seqno = sorted(results, key=lambda r: r.seqno)
        assert all(a.cas < b.cas for a, b in itertools.pairwise(by_seqno))
        log = [i for i in eng.stream("one", 0, 0, 0) if not isinstance(i, SnapshotMarker)]
        assert [c.seqno for c in log] == list(range(1, 481))
        assert [c.cas for c in log] == [r.cas for r in by_seqno]


def test_reopen_keeps_everything_and_continues(tmp_path):
    with DataEngine(tmp_path / "db") as eng:
        eng.create_keyspace("ks", 2)
        eng.create_partition("ks", 0)
        eng.create_partition("ks", 1)
        res = eng.upsert_many("ks", [(f"d{i}", {"i": i}) for i in range(50)], durability="memory")
        info = {p: eng.partition_info("ks", p) for p in (0, 1)}
    with DataEngine(tmp_path / "db") as eng:
        assert [k.name for k in eng.keyspaces()] == ["ks"]
        assert eng.partitions("ks") == [0, 1]
        for p in (0, 1):
            assert eng.partition_info("ks", p) == info[p]
        assert eng.get("ks", "d7").doc == {"i": 7}
        r = eng.upsert("ks", "d7", {"i": "new"})
        assert r.seqno == info[r.partition].high_seqno + 1
        assert r.cas > max(x.cas for x in res)


def test_drop_keyspace_removes_partitions(tmp_path):
    with DataEngine(tmp_path / "db") as eng:
        eng.create_keyspace("ks", 2)
        eng.create_partition("ks", 0)
        eng.upsert("ks", next(f"d{i}" for i in range(99) if partition_of(f"d{i}", 2) == 0), {})
        eng.drop_keyspace("ks")
        with pytest.raises(ShardexError) as err:
            eng.partitions("ks")
        assert err.value.code is ErrorCode.KEYSPACE_NOT_FOUND
        eng.create_keyspace("ks", 2)
        eng.create_partition("ks", 0)
        assert eng.partition_info("ks", 0).high_seqno == 0
    with DataEngine(tmp_path / "db") as eng:
        assert eng.partition_info("ks", 0).high_seqno == 0


def test_records_are_compact_msgpack(engine):
    r = engine.upsert("ks", "d", {"a": 1})
    raw = engine._parts[("ks", r.partition)].cf.get(b"dd")
    assert msgspec.msgpack.decode(raw)[:3] == [r.cas, r.seqno, False]
