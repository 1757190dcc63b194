"""Roles and privileges (``shardex.api.privileges``): spelling, what each role grants, on
which keyspaces, and what a denial says."""

from __future__ import annotations

import pytest

from shardex.api.privileges import Privilege, holds, parse_role, parse_roles, require
from shardex.errors import AuthFailed, ConfigError
from shardex.net.credentials import Principal

P = Privilege


@pytest.mark.parametrize(
    "text",
    [
        "",
        "root",
        "admin(ks)",  # a cluster-wide role takes no keyspace
        "data_reader",  # a keyspace role needs one
        "data_reader(ks)\n",  # full match: a trailing newline is not a role
        "data_reader(ks)x",
        "data_reader(a b)",
        "data_reader(**)",
    ],
)
def test_bad_role_spellings_are_refused_naming_the_value(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_role(text)
    assert info.value.details["value"] == text
    assert "data_reader(KS)" in info.value.details["hint"]


def test_roles_are_deduplicated_in_order() -> None:
    assert parse_roles(["admin", "data_reader(ks)", "data_reader(ks)"]) == (
        "admin",
        "data_reader(ks)",
    )


def test_what_each_role_grants_and_where() -> None:
    assert holds(["admin"], P.USERS_MANAGE, None)
    assert not holds(["cluster_admin"], P.USERS_MANAGE, None)
    assert not holds(["cluster_admin"], P.DATA_READ, "ks")
    assert holds(["cluster_admin"], P.KEYSPACE_MANAGE, "any")
    assert holds(["data_reader(ks)"], P.DATA_READ, "ks")
    assert not holds(["data_reader(ks)"], P.DATA_READ, "other")
    assert not holds(["data_reader(ks)"], P.DATA_WRITE, "ks")
    assert holds(["data_reader(*)"], P.DATA_READ, "other")
    assert holds(["query_update(ks)"], P.QUERY_UPDATE, None)  # on some keyspace
    assert not holds([], P.DATA_READ, None)
    assert holds([], P.CLUSTER_READ, None)  # every user


def test_a_denial_names_the_privilege_the_keyspace_and_the_user() -> None:
    alice = Principal("user", "alice", ("data_reader(ks)",))
    require(alice, (P.DATA_READ,), "ks", "data.Get")
    with pytest.raises(AuthFailed) as info:
        require(alice, (P.DATA_WRITE,), "ks", "data.Upsert")
    assert info.value.details == {
        "user": "alice",
        "type": "data.Upsert",
        "privilege": "data.write",
        "keyspace": "ks",
        "hint": "grant a role with it: shardex user grant NAME ROLE",
    }
    require(Principal("node", "n1"), (P.USERS_MANAGE,), None, "anything")  # a node may
