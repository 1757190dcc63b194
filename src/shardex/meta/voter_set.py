"""The coordinator's voter set: which manager nodes count towards a majority, and its changes.

``StateContext.voters`` (manager name -> member id) is part of the replicated state, so it
changes only by a majority commit, like any metadata. The rules (Raft's single-server change;
why: ``docs/decisions/0089-committed-voter-set.md``):

* A commit needs a majority of the voter set *of the state being committed*; a manager that
  gossip knows but the set does not (new, unknown, or removed) never counts.
* One manager joins or leaves per commit. A majority of the old set and a majority of the new
  one then always share a node, so no two masters can commit under the two sets at once.
* A change is committed by the master of the current set, under the op lock, so it waits for
  the previous change to be committed; a new master commits the state it continues from (the
  resync) before any change of its own.
* A removed manager's member id goes to ``retired_voters``: it is never admitted again (a
  node that comes back must join anew, under a new member id).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from shardex.errors import ErrorCode, ShardexError
from shardex.meta.state import StateContext


def majority(n: int) -> int:
    return n // 2 + 1


def changed_managers(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """The names that join, leave, or change member id between ``old`` and ``new``."""
    return sorted(n for n in {*old, *new} if old.get(n) != new.get(n))


def check_single_change(old: Mapping[str, str], new: Mapping[str, str]) -> None:
    """A commit may change at most one voter (filling an empty set is the bootstrap)."""
    changed = changed_managers(old, new)
    if old and len(changed) > 1:
        raise ShardexError(
            f"a commit may change one coordinator voter at a time, not {changed}",
            code=ErrorCode.INTERNAL,
            details={"old": sorted(old), "new": sorted(new)},
        )


def with_voter(state: StateContext, name: str, member_id: str) -> StateContext:
    """``state`` with manager ``name`` admitted to the voters."""
    return msgspec.structs.replace(state, voters={**state.voters, name: member_id})


def retire(state: StateContext, name: str, member_id: str) -> StateContext:
    """``state`` with manager ``name`` (member ``member_id``) removed from the voters if it is
    one, and retired: never admitted again."""
    voters = {n: i for n, i in state.voters.items() if n != name}
    retired = {**state.retired_voters, member_id: name}
    return msgspec.structs.replace(state, voters=voters, retired_voters=retired)


def removal_refusal(voters: Mapping[str, str], name: str, up: Iterable[str]) -> ShardexError | None:
    """Why removing voter ``name`` must be refused (``up``: the voters up in the master's
    view), or None: at least one voter must remain, and a majority of the remaining ones must
    be up, or the removal (and every later change) could not commit."""
    if name not in voters:
        return None
    remaining = sorted(n for n in voters if n != name)
    up_remaining = sorted(n for n in set(up) if n in remaining)
    if not remaining:
        return ShardexError(
            f"cannot eject {name}: it is the only coordinator voter (manager node); "
            "0 voters would remain",
            code=ErrorCode.BAD_REQUEST,
            details={
                "node": name,
                "voters": sorted(voters),
                "hint": "start another manager node and let it join first",
            },
        )
    need = majority(len(remaining))
    if len(up_remaining) < need:
        return ShardexError(
            f"cannot eject {name}: {len(remaining)} coordinator voter(s) would remain "
            f"({', '.join(remaining)}) and only {len(up_remaining)} of them are up; "
            f"{need} are needed for a majority",
            code=ErrorCode.NODE_UNAVAILABLE,
            details={
                "node": name,
                "remaining": remaining,
                "up": up_remaining,
                "needed": need,
                "hint": "start the down managers again first, or eject a down manager "
                "instead of an up one",
            },
        )
    return None
