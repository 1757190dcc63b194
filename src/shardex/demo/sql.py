"""Demo step: SQL++ queries across the cluster at request_plus, each with its EXPLAIN.

For each query: the statement, the distributed plan in a few readable lines (the index the
planner chose and why it can serve the query, its spans, whether the scan is covering, the
fragments on each node with their operators, the exchanges), then the rows as a table with
the query's metrics. ``format_explain`` is pure (``tests/unit/demo/test_demo_sql.py``).

    python -m shardex.demo.sql DIR
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from rich.console import Console
from rich.text import Text

from shardex.cli.sql import describe_metrics, render_rows
from shardex.client import connect_local

# (what it shows, statement): the by_city index is (address.city, age) partitioned by docid,
# by_status is (status, age DESC) over adults only.
QUERIES: Final[tuple[tuple[str, str], ...]] = (
    (
        "a filter (partial index by_status: its WHERE age >= 18 is implied by the query)",
        'SELECT META().id AS id, name, age, plan FROM users WHERE status = "suspended" '
        "AND age >= 18 AND age BETWEEN 68 AND 70",
    ),
    (
        "ORDER BY with LIMIT (top-N on every node, merged on the initiator)",
        "SELECT name, age, signup_date FROM users "
        'WHERE address.city = "Copenhagen" ORDER BY age DESC, name LIMIT 5',
    ),
    (
        "GROUP BY with COUNT and AVG (partial aggregates per node, final on the initiator)",
        "SELECT address.city AS city, COUNT(*) AS users, ROUND(AVG(age), 1) AS avg_age "
        "FROM users WHERE address.city IS NOT NULL GROUP BY address.city "
        "ORDER BY users DESC LIMIT 6",
    ),
    (
        "a covering query (every field it uses is an index key: no document fetch)",
        "SELECT address.city AS city, COUNT(*) AS over_60, MIN(age) AS youngest, "
        "MAX(age) AS oldest FROM users "
        'WHERE address.city IN ["Austin", "Lyon", "Osaka"] AND age >= 60 '
        "GROUP BY address.city ORDER BY city",
    ),
)


def _value(v: Any) -> str:
    return "-inf/+inf" if v is None else json.dumps(v, ensure_ascii=False)


def format_span(span: Mapping[str, Any]) -> str:
    """``{"low", "high", "inclusion"}`` as an interval, e.g. ``["Lyon", 85] .. ["Lyon"]]``.
    A missing or None bound is an open end; a shorter bound covers the leading key parts."""
    inclusion = span.get("inclusion", "both")
    lo_in = inclusion in ("both", "low")
    hi_in = inclusion in ("both", "high")
    low, high = span.get("low"), span.get("high")
    if low is not None and low == high and lo_in and hi_in:
        return f"= {_value(low)}"
    left = "[" if lo_in and low is not None else "("
    right = "]" if hi_in and high is not None else ")"
    lo = _value(low) if low is not None else "-inf"
    hi = _value(high) if high is not None else "+inf"
    return f"{left}{lo} .. {hi}{right}"


def format_explain(plan: Mapping[str, Any], max_spans: int = 4) -> list[str]:
    """The ``distributed`` part of an EXPLAIN result as readable lines."""
    dist = plan.get("distributed")
    if not isinstance(dist, Mapping):
        return ["(no distributed plan)"]
    lines: list[str] = []
    index = dist.get("index")
    if isinstance(index, Mapping):
        keys = ", ".join(index.get("keys") or [])
        kind = "primary index" if index.get("primary") else f"index {index['name']}({keys})"
        covering = "covering" if index.get("covering") else "fetches documents"
        lines.append(f"{kind}, {covering}")
        spans: Sequence[Mapping[str, Any]] = index.get("spans") or []
        shown = ", ".join(format_span(s) for s in spans[:max_spans])
        more = f" and {len(spans) - max_spans} more" if len(spans) > max_spans else ""
        lines.append(f"spans (index order): {shown}{more}" if spans else "spans: the whole index")
    else:
        lines.append(f"source: {dist.get('source')} (no index scan)")
    for f in dist.get("fragments") or []:
        where = f"on {f['on']}"
        parts = f.get("partitions")
        if parts:
            where += f" (slices {', '.join(str(p) for p in parts)})"
        feeds = f" <- fragments {', '.join(str(i) for i in f['inputs'])}" if f.get("inputs") else ""
        does = " -> ".join(f.get("does") or [])
        lines.append(f"fragment {f['fragment']} {f['kind']} {where}: {does}{feeds}")
    edges = dist.get("exchanges") or []
    if edges:
        shown = ", ".join(f"{e['from']} -> {e['to']}" for e in edges)
        lines.append(f"exchanges ({edges[0].get('kind', 'unicast')}): {shown}")
    return lines


def run(cluster_dir: str) -> None:
    console = Console(width=110)
    with connect_local(cluster_dir, name="demo-sql") as client:
        for i, (what, statement) in enumerate(QUERIES, start=1):
            console.print(Text(f"\n{i}. {what}", style="bold"), soft_wrap=True)
            console.print(Text(f"   {statement}", style="green"), soft_wrap=True)
            (plan,) = list(client.query("EXPLAIN " + statement))
            for line in format_explain(plan):
                console.print(Text(f"   EXPLAIN  {line}", style="dim cyan"), soft_wrap=True)
            result = client.query(statement, consistency="request_plus")
            rows = list(result)
            if rows:
                console.print(render_rows(rows))
            console.print(Text(f"   {describe_metrics(result.metrics, len(rows))}", style="dim"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cluster_dir")
    args = ap.parse_args(argv)
    run(args.cluster_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
