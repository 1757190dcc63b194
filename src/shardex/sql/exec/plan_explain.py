"""EXPLAIN of a physical plan: what the statement does, which index and spans it reads, and
its fragments (the root on the initiator, a leaf per indexer node) with their steps and the
exchanges between them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardex.sql.exec.join_plan import explain_join
from shardex.sql.exec.plan_kinds import INLINE_KEYS, LEAF_KIND, ROOT_KIND
from shardex.sql.exec.subquery_inputs import inputs_of
from shardex.sql.syntax.explain import explain_select

if TYPE_CHECKING:
    from shardex.sql.exec.plan import PhysicalPlan

__all__ = ["explain_plan"]


def explain_plan(self: PhysicalPlan) -> dict[str, Any]:
    """EXPLAIN of a planned SELECT: the bound statement's operators, the index and its
    spans, the fragments, their steps and their exchanges; the queries its subqueries'
    inputs are read by first (``subquery_inputs``)."""
    out = explain_join(self, self.join) if self.join is not None else _explain_scan(self)
    inputs = inputs_of(self.bound)
    if inputs:
        out.setdefault("distributed", {})["subquery_inputs"] = [
            {
                "reads": "documents (side statement)" if one.gathers else "its value",
                "statement": one.text,
                "on": "initiator, before the statement, at its consistency",
            }
            for one in inputs
        ]
    return out


def _explain_scan(self: PhysicalPlan) -> dict[str, Any]:
    out = explain_select(self.bound)
    dist: dict[str, Any] = {"mode": self.mode, "source": self.source}
    if self.choice is not None and self.record is not None:
        defn = self.record.definition
        dist["index"] = {
            "name": defn.name,
            "keys": [k.expr for k in defn.keys],
            "primary": defn.is_primary,
            "covering": self.choice.covering,
            "spans": self.spans,
            "index_order": self.ordered,
            "late_fetch": self.late,
            "spans_decide_where": self.decided,
        }
    fragments = [
        {
            "fragment": 0,
            "kind": ROOT_KIND,
            "on": "initiator",
            "does": _root_does(self),
            "inputs": list(range(1, len(self.leaves) + 1)),
        }
    ]
    for i, leaf in enumerate(self.leaves, start=1):
        fragments.append(
            {
                "fragment": i,
                "kind": LEAF_KIND,
                "on": leaf.node,
                "partitions": leaf.partitions,
                "does": _leaf_does(self),
                "output": i,
            }
        )
    dist["fragments"] = fragments
    if self.source == "keys" and self.tuning["inline"]:
        # Decided per execution (the number of keys may come from a parameter).
        dist["fast_path"] = {
            "kind": "InlineKeyLookup",
            "on": "initiator",
            "max_keys": INLINE_KEYS,
            "does": ["GetMany per owner", *_root_does(self)[1:]],
            "otherwise": "fragment 0",
        }
    dist["exchanges"] = [
        {"edge": i, "from": leaf.node, "to": "initiator", "kind": "unicast"}
        for i, leaf in enumerate(self.leaves, start=1)
    ]
    out["distributed"] = dist
    return out


def _leaf_does(p: PhysicalPlan) -> list[str]:
    assert p.choice is not None
    steps = ["IndexScan" + (" (covering)" if p.choice.covering else ""), "Fetch"]
    if p.late:
        steps = ["IndexScan (keys)"]  # ranked on the entries alone; the root fetches
    elif p.choice.covering:
        steps.pop()
    if p.bound.unnests:
        steps.append("Unnest")  # per document: each leaf unnests what it read
    if not p.decided:  # else the spans decide WHERE (``planner.exact``)
        steps.append("Filter")
    if p.ordered:
        steps.append("IndexOrder")  # entries already in ORDER BY order: no local sort
    else:
        steps.append(
            {
                "group": "PartialAggregate",
                "sort": "LocalSort",
                "rows": "Project",
                "window": "ScopeRows",  # every row after WHERE: the root windows them
            }.get(p.mode, p.mode)
        )
    if p.top is not None:
        steps.append(f"Limit({p.top})")
    if p.late:
        steps.append("SortKeysAndIds")
    return steps


def _root_does(p: PhysicalPlan) -> list[str]:
    steps = {
        "group": ["FinalAggregate", "Project"],
        "sort": ["MergeSort"],
        "rows": ["Concat"],
        "window": ["Concat", "Window", "Project"],
        "local": ["LocalScan" if p.source != "keys" else "KeyLookup", "Filter", "Project"],
    }[p.mode]
    if p.mode == "local" and p.bound.unnests:
        steps.insert(1, "Unnest")
    if p.mode in ("group", "local") and p.bound.windows:
        steps.insert(len(steps) - 1, "Window")
    if p.late:
        steps = ["MergeSort", "Fetch (GetMany per owner, top rows only)", "Filter", "Project"]
    if p.bound.distinct:
        steps.append("Distinct")
    if p.mode in ("group", "local") and p.bound.order:
        steps.append("Order")
    if p.offset:
        steps.append(f"Offset({p.offset})")
    if p.limit is not None:
        steps.append(f"Limit({p.limit})")
    return steps
