"""The Spark connector's pure parts, without a SparkSession or a cluster: schema inference
and the coercion of document values to the column types, Spark's filters as SQL++ terms and
an index plan (the SQL planner's choice), the recheck of fetched rows, and option errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    StringStartsWith,
)
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DateType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_definition import IndexDefinition, IndexKey
from shardex.spark.filters import matches, plan_index, term_of
from shardex.spark.options import ConnectorOptions
from shardex.spark.schema import Converter, infer_schema

SCHEMA = StructType(
    [
        StructField("_id", StringType(), False),
        StructField("name", StringType()),
        StructField("age", LongType()),
        StructField("score", DoubleType()),
        StructField("ok", BooleanType()),
        StructField("address", StructType([StructField("city", StringType())])),
        StructField("tags", ArrayType(LongType())),
        StructField("_deleted", BooleanType(), False),
    ]
)


def test_inference_merges_fields_like_spark_json() -> None:
    schema = infer_schema(
        [
            {"age": 3, "name": "a", "address": {"city": "x"}, "tags": [1, 2]},
            {"age": 3.5, "name": 7, "address": {"zip": 1}, "tags": [], "none": None},
        ]
    )
    assert schema.simpleString() == (
        "struct<_id:string,address:struct<city:string,zip:bigint>,age:double,name:string,"
        "none:string,tags:array<bigint>,_deleted:boolean>"
    )
    assert infer_schema([]).names == ["_id", "_deleted"]


def test_values_that_do_not_fit_their_column_are_null_or_json_text() -> None:
    conv = Converter(SCHEMA)
    row = conv.row(
        "d1",
        b'{"name": {"x": 1}, "age": 4.0, "score": 2, "ok": 1, "address": "rome",'
        b' "tags": [1, "two", 3.5]}',
    )
    assert row == {
        "_id": "d1",
        "name": '{"x":1}',  # a string column shows a non-string as its JSON text
        "age": 4,  # an integral float fits a long
        "score": 2.0,
        "ok": None,  # 1 is no boolean
        "address": None,
        "tags": [1, None, None],
        "_deleted": False,
    }
    batch = conv.batch([row, conv.row("d2", None, deleted=True)])
    assert batch.num_rows == 2 and batch.column("_deleted").to_pylist() == [False, True]


def test_filters_become_terms_only_where_the_spans_stay_a_superset() -> None:
    def term(f: object) -> str | None:
        return term_of(f, SCHEMA)  # type: ignore[arg-type]

    assert term(GreaterThanOrEqual(("age",), 30)) == "`age` >= 30"
    assert term(In(("score",), (1.5, 2))) == "`score` IN [1.5, 2]"
    assert term(EqualTo(("address", "city"), "rome")) == '`address`.`city` = "rome"'
    assert term(EqualTo(("_id",), "d1")) == 'META().id = "d1"'
    assert term(LessThan(("_id",), "d5")) == 'META().id < "d5"'
    assert term(StringStartsWith(("name",), "Jo")) == '`name` LIKE "Jo%"'
    # a string column may show a number, a boolean or an object as its JSON text
    assert term(EqualTo(("name",), "12")) is None
    assert term(GreaterThan(("name",), "m")) is None
    assert term(StringStartsWith(("name",), "tr")) is None
    assert term(StringStartsWith(("name",), "a_b")) is None  # LIKE would read _ as a wildcard
    assert term(EqualTo(("age",), "30")) is None  # no number
    assert term(EqualTo(("age",), float("nan"))) is None
    assert term(IsNull(("age",))) is None
    assert term(EqualTo(("tags",), [1])) is None
    assert term(EqualTo(("nope",), 1)) is None


INDEXES = [
    IndexDefinition(id="i1", name="by_age", keyspace="users", keys=[IndexKey(expr="age")]),
    IndexDefinition(
        id="i2", name="by_city", keyspace="users", keys=[IndexKey(expr="address.city")]
    ),
    IndexDefinition(id="i3", name="by_age", keyspace="other", keys=[IndexKey(expr="name")]),
]


def test_the_planner_chooses_the_index_and_only_its_filters_are_pushed() -> None:
    age, city, name = (
        GreaterThanOrEqual(("age",), 30),
        EqualTo(("address", "city"), "rome"),
        EqualTo(("name",), "ann"),
    )
    plan = plan_index([age, city, name], SCHEMA, INDEXES, keyspace="users", use_index=None)
    assert plan is not None and plan.index == "by_city" and plan.pushed == (city,)
    assert plan.spans == [{"low": ["rome"], "high": ["rome"], "inclusion": "both"}]
    forced = plan_index([age, city], SCHEMA, INDEXES, keyspace="users", use_index="by_age")
    assert forced is not None and forced.index == "by_age" and forced.pushed == (age,)
    assert plan_index([name], SCHEMA, INDEXES, keyspace="users", use_index=None) is None


def test_a_forced_index_that_cannot_serve_is_an_error_naming_it() -> None:
    with pytest.raises(ShardexError) as info:
        plan_index([], SCHEMA, INDEXES, keyspace="users", use_index="by_age")
    assert info.value.code is ErrorCode.INDEX_NOT_FOUND
    assert "option 'index'" in str(info.value) and "by_age" in str(info.value)
    with pytest.raises(ShardexError, match="'nope' does not exist"):
        plan_index([], SCHEMA, INDEXES, keyspace="users", use_index="nope")


def test_the_recheck_is_sparks_semantics_on_the_row() -> None:
    row = {"age": 31, "name": "Jo", "address": {"city": "rome"}}
    assert matches(row, [GreaterThanOrEqual(("age",), 30), EqualTo(("address", "city"), "rome")])
    assert matches(row, [StringStartsWith(("name",), "J"), In(("age",), (31, 2))])
    assert not matches(row, [GreaterThan(("age",), 31)])
    assert not matches({"age": None}, [GreaterThan(("age",), 1)])  # null compares as not true
    assert not matches({}, [EqualTo(("address", "city"), "rome")])


def test_bad_options_name_the_option_and_value(tmp_path: Path) -> None:
    base = {"cluster": str(tmp_path), "keyspace": "users"}
    cases = [
        ({**base, "consistency": "eventually"}, "'consistency'", "eventually"),
        ({**base, "durability": "sometimes"}, "'durability'", "sometimes"),
        ({**base, "sample_size": "0"}, "'sample_size'", "'0'"),
        ({**base, "colour": "red"}, "'colour'", "unknown option"),
        ({"cluster": str(tmp_path)}, "'keyspace'", "required"),
        ({**base, "cluster": "not a place"}, "'cluster'", "not a place"),
        ({**base, "cluster": "127.0.0.1:7000"}, "'secret'", "node secret"),
        (base, "'cluster'", "not a shardex cluster directory"),  # an empty directory
    ]
    for options, option, value in cases:
        with pytest.raises(ShardexError) as info:
            ConnectorOptions.parse(options)
        assert info.value.code is ErrorCode.CONFIG_ERROR
        assert option in str(info.value) and value in str(info.value), str(info.value)


def test_a_column_type_documents_cannot_fill_is_refused_naming_it() -> None:
    schema = StructType([StructField("_id", StringType()), StructField("born", DateType())])
    with pytest.raises(ShardexError, match="'born' has type date"):
        Converter(schema)
