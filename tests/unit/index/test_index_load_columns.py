"""Columnar load chunks (what the pipeline sends): the same slice as row chunks, repeats
and docids read twice keep the highest seqno, and bad columns are refused by name."""

from __future__ import annotations

import msgspec
import pytest

from shardex.api.delivery import LoadChunk
from shardex.core.keycodec import encode_entry
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index import UPSERT, IndexerEngine, make_definition

D = make_definition(id="b", name="b", keyspace="ks", keys=["k"])
T0 = Timestamp({0: (100, 0xFEED), 1: (100, 0xFEED)})


def up(docid: str, k: object, seqno: int, part: int = 0) -> tuple:
    return ("b", 0, UPSERT, encode_entry([k], docid), docid, part, seqno)


def cols(rows: list[tuple]) -> tuple[list, list, list, list]:
    m = LoadChunk.columnar("b", 0, dict(T0.to_wire()), rows)
    # through the wire codec, as a node receives it
    m = msgspec.msgpack.decode(msgspec.msgpack.encode(m), type=LoadChunk)
    assert m.rows == []
    return m.entries, m.docids, m.partitions, m.seqnos


@pytest.fixture
def engines(tmp_path):
    a = IndexerEngine(tmp_path / "a", sync=False)
    b = IndexerEngine(tmp_path / "b", sync=False)
    for e in (a, b):
        e.create_slice(D, 0)
    yield a, b
    a.close()
    b.close()


def test_columns_load_the_same_slice_as_rows(engines) -> None:
    by_cols, by_rows = engines
    first = [up(f"d{i}", i % 7, i + 1, part=i % 2) for i in range(50)]
    again = [up("d3", "new", 90), up("d4", "older", 1), up("x", 1, 5), up("x", 2, 6)]
    for e, use_cols in ((by_cols, True), (by_rows, False)):
        for chunk in (first, again, first[:10]):  # a retried chunk at the end
            if use_cols:
                e.load_chunk("b", 0, T0, [], 1, columns=cols(chunk))
            else:
                e.load_chunk("b", 0, T0, chunk, 1)
        assert e.load_session("b", 0).docs == 3
        assert e.load_finish("b", 0, T0) == 51
    assert by_cols.entries("b") == by_rows.entries("b")
    assert by_cols.slice("b", 0).back_rows() == by_rows.slice("b", 0).back_rows()
    held = by_cols.slice("b", 0).back_rows()
    assert held["d3"][1:] == (90, up("d3", "new", 90)[3])  # the newer read wins
    assert held["d4"][1] == 5 and held["x"][1] == 6  # an older read never replaces


def test_columns_of_different_lengths_are_refused(engines) -> None:
    eng, _ = engines
    entries, docids, parts, seqnos = cols([up("a", 1, 1), up("b", 2, 2)])
    with pytest.raises(ShardexError) as ei:
        eng.load_chunk("b", 0, T0, [], columns=(entries, docids, parts, seqnos[:1]))
    assert ei.value.code is ErrorCode.BAD_REQUEST
    assert "seqnos 1" in ei.value.message and "docids 2" in ei.value.message
    assert eng.load_session("b", 0) is None  # refused before the load opened
