"""The one retry rule of slice requests addressed by index topology (``scan/topology_retry.py``),
used by the scan coordinator's ``ScanSlices`` and the paging proxy's first-page
``WaitStability``: an old owner's STALE_TOPOLOGY / INDEX_NOT_FOUND is retried on the fresh
topology's owner; everything else, a re-created index and a gone index are raised."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.index import make_definition
from shardex.meta.index_state import ACTIVE, IndexRecord
from shardex.scan.topology_retry import on_fresh_topology

DEFN = make_definition(
    id="ix", name="by_k", keyspace="ks", keys=["k"], partition_by=["k"], num_partition=2
)
REC = IndexRecord(definition=DEFN, state=ACTIVE)
OLD = Topology(seq_num=1, assignment={0: "n1", 1: "n1"})
NEW = Topology(seq_num=2, assignment={0: "n1", 1: "n2"})


def _owners(moved_to: dict[int, str]) -> Callable[[Topology], Awaitable[list[str]]]:
    """Slices answering like indexers do: a partition asked of a node it left is refused."""

    async def ask(topo: Topology) -> list[str]:
        for p, node in topo.assignment.items():
            if moved_to.get(p, node) != node:
                raise ShardexError(
                    f"slice ix/{p} moved away from {node}",
                    code=ErrorCode.STALE_TOPOLOGY,
                    details={"node": node},
                )
        return sorted(set(topo.assignment.values()))

    return ask


def _fresh(*answers: tuple[IndexRecord, Topology]) -> Callable[[], Awaitable[tuple]]:
    it = iter(answers)
    calls: list[int] = []

    async def resolve() -> tuple[IndexRecord, Topology]:
        calls.append(1)
        return next(it)

    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


def _run(aw: Awaitable[object]) -> object:
    return asyncio.run(aw)  # type: ignore[arg-type]


def test_a_moved_partition_is_asked_of_its_new_owner() -> None:
    resolve = _fresh((REC, NEW))
    got = _run(on_fresh_topology(REC, OLD, _owners({1: "n2"}), resolve, attempts=3))
    assert got == ["n1", "n2"] and len(resolve.calls) == 1  # type: ignore[attr-defined]


def test_the_switch_being_committed_is_waited_for() -> None:
    # The old owner refuses before this node can read the new topology: same seq, retry.
    resolve = _fresh((REC, OLD), (REC, NEW))
    got = _run(on_fresh_topology(REC, OLD, _owners({1: "n2"}), resolve, attempts=3))
    assert got == ["n1", "n2"]


def test_attempts_are_bounded() -> None:
    resolve = _fresh((REC, OLD), (REC, OLD), (REC, OLD))
    with pytest.raises(ShardexError) as err:
        _run(on_fresh_topology(REC, OLD, _owners({1: "n2"}), resolve, attempts=3))
    assert err.value.code is ErrorCode.STALE_TOPOLOGY
    assert len(resolve.calls) == 2  # type: ignore[attr-defined]


def test_a_recreated_or_dropped_index_and_other_errors_are_raised() -> None:
    other = IndexRecord(
        definition=make_definition(id="ix2", name="by_k", keyspace="ks", keys=["k"]),
        state=ACTIVE,
    )
    with pytest.raises(ShardexError) as err:
        _run(on_fresh_topology(REC, OLD, _owners({1: "n2"}), _fresh((other, NEW)), attempts=3))
    assert err.value.code is ErrorCode.STALE_TOPOLOGY

    async def gone(topo: Topology) -> list[str]:
        raise ShardexError("no index ix", code=ErrorCode.INDEX_NOT_FOUND, details={})

    # INDEX_NOT_FOUND with no newer topology: the index itself is gone, not moved.
    with pytest.raises(ShardexError) as err:
        _run(on_fresh_topology(REC, OLD, gone, _fresh((REC, OLD)), attempts=3))
    assert err.value.code is ErrorCode.INDEX_NOT_FOUND

    async def too_old(topo: Topology) -> list[str]:
        raise ShardexError("released", code=ErrorCode.SNAPSHOT_TOO_OLD, details={})

    resolve = _fresh()
    with pytest.raises(ShardexError) as err:
        _run(on_fresh_topology(REC, OLD, too_old, resolve, attempts=3))
    assert err.value.code is ErrorCode.SNAPSHOT_TOO_OLD
    assert resolve.calls == []  # type: ignore[attr-defined]
