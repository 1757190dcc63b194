"""The list forms of the RocksDB wrapper: ``get_many``, ``Batch.put_many``/``delete_many``,
``SstWriter.put_many`` (what a stabilise and an initial build use per key)."""

from __future__ import annotations

import pytest

from shardex.errors import StorageError
from shardex.storage import SstWriter, Store


def test_get_many_put_many_delete_many(tmp_path):
    with Store(tmp_path / "db") as store:
        cf, other = store.column_family("a"), store.column_family("b")
        batch = store.batch()
        batch.put_many(cf, [b"1", b"2", b"3"], [b"x", b"y", b"z"])
        batch.put_many(other, [b"k"])  # values default to b""
        store.write(batch)
        assert batch.count == 4
        assert cf.get_many([b"3", b"nope", b"1"]) == [b"z", None, b"x"]
        assert other.get(b"k") == b"" and other.get(b"1") is None
        assert cf.get_many([]) == []
        batch = store.batch()
        batch.delete_many(cf, [b"1", b"3", b"absent"])
        store.write(batch)
        assert list(cf.iterate()) == [(b"2", b"y")]


def test_put_many_needs_one_value_per_key(tmp_path):
    with Store(tmp_path / "db") as store, pytest.raises(StorageError, match="2 keys but 1"):
        store.batch().put_many(store.column_family("a"), [b"1", b"2"], [b"x"])


def test_sst_put_many_ingests_and_checks_the_order(tmp_path):
    with Store(tmp_path / "db") as store:
        w = SstWriter(tmp_path / "a.sst")
        w.put_many([b"a", b"b"])
        w.put_many([b"c", b"d"], [b"3", b"4"])
        w.finish()
        cf = store.column_family("x")
        cf.ingest([w.path])
        assert list(cf.iterate()) == [(b"a", b""), (b"b", b""), (b"c", b"3"), (b"d", b"4")]
        assert w.count == 4
    w = SstWriter(tmp_path / "b.sst")
    with pytest.raises(StorageError, match="strictly increasing"):
        w.put_many([b"b", b"a"])  # out of order inside one call: RocksDB's own check
    w = SstWriter(tmp_path / "c.sst")
    w.put_many([b"m"])
    with pytest.raises(StorageError, match="strictly increasing") as err:
        w.put_many([b"m", b"z"])  # not above the previous call's last key
    assert err.value.details["previous"] == b"m".hex()
    with pytest.raises(StorageError, match="1 keys but 0 values"):
        SstWriter(tmp_path / "d.sst").put_many([b"a"], [])
