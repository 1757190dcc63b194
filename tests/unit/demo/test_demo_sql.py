"""The demo's readable EXPLAIN (``shardex.demo.sql.format_explain``) over plans shaped like
``PhysicalPlan.explain`` returns."""

from __future__ import annotations

from shardex.demo.sql import format_explain, format_span


def test_spans_as_intervals() -> None:
    assert format_span({"low": ["Lyon"], "high": ["Lyon"], "inclusion": "both"}) == '= ["Lyon"]'
    assert (
        format_span({"low": ["Lyon", 85], "high": ["Lyon"], "inclusion": "both"})
        == '[["Lyon", 85] .. ["Lyon"]]'
    )
    assert format_span({"low": [1], "high": None, "inclusion": "low"}) == "[[1] .. +inf)"
    assert format_span({"low": None, "high": [9], "inclusion": "neither"}) == "(-inf .. [9])"
    assert format_span({"low": [1], "high": [1], "inclusion": "low"}) == "[[1] .. [1])"


def _plan(spans: list[dict], covering: bool) -> dict:
    return {
        "plan": [],
        "distributed": {
            "mode": "group",
            "source": "index",
            "index": {
                "name": "by_city",
                "keys": ["address.city", "age"],
                "primary": False,
                "covering": covering,
                "spans": spans,
            },
            "fragments": [
                {
                    "fragment": 0,
                    "kind": "sql.root",
                    "on": "initiator",
                    "does": ["FinalAggregate", "Project"],
                    "inputs": [1, 2],
                },
                {
                    "fragment": 1,
                    "kind": "sql.leaf",
                    "on": "node1",
                    "partitions": [0, 3],
                    "does": ["IndexScan (covering)", "Filter", "PartialAggregate"],
                    "output": 1,
                },
                {
                    "fragment": 2,
                    "kind": "sql.leaf",
                    "on": "node2",
                    "partitions": [1],
                    "does": ["IndexScan (covering)", "Filter", "PartialAggregate"],
                    "output": 2,
                },
            ],
            "exchanges": [
                {"edge": 1, "from": "node1", "to": "initiator", "kind": "unicast"},
                {"edge": 2, "from": "node2", "to": "initiator", "kind": "unicast"},
            ],
        },
    }


def test_explain_names_index_spans_fragments_and_exchanges() -> None:
    spans = [{"low": ["Lyon", 85], "high": ["Lyon"], "inclusion": "both"}]
    lines = format_explain(_plan(spans, covering=True))
    assert lines[0] == "index by_city(address.city, age), covering"
    assert lines[1] == 'spans (index order): [["Lyon", 85] .. ["Lyon"]]'
    assert lines[2] == (
        "fragment 0 sql.root on initiator: FinalAggregate -> Project <- fragments 1, 2"
    )
    assert lines[3] == (
        "fragment 1 sql.leaf on node1 (slices 0, 3): "
        "IndexScan (covering) -> Filter -> PartialAggregate"
    )
    assert lines[-1] == "exchanges (unicast): node1 -> initiator, node2 -> initiator"


def test_explain_of_a_fetching_scan_and_many_spans() -> None:
    spans = [{"low": [c], "high": [c], "inclusion": "both"} for c in "abcdef"]
    lines = format_explain(_plan(spans, covering=False), max_spans=2)
    assert lines[0].endswith("fetches documents")
    assert lines[1] == 'spans (index order): = ["a"], = ["b"] and 4 more'
    assert format_explain(_plan([], covering=False))[1] == "spans: the whole index"


def test_explain_without_an_index_scan() -> None:
    plan = {"distributed": {"mode": "local", "source": "keys", "fragments": []}}
    assert format_explain(plan) == ["source: keys (no index scan)"]
    assert format_explain({"plan": []}) == ["(no distributed plan)"]
