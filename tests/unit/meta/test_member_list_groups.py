"""Server group labels in the member list: carried, part of a member's identity, and
compatible with lists encoded before groups existed."""

from __future__ import annotations

import msgspec

from shardex.meta.member_list import MemberInfo, merge_members, self_entry


class _OldMemberInfo(msgspec.Struct, kw_only=True, frozen=True):
    """The entry as encoded before the ``group`` field."""

    member_id: str
    name: str
    address: str
    services: tuple[str, ...]
    incarnation: int = 1


def test_an_old_encoded_member_list_decodes_without_groups() -> None:
    old = [_OldMemberInfo(member_id="a", name="n1", address="h:1", services=("data",))]
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=list[MemberInfo])
    assert decoded == [MemberInfo(member_id="a", name="n1", address="h:1", services=("data",))]
    assert decoded[0].group == ""


def test_a_changed_group_bumps_the_incarnation_and_wins_the_merge() -> None:
    first = self_entry("a", "n1", "h:1", ["data"], None, "rack1")
    assert first.group == "rack1" and first.incarnation == 1
    assert self_entry("a", "n1", "h:1", ["data"], [first], "rack1") == first  # unchanged
    moved = self_entry("a", "n1", "h:1", ["data"], [first], "rack2")
    assert moved.group == "rack2" and moved.incarnation == 2
    assert merge_members({"a": first}, [moved])["a"] == moved
    assert merge_members({"a": moved}, [first])["a"] == moved
