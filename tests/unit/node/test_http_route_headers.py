"""The routing hint of a statement's start reply as HTTP response headers: the key lookup's
keyspace and parameter, the node of the one index leaf (or this node, where it ran
in-process), nothing otherwise."""

from __future__ import annotations

from shardex.node.http.route_headers import ROUTE_KEYSPACE, ROUTE_NODE, ROUTE_PARAM, route_headers


def test_route_headers() -> None:
    by_key = {"route_key": {"keyspace": "people", "param": "1"}, "local": True}
    assert route_headers(by_key, "h:1") == {ROUTE_KEYSPACE: "people", ROUTE_PARAM: "1"}
    assert route_headers({"route": "n2:7101", "local": False}, "h:1") == {ROUTE_NODE: "n2:7101"}
    assert route_headers({"local": True}, "n1:7100") == {ROUTE_NODE: "n1:7100"}
    assert route_headers({"leaves": 3, "local": False}, "n1:7100") == {}
    assert route_headers({"route_key": {"keyspace": "people"}}, "n1:7100") == {}
