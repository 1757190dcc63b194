"""The first reply of a SELECT (``SqlStarted``, without its rows): the plan's shape for the
client's metrics and the routing hint the client keeps for the statement's text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from shardex.api.scan import NO_TS
from shardex.api.sql_exec import SqlQuery, SqlStarted
from shardex.core.timestamp import Timestamp
from shardex.errors import ShardexError
from shardex.sql.exec.analyze import key_route
from shardex.sql.exec.plan import PhysicalPlan, statement_facts

__all__ = ["index_name", "started_reply"]


def index_name(plan: PhysicalPlan) -> str | None:
    return None if plan.record is None else plan.record.definition.name


def started_reply(
    msg: SqlQuery,
    plan: PhysicalPlan,
    ts: Timestamp | None,
    node: str,
    address: Callable[[str], str],
) -> SqlStarted:
    """``node``: this node (the initiator); ``address``: a node's address by name."""
    return SqlStarted(
        stream_id=msg.stream_id,
        statement="select",
        index=index_name(plan),
        ts=NO_TS if ts is None else msgspec.Raw(ts.packed()),
        details={
            "mode": plan.mode,
            "source": plan.source,
            "leaves": len(plan.leaves),
            "index_order": plan.ordered,
            "query_id": plan.query_id,
            "inline": plan.inline,
            "local": plan.local,
            "guessed": plan.guessed is not None,
            "calls": plan.called,
            "point": plan.point,
            "node": node,
            # A join statement: joined between fragments ("hash") or at the initiator.
            **({"join": plan.join.ran or "initiator"} if plan.join is not None else {}),
            **route_hint(plan, address),
        },
    )


def route_hint(plan: PhysicalPlan, address: Callable[[str], str]) -> dict[str, Any]:
    """The routing hint of a plan (``client.routes``): with one leaf elsewhere,
    ``{"route": its node's address}``, where the statement runs in-process
    (``local_leaf``); for a key lookup of one key given as a parameter, ``{"route_key":
    keyspace and parameter}``: the key's owner reads the document in-process. Only a
    hint: the plan is made again wherever the statement arrives."""
    if not plan.tuning["local"]:
        return {}
    if plan.inline:
        route = key_route(plan.bound, statement_facts(plan.bound).key_lookup)
        if route is not None:
            return {"route_key": {"keyspace": route[0], "param": route[1]}}
        return {}
    if plan.local or len(plan.leaves) != 1:
        return {}
    try:
        return {"route": address(plan.leaves[0].node)}
    except ShardexError:
        return {}
