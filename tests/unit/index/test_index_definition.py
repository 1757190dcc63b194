"""Index definitions: validation, canonical texts, partitioning helpers."""

from __future__ import annotations

import pickle
import zlib

import msgspec
import pytest

from shardex.core.keycodec import encode_key
from shardex.errors import ErrorCode, ShardexError
from shardex.index import (
    IndexDefinition,
    IndexKey,
    compile_definition,
    index_partition_of,
    make_definition,
    partition_key_is_docid,
    validate_definition,
)


def test_canonical_texts_and_defaults() -> None:
    d = make_definition(
        id="i1",
        name="by_age",
        keyspace="ks",
        keys=["lower( name )", ("age", True)],
        where="type='user'",
    )
    assert [k.expr for k in d.keys] == ["LOWER(name)", "age"]
    assert d.desc == [False, True]
    assert d.where == 'type = "user"'
    assert d.partition_by is None and d.num_partition == 1
    # a plain struct: msgpack round trip (StateContext) and pickle (Spark executors)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(d), type=IndexDefinition) == d
    assert pickle.loads(pickle.dumps(d)) == d


def test_primary_index_is_an_index_on_the_docid() -> None:
    d = make_definition(id="p", name="#primary", keyspace="ks", is_primary=True)
    assert d.keys == [IndexKey(expr="META().id")]
    with pytest.raises(ShardexError):
        make_definition(id="p", name="x", keyspace="ks", is_primary=True, keys=["a"])
    with pytest.raises(ShardexError):
        make_definition(id="p", name="x", keyspace="ks", is_primary=True, where="a > 1")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"keys": []},
        {"keys": ["a"], "num_partition": 4},  # no PARTITION BY: exactly one partition
        {"keys": ["a"], "partition_by": [], "num_partition": 2},
        {"keys": ["a"], "partition_by": ["a"], "num_partition": 0},
        {"keys": ["a + $x"]},  # parameters cannot be supplied to the pipeline
        {"keys": ["a"], "where": "$p = 1"},
    ],
)
def test_invalid_definitions(kwargs: dict) -> None:
    with pytest.raises(ShardexError) as ei:
        make_definition(id="i", name="n", keyspace="ks", **kwargs)
    assert ei.value.code == ErrorCode.BAD_REQUEST


def test_syntax_error_and_bad_id() -> None:
    with pytest.raises(ShardexError) as ei:
        make_definition(id="i", name="n", keyspace="ks", keys=["a +"])
    assert ei.value.code == ErrorCode.EXPRESSION_SYNTAX
    with pytest.raises(ShardexError):
        validate_definition(IndexDefinition(id="a/b", name="n", keyspace="ks", keys=[]))


def test_partitioning_helpers() -> None:
    plain = make_definition(id="a", name="a", keyspace="ks", keys=["x"])
    by_id = make_definition(
        id="b", name="b", keyspace="ks", keys=["x"], partition_by=["meta().id"], num_partition=8
    )
    by_x = make_definition(
        id="c", name="c", keyspace="ks", keys=["x"], partition_by=["x"], num_partition=8
    )
    assert partition_key_is_docid(plain) and partition_key_is_docid(by_id)
    assert not partition_key_is_docid(by_x)
    assert index_partition_of(plain, {"x": 1}, "d1") == 0
    # the hash is crc32 of the codec's bytes, so 1 and 1.0 land together
    assert index_partition_of(by_x, {"x": 1}, "d") == zlib.crc32(encode_key([1])) % 8
    assert index_partition_of(by_x, {"x": 1.0}, "d") == index_partition_of(by_x, {"x": 1}, "d")
    assert index_partition_of(by_id, {}, "doc7") == zlib.crc32(encode_key(["doc7"])) % 8
    c = compile_definition(by_x)
    assert c.moving and not c.docid_partitioned
    assert compile_definition(by_x) is c  # cached per process
    assert compile_definition(by_id).docid_partitioned
