"""``LeafSpec``: what a ``sql.leaf`` fragment runs, as objects.

A leaf on another member gets its arguments as a fragment's wire dict (``leaf_spec`` reads
them: spans and TS decoded, the statement bound from its text); a leaf run in-process on the
initiator (``local_leaf``) gets them straight from the plan (``PhysicalPlan.leaf_spec``):
the same values, without encoding the spans and the TS into a dict and decoding them back,
binding the statement again or checking the tuning switches again, per execution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardex.core.expr import static_path
from shardex.core.expr.analysis import Path
from shardex.core.spans import Span
from shardex.core.timestamp import Timestamp
from shardex.meta.array_key import is_array_key_text
from shardex.sql.exec.statements import bound_statement, prepared_off_loop
from shardex.sql.exec.tuning import check_tuning
from shardex.sql.planner.choose import key_exprs
from shardex.sql.syntax.bind import BoundSelect

__all__ = ["LeafSpec", "leaf_spec"]


@dataclass(frozen=True)
class LeafSpec:
    b: BoundSelect
    keyspace: str
    index_id: str
    partitions: list[int]
    spans: list[Span] | None  # None: the whole index
    ts: Timestamp | None  # the snapshot read (None: the tips)
    desc: list[bool]
    key_paths: list[Path | None]  # each key part's document path (covering rows)
    once: bool  # an array index: a document's entries repeat its docid, fetch it once
    covering: bool
    ordered: bool  # entries stream in ORDER BY order: no local sort
    decided: bool  # the spans decide WHERE (``planner.exact``): no filter
    late: bool  # rank on the entries, send sort keys and docids (decision 0111)
    mode: str
    top: int | None
    budget: int
    spill: bool
    tuning: dict[str, bool]


def key_paths_of(keys: list[Any]) -> list[Path | None]:
    """Each index key part's document path (None: not a plain path)."""
    return [static_path(k) for k in key_exprs(tuple(keys))]


async def leaf_spec(a: dict[str, Any]) -> LeafSpec:
    """The ``LeafSpec`` of a ``sql.leaf`` fragment's wire arguments ``a``
    (``PhysicalPlan.query_plan``)."""
    tuning = check_tuning(a.get("tuning"))
    sql, dml = a["sql"], a["dml"]
    b = await prepared_off_loop(sql, lambda: bound_statement(sql, dml, cached=tuning["plan_cache"]))
    spans = None
    if a["spans"]:
        spans = [Span(lo, hi, li, hi_inc) for lo, hi, li, hi_inc in a["spans"]]
    return LeafSpec(
        b=b,
        keyspace=a["keyspace"],
        index_id=a["index_id"],
        partitions=a["partitions"],
        spans=spans,
        ts=None if a["ts"] is None else Timestamp.from_wire(a["ts"]),
        desc=list(a["desc"]),
        key_paths=key_paths_of(a["keys"]),
        once=any(is_array_key_text(k) for k in a["keys"]),
        covering=a["covering"],
        ordered=bool(a.get("ordered")),
        decided=bool(a.get("decided")),
        late=bool(a.get("late")),
        mode=a["mode"],
        top=a["top"],
        budget=a["budget"],
        spill=a.get("spill", True),
        tuning=tuning,
    )
