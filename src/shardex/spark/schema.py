"""Documents as Spark rows: the schema inferred from a sample, and JSON bodies to Arrow.

Inference (``infer_schema``) follows Spark's own JSON inference, so a DataFrame read from
shardex looks like one read from JSON files: integers are ``long``, any float makes the
field ``double``, objects are structs (fields merged across the sample, sorted by name),
arrays take the merged type of their elements, a field seen only as null is ``string``, and
a field seen with types that do not merge (a string here, a number there) is ``string``.
The document id column ``_id`` comes first, the deletion flag ``_deleted`` last (true only
for a stream's deletions; a writer deletes the rows that have it).

Conversion (``Converter``): each body is decoded once and every value is coerced to its
column's type: a value that does not fit is null, except in a ``string`` column, which holds
a non-string as its JSON text (as Spark's JSON reader does). The rows leave as one Arrow
RecordBatch per block, in exactly the schema Spark expects (``to_arrow_schema``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from shardex.spark.options import bad_option

ID = "_id"  # the document id column
DELETED = "_deleted"  # a stream's deletion flag column

_json = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()

# --- inference ----------------------------------------------------------------------------


def type_of(value: Any) -> DataType:
    """The Spark type of one JSON value (``NullType`` for null)."""
    if value is None:
        return NullType()
    if isinstance(value, bool):
        return BooleanType()
    if isinstance(value, int):
        return LongType()
    if isinstance(value, float):
        return DoubleType()
    if isinstance(value, str):
        return StringType()
    if isinstance(value, dict):
        return StructType([StructField(k, type_of(v), True) for k, v in sorted(value.items())])
    if isinstance(value, list):
        element: DataType = NullType()
        for v in value:
            element = merge(element, type_of(v))
        return ArrayType(element, True)
    return StringType()


def merge(a: DataType, b: DataType) -> DataType:
    """The type holding values of both ``a`` and ``b`` (Spark's JSON rules, simplified)."""
    if isinstance(a, NullType):
        return b
    if isinstance(b, NullType) or a == b:
        return a
    numbers = (LongType, DoubleType)
    if isinstance(a, numbers) and isinstance(b, numbers):
        return DoubleType()
    if isinstance(a, StructType) and isinstance(b, StructType):
        fields = {f.name: f.dataType for f in a.fields}
        for f in b.fields:
            fields[f.name] = merge(fields[f.name], f.dataType) if f.name in fields else f.dataType
        return StructType([StructField(k, t, True) for k, t in sorted(fields.items())])
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return ArrayType(merge(a.elementType, b.elementType), True)
    return StringType()


def _no_nulls(t: DataType) -> DataType:
    """A type seen only as null (or an empty array) becomes ``string``."""
    if isinstance(t, NullType):
        return StringType()
    if isinstance(t, StructType):
        return StructType([StructField(f.name, _no_nulls(f.dataType), True) for f in t.fields])
    if isinstance(t, ArrayType):
        return ArrayType(_no_nulls(t.elementType), True)
    return t


def infer_schema(documents: Iterable[dict[str, Any]]) -> StructType:
    """``_id``, the merged fields of ``documents`` (sorted by name), then ``_deleted``
    (always false in a batch read; a stream's deletions). An empty sample gives the two
    columns alone: give the schema with ``.schema(...)`` for an empty keyspace."""
    merged: DataType = StructType([])
    for doc in documents:
        merged = merge(merged, type_of(doc))
    assert isinstance(merged, StructType)
    fields = [f for f in _no_nulls(merged).fields if f.name not in (ID, DELETED)]  # type: ignore[union-attr]
    return StructType(
        [StructField(ID, StringType(), False), *fields, StructField(DELETED, BooleanType(), False)]
    )


# --- conversion ---------------------------------------------------------------------------

Coerce = Callable[[Any], Any]


def _as_long(v: Any) -> Any:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _as_double(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _as_string(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    return _encode.encode(v).decode()


def _as_bool(v: Any) -> Any:
    return v if isinstance(v, bool) else None


def _bounded(bits: int) -> Coerce:
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1)

    def f(v: Any) -> Any:
        n = _as_long(v)
        return n if n is not None and lo <= n < hi else None

    return f


def _as_float32(v: Any) -> Any:
    d = _as_double(v)
    return None if d is None or (math.isfinite(d) and abs(d) > 3.4e38) else d


def coercer(t: DataType, column: str) -> Coerce:
    """The function making a JSON value fit ``t`` (null when it cannot)."""
    simple: dict[type, Coerce] = {
        LongType: _as_long,
        IntegerType: _bounded(32),
        ShortType: _bounded(16),
        ByteType: _bounded(8),
        DoubleType: _as_double,
        FloatType: _as_float32,
        StringType: _as_string,
        BooleanType: _as_bool,
        NullType: lambda v: None,
    }
    for cls, f in simple.items():
        if isinstance(t, cls):
            return f
    if isinstance(t, BinaryType):
        return lambda v: v.encode() if isinstance(v, str) else None
    if isinstance(t, StructType):
        fields = [(f.name, coercer(f.dataType, f"{column}.{f.name}")) for f in t.fields]

        def struct(v: Any) -> Any:
            if not isinstance(v, dict):
                return None
            return {name: f(v.get(name)) for name, f in fields}

        return struct
    if isinstance(t, ArrayType):
        element = coercer(t.elementType, column + "[]")
        return lambda v: [element(x) for x in v] if isinstance(v, list) else None
    if isinstance(t, MapType) and isinstance(t.keyType, StringType):
        value = coercer(t.valueType, column + "{}")
        return lambda v: {k: value(x) for k, x in v.items()} if isinstance(v, dict) else None
    raise bad_option(
        f"column {column!r} has type {t.simpleString()}, which JSON documents cannot fill",
        "schema",
        hint="use string, long, int, double, float, boolean, binary, struct, array or "
        "map<string, ...> columns",
    )


class Converter:
    """JSON bodies to Arrow RecordBatches of ``schema`` (``_id`` and ``_deleted`` are filled
    from the change, not the body)."""

    def __init__(self, schema: StructType) -> None:
        self.schema = schema
        self.arrow = to_arrow_schema(schema, timezone="UTC")
        self._fields = [
            (f.name, None if f.name in (ID, DELETED) else coercer(f.dataType, f.name))
            for f in schema.fields
        ]

    def row(self, docid: str, body: bytes | dict[str, Any] | None, deleted: bool = False) -> dict:
        doc = body if isinstance(body, dict) else (_json.decode(body) if body else {})
        out: dict[str, Any] = {}
        for name, f in self._fields:
            if name == ID:
                out[name] = docid
            elif name == DELETED:
                out[name] = deleted
            else:
                assert f is not None
                out[name] = f(doc.get(name)) if isinstance(doc, dict) else None
        return out

    def batch(self, rows: Sequence[dict[str, Any]]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist(list(rows), schema=self.arrow)


def decode(body: bytes) -> Any:
    return _json.decode(body)
