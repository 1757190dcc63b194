"""The data node's write fast paths keep what the general paths give.

* ``encode_document`` checks a ``bytes`` body inline: it must accept and reject exactly what
  the general path (a ``bytearray`` of the same text goes there) does, with the same error.
* ``Batch.rocks_put`` (rocksdict's own put) and the wrapper's puts count alike, and a batch
  still knows its count once written; ``ColumnFamily.get_tip`` reads what ``get`` reads; the
  write options built once still fsync the WAL exactly when asked (durability unchanged).
* ``mutate_many`` writes nothing when its ``ops`` iterable fails half-way, even past a chunk.
* A partition's new meta shares the failover log with the old one: a branch taken after
  writes must still see, and persist, the whole log.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardex.data.documents as documents
from shardex.api.validation import encode_document
from shardex.data.engine import DataEngine
from shardex.errors import ShardexError
from shardex.storage import Store

MAX = 200

BODIES: list[bytes] = [
    b'{"a": 1}',
    b"{}",
    b' {"a": [1, 2.5, -0, 1e5, 1E-5, true, false, null]}\n',
    b'{"a": 1e999}',  # a float out of range: the skip-only check would take it
    b'{"a": -1.7976931348623159e308}',
    b'{"a": ' + b"9" * 400 + b"}",  # a big int: accepted
    b'{"a": ' + b"9" * 310 + b".0}",  # a float out of range without an exponent
    b'{"a": "\xff"}',  # not UTF-8
    b'{"\xc3\x28": 1}',
    b'{"a": "\xed\xa0\x80"}',  # an encoded surrogate
    b'{"a": "\\ud800"}',  # a lone surrogate escape
    b'{"a": "\\ud83d\\ude00"}',
    b'{"a": "\\x"}',
    b'{"a": "\t"}',
    b'{"a": 01}',
    b'{"a": 1,}',
    b'{"a": 1} x',
    b'{"a": 1}\x00',
    b"[1]",
    b'"text"',
    b"1",
    b"null",
    b"",
    b"{",
    b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # too deep
    b'{"a": "' + b"x" * (MAX - 8) + b'"}',  # one byte over the limit: DOC_TOO_LARGE
    b'{"a": "' + b"x" * (MAX - 9) + b'"}',  # exactly at it
    b'{"a": 1, "a": 2}',
]


def _outcome(doc: object) -> object:
    try:
        return ("ok", encode_document(doc, MAX, "d"))
    except ShardexError as exc:
        return ("error", exc.code, str(exc), exc.details)
    except RecursionError:
        return ("recursion",)


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_bytes_fast_path_matches_the_general_path(body: bytes) -> None:
    fast = _outcome(body)
    general = _outcome(bytearray(body))  # not ``bytes``: the general path
    assert fast == general
    if fast[0] == "ok":
        assert fast[1] is body  # stored without a copy


# JSON-ish text: fragments that are valid, invalid, and at the edges of msgspec's checks.
_PIECES = st.sampled_from(
    [
        *(b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"a", b" ", b"1", b"e", b"E"),
        *(b"-", b"+", b".", b"0", b"9" * 20, b"1e999", b"1e308", b"true", b"null", b"\xff"),
        *(b"\xc3\xa9", b"\\u00e9", b"\\ud800", b"\t", b'"k":', b"{}", b"[]", b'"s"'),
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=14).map(b"".join))
def test_random_bodies_take_the_same_outcome(body: bytes) -> None:
    assert _outcome(body) == _outcome(bytearray(body))
    wrapped = b'{"v": ' + body + b"}"
    assert _outcome(wrapped) == _outcome(bytearray(wrapped))


def test_rocks_put_counts_and_the_count_survives_the_write(tmp_path) -> None:
    with Store(tmp_path / "db") as store:
        cf = store.column_family("a")
        batch = store.batch()
        assert batch.count == 0
        batch.rocks_put(b"k1", b"v1", cf.handle)
        batch.put(cf, b"k2", b"v2")
        assert batch.count == 2
        store.write(batch)
        assert batch.count == 2  # rocksdict consumed the batch; its count is kept
        assert cf.get_tip(b"k1") == cf.get(b"k1") == b"v1"
        assert cf.get_tip(b"nope") is None
        store.write(store.batch())  # an empty batch writes nothing, raises nothing


class _RecordingDb:
    """The store's rocksdict handle, recording the ``sync`` of every write's options."""

    def __init__(self, db: object) -> None:
        self._db = db
        self.syncs: list[bool] = []

    def write(self, wb: object, opts: object) -> None:
        self.syncs.append(opts.sync)  # type: ignore[attr-defined]
        self._db.write(wb, opts)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._db, name)


def test_write_options_built_once_keep_the_durability(tmp_path) -> None:
    with Store(tmp_path / "db") as store:
        cf = store.column_family("a")
        rec = _RecordingDb(store._db)
        store._db = rec  # type: ignore[assignment]
        for sync in (True, False, True):
            batch = store.batch()
            batch.put(cf, b"k", b"v")
            store.write(batch, sync=sync)
        store._db = rec._db  # type: ignore[assignment]
        assert rec.syncs == [True, False, True]


@pytest.fixture
def engine(tmp_path):
    eng = DataEngine(tmp_path / "db")
    eng.create_keyspace("ks", 4)
    for p in range(4):
        eng.create_partition("ks", p)
    yield eng
    eng.close()


def test_ops_failing_half_way_write_nothing(engine, monkeypatch) -> None:
    monkeypatch.setattr(documents, "BATCH_MAX_OPS", 2)  # several chunks before the failure

    def ops():
        for i in range(5):
            yield ("upsert", f"doc-{i}", b'{"i": 1}', None)
        raise RuntimeError("the caller's iterable broke")

    with pytest.raises(RuntimeError, match="broke"):
        engine.mutate_many("ks", ops(), durability="memory")
    assert all(seqno == 0 for seqno, _ in engine.high_seqnos("ks").to_wire().values())


def test_branch_after_writes_keeps_the_shared_failover_log(engine, tmp_path) -> None:
    docs = [("upsert", f"doc-{i}", b"{}", None) for i in range(20)]
    engine.mutate_many("ks", docs, durability="memory")
    part = engine._parts[("ks", 0)]
    before = list(part.meta.failover_log)
    entry = part.new_branch()
    engine.mutate_many("ks", docs, durability="memory")
    assert part.meta.failover_log == [entry, *before]
    engine.close()
    reopened = DataEngine(tmp_path / "db")
    try:
        assert reopened._parts[("ks", 0)].meta.failover_log == [entry, *before]
    finally:
        reopened.close()
