"""Ejecting a manager node: the coordinator-voter side of ``shardex rebalance --eject``.

Admitting a manager that joined is the master's housekeeping (``ReplicationGroup._admit``);
removing one is this module, called by the eject (``eject.py``, ``rebalance.py``):

* at the start, ``check_manager_eject`` refuses an eject of more than one manager (one voter
  change per commit), of the last voter, or one that would leave fewer than a majority of the
  remaining voters up in the master's view (the removal itself could not commit);
* when the drain is done, ``retire_ejected`` gives the state the eject's final commit carries:
  the manager out of ``StateContext.voters`` and its member id retired. From that commit on
  it never counts; the master tombstones it in the member list at its next tick (if the
  master ejected itself, it steps down after that commit and the next master does it).

Rules and reasoning: ``meta/voter_set.py``, ``docs/decisions/0089-committed-voter-set.md``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from shardex.api.errors import BadRequest
from shardex.meta.member_list import UP, MemberInfo
from shardex.meta.state import StateContext
from shardex.meta.voter_set import removal_refusal, retire


def _managers(members: Mapping[str, MemberInfo], eject: list[str]) -> list[str]:
    return [n for n in eject if n in members and "manager" in members[n].services]


def up_voters(ctx: Any) -> list[str]:
    """The committed voters up in the master's view (the master itself included)."""
    membership = ctx.membership
    now = asyncio.get_running_loop().time()
    by_id = {m.member_id: m for m in membership.members}
    up = []
    for name, member_id in ctx.state.voters.items():
        member = by_id.get(member_id)
        if name == ctx.node_name or (
            member is not None and membership.state_of(member_id, now)[0] == UP
        ):
            up.append(name)
    return sorted(up)


def check_manager_eject(ctx: Any, eject: list[str], members: Mapping[str, MemberInfo]) -> None:
    """Refuse (BAD_REQUEST / NODE_UNAVAILABLE, with the counts and a hint) an eject whose
    manager nodes cannot leave the voters now."""
    managers = _managers(members, eject)
    if len(managers) > 1:
        raise BadRequest(
            f"cannot eject {', '.join(managers)} together: they are manager nodes, and the "
            "coordinator's voters change one manager at a time",
            details={"managers": managers, "hint": "eject them one after the other"},
        )
    for name in managers:
        refusal = removal_refusal(ctx.state.voters, name, up_voters(ctx))
        if refusal is not None:
            raise refusal


def retire_ejected(ctx: Any, eject: list[str]) -> tuple[StateContext, str]:
    """The state with the ejected manager nodes retired from the voters, and "" ; or the
    current state and why not (checked again: managers may have gone down during the
    drain)."""
    members = {m.name: m for m in ctx.membership.members}
    state = ctx.state
    for name in _managers(members, eject):
        refusal = removal_refusal(state.voters, name, up_voters(ctx))
        if refusal is not None:
            return ctx.state, refusal.message
        state = retire(state, name, members[name].member_id)
    return state, ""
