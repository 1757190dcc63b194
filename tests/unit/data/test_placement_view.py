"""PlacementView never hands out a state older than one it has seen: on a node back from a
partition the local coordinator replica lags the majority's state (which ``quorum_state``
fetched), and reconciling from it would undo a failover of this node."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from shardex.data.placement import PlacementView
from shardex.meta.state import StateContext


def view_over(local: Any) -> PlacementView:
    return PlacementView(me="n3", coordinator=lambda: local, members=list, pool=None)  # type: ignore[arg-type]


async def test_an_older_local_replica_never_replaces_a_newer_majority_state() -> None:
    local = SimpleNamespace(state=StateContext(cas=4, epoch=1))
    view = view_over(local)
    majority = StateContext(cas=6, epoch=1, failed_over={"n3": 5})
    view.remember(majority)  # what quorum_state found after the partition healed
    assert await view.refresh() is majority and view.cached is majority
    assert await view.state() is majority
    caught_up = StateContext(cas=7, epoch=1)
    local.state = caught_up  # the replica caught up: it leads again
    assert await view.refresh() is caught_up and view.cached is caught_up


async def test_a_later_epoch_wins_over_a_higher_cas() -> None:
    local = SimpleNamespace(state=StateContext(cas=9, epoch=1))
    view = view_over(local)
    newer_term = StateContext(cas=8, epoch=2)
    view.remember(newer_term)
    assert await view.refresh() is newer_term
