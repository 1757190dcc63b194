"""Basic auth against the cluster's user records (a password that matched is remembered
for its record only), and the N1QL code and HTTP status of each shardex error."""

from __future__ import annotations

import base64
import dataclasses

import pytest

from shardex.errors import AuthFailed, ErrorCode, ShardexError
from shardex.net.credentials import Argon2Params, UserCredential, make_credential
from shardex.node.http import basic_auth
from shardex.node.http.basic_auth import BasicAuth
from shardex.node.http.n1ql_errors import N1qlError, of_http_status, of_shardex

CHEAP = Argon2Params(time_cost=1, memory_cost=8, parallelism=1)


class Users:
    def __init__(self, *creds: UserCredential) -> None:
        self.creds = {c.name: c for c in creds}
        self.missed: list[str] = []

    def lookup_user(self, name: str) -> UserCredential | None:
        return self.creds.get(name)

    async def lookup_missing(self, name: str) -> UserCredential | None:
        self.missed.append(name)
        return None


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def cred(name: str, password: str, *roles: str) -> UserCredential:
    return make_credential(name, password, roles, salt=b"s" * 16, params=CHEAP)


async def refusal(auth: BasicAuth, value: str | None) -> N1qlError:
    with pytest.raises(N1qlError) as e:
        await auth.principal(value, "peer")
    assert (e.value.code, e.value.http) == (10000, 401)
    return e.value


async def test_a_login_matches_the_users_record_and_is_remembered_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    users = Users(cred("ann", "pw-1", "query_select(a)"))
    seen: list[tuple[str, bool]] = []
    auth = BasicAuth(users, lambda peer, name, p: seen.append((name, p is not None)))
    derived: list[str] = []
    real = basic_auth.password_matches

    def counting(c: UserCredential, password: str) -> bool:
        derived.append(c.name)
        return real(c, password)

    monkeypatch.setattr(basic_auth, "password_matches", counting)
    p = await auth.principal(header("ann", "pw-1"), "peer")
    assert (p.kind, p.name, p.roles) == ("user", "ann", ("query_select(a)",))
    await auth.principal(header("ann", "pw-1"), "peer")
    assert derived == ["ann"] and seen == [("ann", True)]  # the second login: remembered
    # a new record (roles granted, password changed) ends what was remembered
    users.creds["ann"] = dataclasses.replace(users.creds["ann"], roles=("admin",))
    assert (await auth.principal(header("ann", "pw-1"), "peer")).roles == ("admin",)
    assert derived == ["ann", "ann"]
    await refusal(auth, header("ann", "pw-2"))
    assert seen[-1] == ("ann", False)
    # a changed password refuses the remembered old one at once
    await auth.principal(header("ann", "pw-1"), "peer")
    users.creds["ann"] = cred("ann", "pw-2", "admin")
    await refusal(auth, header("ann", "pw-1"))
    assert (await auth.principal(header("ann", "pw-2"), "peer")).name == "ann"
    # so does dropping the user
    await auth.principal(header("ann", "pw-2"), "peer")
    del users.creds["ann"]
    await refusal(auth, header("ann", "pw-2"))


async def test_what_is_refused() -> None:
    auth = BasicAuth(Users(cred("ann", "pw-1")))
    assert "no credentials" in (await refusal(auth, None)).msg
    assert "Basic" in (await refusal(auth, "Bearer abc")).msg
    assert "malformed" in (await refusal(auth, "Basic !!!")).msg
    assert "name and a password" in (await refusal(auth, header("ann", ""))).msg
    await refusal(auth, header("bob", "pw-1"))  # unknown: the same answer as a wrong password


async def test_an_unknown_name_asks_the_directory_once_more() -> None:
    users = Users()
    await refusal(BasicAuth(users), header("new", "pw"))
    assert users.missed == ["new"]


@pytest.mark.parametrize(
    ("code", "n1ql", "http", "status"),
    [
        (ErrorCode.SQL_SYNTAX, 3000, 400, "fatal"),
        (ErrorCode.BAD_REQUEST, 1040, 400, "fatal"),
        (ErrorCode.KEYSPACE_NOT_FOUND, 12003, 404, "fatal"),
        (ErrorCode.INDEX_NOT_FOUND, 4000, 404, "fatal"),
        (ErrorCode.TIMEOUT, 1080, 504, "timeout"),
        (ErrorCode.QUERY_OVERLOADED, 1182, 503, "fatal"),
        (ErrorCode.QUERY_CANCELLED, 1181, 200, "stopped"),
        (ErrorCode.STORAGE_ERROR, 5000, 500, "fatal"),
    ],
)
def test_shardex_errors_map_to_n1ql_codes(
    code: ErrorCode, n1ql: int, http: int, status: str
) -> None:
    e = of_shardex(ShardexError("m", code=code, details={"hint": "h", "n": [1, object()]}))
    assert (e.code, e.http, e.status, e.msg) == (n1ql, http, status, "m")
    assert e.reason is not None and e.reason["shardex_code"] == code.value
    assert e.reason["hint"] == "h" and e.reason["n"][0] == 1 and isinstance(e.reason["n"][1], str)


def test_a_missing_privilege_is_13014_and_a_failed_login_10000() -> None:
    denied = of_shardex(AuthFailed("no", details={"privilege": "query.select"}))
    assert (denied.code, denied.http) == (13014, 403)
    assert (of_shardex(AuthFailed("who")).code, of_shardex(AuthFailed("who")).http) == (10000, 401)
    assert [of_http_status(s) for s in (405, 413, 431, 503)] == [1010, 1130, 1130, 1182]
