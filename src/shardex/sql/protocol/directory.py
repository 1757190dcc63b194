"""``MemberDirectory`` over the node's ``Membership``: addresses from the member list,
"down" from the local failure detector (the same verdict every other service acts on)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from shardex.meta.member_list import DOWN

if TYPE_CHECKING:  # the node hands its Membership in; the protocol layer never builds one
    from shardex.manager.membership import Membership

__all__ = ["MembershipDirectory"]


class MembershipDirectory:
    """``membership`` is a getter: the node builds its ``Membership`` only at start.
    An observer that cannot judge a member (``unknown``: a non-manager looking at another
    non-manager) treats it as up; broken links and ``check`` still clean up after it."""

    def __init__(self, membership: Callable[[], Membership | None]) -> None:
        self._membership = membership

    def address_of(self, member_id: str) -> str | None:
        m = self._membership()
        if m is None:
            return None
        for info in m.members:
            if info.member_id == member_id:
                return info.address
        return None

    def is_down(self, member_id: str) -> bool:
        m = self._membership()
        if m is None:
            return False
        state, _ = m.state_of(member_id, asyncio.get_running_loop().time())
        return state == DOWN
