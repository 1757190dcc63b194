"""Spark's pushed filters as an index scan: which filters an index serves, its spans, and
the recheck of the fetched rows.

The index choice and the spans are the SQL planner's (``sql/planner``: ``choose_index``,
``constrain_keys``, ``key_spans``): each filter Spark offers is written as the SQL++ term it
means (``age >= 30``, ``META().id IN [...]``, ``name LIKE "Jo%"``), the planner picks the
index as it would for that WHERE clause (``index`` option: ``USE INDEX``), and the filters
that constrain one of its key parts are pushed; the others stay with Spark.

Exactness: Spark does not re-evaluate a pushed filter, so the reader does (``matches``), on
the row as Spark sees it (values coerced to the column types, ``schema.py``); the spans only
need to be a superset. They are, for the filters taken here: a numeric or boolean column's
value that is not a number or boolean is null in the row, which no comparison accepts; a
``string`` column shows a non-string as its JSON text, which the spans over strings would
miss, so a string filter is pushed only when no JSON text of a non-string could satisfy it
(equality with a text that is not JSON, a prefix no such text starts with; never a range).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from shardex.api.coordinator import StateReply, StateRequest
from shardex.client import Client
from shardex.core.expr import Expr, parse_expression
from shardex.core.expr.ast import And
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_definition import IndexDefinition
from shardex.meta.index_state import ACTIVE
from shardex.spark.schema import ID
from shardex.sql.planner.choose import IndexChoice, choose_index
from shardex.sql.planner.key_ranges import key_spans
from shardex.sql.planner.sargable import atom_for, constrain_keys

_NUMBERS = (LongType, IntegerType, ShortType, ByteType, DoubleType, FloatType)
_COMPARE = {
    EqualTo: "=",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}


@dataclass(frozen=True)
class IndexPlan:
    """The index scan serving the pushed filters: pickled into the reader."""

    index: str
    spans: list[dict[str, Any]]
    pushed: tuple[Filter, ...]


def column_type(schema: StructType, column: tuple[str, ...]) -> DataType | None:
    t: DataType = schema
    for name in column:
        if not isinstance(t, StructType) or name not in t.names:
            return None
        t = t[name].dataType
    return t


def _path(column: tuple[str, ...]) -> str:
    if column == (ID,):
        return "META().id"
    return ".".join("`" + c.replace("`", "``") + "`" for c in column)


def _number(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return not (isinstance(v, float) and not math.isfinite(v))


def _json_of_non_string(text: str) -> bool:
    """Whether ``text`` could be how a string column shows a non-string value."""
    try:
        return not isinstance(json.loads(text), str)
    except ValueError:
        return False


def _prefix_of_non_string(prefix: str) -> bool:
    if not prefix or prefix[0] in "-0123456789[{":
        return True
    return any(word.startswith(prefix) for word in ("true", "false", "null"))


def _literal(t: DataType, v: Any) -> str | None:
    """``v`` as an SQL++ literal a ``t`` column's filter may push, or None."""
    if isinstance(t, _NUMBERS):
        return repr(v) if _number(v) else None
    if isinstance(t, BooleanType):
        return ("TRUE" if v else "FALSE") if isinstance(v, bool) else None
    if isinstance(t, StringType) and isinstance(v, str):
        return json.dumps(v)
    return None


def term_of(f: Filter, schema: StructType) -> str | None:
    """The SQL++ term ``f`` means, if it can be pushed (see the module doc), else None."""
    column = getattr(f, "attribute", None)
    if not isinstance(column, tuple):
        return None
    t = column_type(schema, column)
    if t is None:
        return None
    is_id = column == (ID,)
    path = _path(column)
    if type(f) in _COMPARE:
        value = f.value  # type: ignore[attr-defined]
        risky = type(f) is not EqualTo or not isinstance(value, str) or _json_of_non_string(value)
        if isinstance(t, StringType) and not is_id and risky:
            return None
        lit = _literal(t, value)
        return None if lit is None else f"{path} {_COMPARE[type(f)]} {lit}"
    if isinstance(f, In):
        values = list(f.value)
        if not values:
            return None
        safe = all(isinstance(v, str) and not _json_of_non_string(v) for v in values)
        if isinstance(t, StringType) and not is_id and not safe:
            return None
        lits = [_literal(t, v) for v in values]
        if any(lit is None for lit in lits):
            return None
        return f"{path} IN [{', '.join(lits)}]"  # type: ignore[arg-type]
    if isinstance(f, StringStartsWith) and isinstance(t, StringType):
        prefix = f.value
        if any(c in prefix for c in "%_\\") or (not is_id and _prefix_of_non_string(prefix)):
            return None
        return f"{path} LIKE {json.dumps(prefix + '%')}"
    return None


def active_indexes(client: Client, keyspace: str) -> list[IndexDefinition]:
    """The keyspace's indexes that serve scans (ACTIVE), as the planner wants them."""
    rpc = client.rpc
    msg = StateRequest(sections=["indexes"], fresh=True)
    state = rpc.run(rpc.request(msg, StateReply, True)).state
    return [
        rec.definition
        for rec in state.indexes.values()
        if rec.keyspace == keyspace and rec.state == ACTIVE
    ]


def plan_index(
    filters: Sequence[Filter],
    schema: StructType,
    indexes: Sequence[IndexDefinition],
    *,
    keyspace: str,
    use_index: str | None,
) -> IndexPlan | None:
    """The index scan for ``filters`` (the planner's choice, ``use_index`` forced), or None
    when no index serves them: then nothing is pushed and the read is the snapshot's. A
    forced index that cannot serve them is INDEX_NOT_FOUND, with the planner's hint."""
    terms: list[tuple[Filter, Expr]] = []
    for f in filters:
        text = term_of(f, schema)
        if text is not None:
            terms.append((f, parse_expression(text)))
    where = _conjunction([e for _, e in terms])
    try:
        choice = choose_index(
            indexes, where, keyspace=keyspace, read_paths=None, use_index=use_index
        )
    except ShardexError as exc:
        if use_index is None and exc.code is ErrorCode.INDEX_NOT_FOUND:
            return None
        if exc.code is not ErrorCode.INDEX_NOT_FOUND or "does not exist" in exc.message:
            raise
        raise ShardexError(
            f"option 'index': index {use_index!r} cannot serve this read of {keyspace!r}: "
            "no filter Spark pushes constrains its leading key (a document without that "
            "key has no entry); hint: filter on the index's leading key, or drop the option",
            code=exc.code,
            details={**exc.details, "index": use_index, "option": "index"},
        ) from None
    pushed = [(f, e) for f, e in terms if _constrains(e, choice)]
    if not pushed and use_index is None:
        return None  # the primary index, chosen for want of another: the snapshot is better
    spans = key_spans(_per_key(choice, [e for _, e in pushed]), choice.definition.desc)
    return IndexPlan(choice.definition.name, spans, tuple(f for f, _ in pushed))


def _conjunction(terms: Sequence[Expr]) -> Expr | None:
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else And(tuple(terms))


def _constrains(term: Expr, choice: IndexChoice) -> bool:
    return any(atom_for(term, key) is not None for key in choice.keys)


def _per_key(choice: IndexChoice, terms: Sequence[Expr]) -> list[list[Any]]:
    return constrain_keys(_conjunction(terms), choice.keys)


# --- the recheck --------------------------------------------------------------------------


def _value(row: dict[str, Any], column: tuple[str, ...]) -> Any:
    v: Any = row
    for name in column:
        if not isinstance(v, dict):
            return None
        v = v.get(name)
    return v


def matches(row: dict[str, Any], filters: Sequence[Filter]) -> bool:
    """Whether Spark would keep ``row`` under every filter of ``filters`` (the ones
    ``term_of`` pushes; a comparison with null is not true)."""
    for f in filters:
        v = _value(row, f.attribute)  # type: ignore[attr-defined]
        if v is None:
            return False
        lit = getattr(f, "value", None)
        if isinstance(f, EqualTo):
            ok = v == lit
        elif isinstance(f, GreaterThan):
            ok = v > lit
        elif isinstance(f, GreaterThanOrEqual):
            ok = v >= lit
        elif isinstance(f, LessThan):
            ok = v < lit
        elif isinstance(f, LessThanOrEqual):
            ok = v <= lit
        elif isinstance(f, In):
            ok = v in f.value
        elif isinstance(f, StringStartsWith):
            ok = isinstance(v, str) and v.startswith(f.value)
        else:
            ok = False
        if not ok:
            return False
    return True
