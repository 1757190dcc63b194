"""The scan coordinator's choice of copy per index partition (``failover.placement``)."""

from __future__ import annotations

import pytest

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.scan.failover import failed_node as _failed_node
from shardex.scan.failover import placement as _placement

TOPO = Topology(seq_num=3, assignment={0: "a", 1: "b", 2: "c"}, replicas={0: ["b"], 1: ["c"]})


def test_primaries_first_then_the_next_copy_of_a_failed_node() -> None:
    assert _placement("ix", TOPO, [0, 1, 2]) == {"a": [0], "b": [1], "c": [2]}
    assert _placement("ix", TOPO, [0, 1, 2], {"b"}) == {"a": [0], "c": [1, 2]}
    with pytest.raises(ShardexError) as err:
        _placement("ix", TOPO, [0, 1], {"a", "b"})
    assert err.value.code is ErrorCode.NODE_UNAVAILABLE
    assert err.value.details["partition"] == 0 and err.value.details["copies"] == ["a", "b"]
    with pytest.raises(ShardexError) as err:
        _placement("ix", TOPO, [5])
    assert err.value.code is ErrorCode.INDEX_NOT_READY


def test_only_node_failures_name_a_node_to_avoid() -> None:
    down = NodeUnavailable("b is down", details={"indexer": "b"})
    assert _failed_node(down) == "b"
    refused = ShardexError("no", code=ErrorCode.SCAN_TIMEOUT, details={"indexer": "b"})
    assert _failed_node(refused) is None
    assert _failed_node(NodeUnavailable("down", details={})) is None
