"""The client's index helpers that need no cluster: ``wait_for_index`` outcomes, key
specs, and the local checks ``create_index`` / ``execute_ddl`` make before sending."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shardex.client.indexes import IndexOps, _key, describe_index
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_definition import IndexKey, make_definition
from shardex.meta.index_state import ACTIVE, IndexRecord


class NoSend:
    """The ``RpcSession`` of a client whose calls must all fail before sending."""

    def __init__(self, sent: list[Any]) -> None:
        self.sent = sent

    async def ddl(self, msg: Any, expect: Any) -> Any:
        raise AssertionError("nothing may be sent")

    def run(self, coro: Any) -> Any:
        coro.close()
        self.sent.append(coro)
        raise AssertionError("nothing may be sent")


class Scripted(IndexOps):
    """``list_indexes`` answers from a script of states (None: the index is absent)."""

    def __init__(self, states: list[str | None], error: str = "") -> None:
        self.states = states
        self.error = error
        self.sent: list[Any] = []
        self.rpc = NoSend(self.sent)  # type: ignore[assignment]

    def list_indexes(self, keyspace: str | None = None, *, fresh: bool = True) -> list[dict]:
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if state is None:
            return []
        return [{"name": "ix", "state": state, "error": self.error, "progress": 0.5}]


def test_wait_returns_at_or_beyond_the_state() -> None:
    assert (
        Scripted(["INIT", "READY", "BUILDING"]).wait_for_index(
            "ks", "ix", "BUILDING", timeout=5, interval=0
        )["state"]
        == "BUILDING"
    )
    assert Scripted(["ACTIVE"]).wait_for_index("ks", "ix", "READY", timeout=5)["state"] == "ACTIVE"


def test_wait_errors_name_the_state() -> None:
    with pytest.raises(ShardexError) as err:
        Scripted(["BUILDING", "ERROR"], error="disk full").wait_for_index(
            "ks", "ix", timeout=5, interval=0
        )
    assert err.value.code is ErrorCode.INDEX_NOT_READY and "disk full" in err.value.message
    with pytest.raises(ShardexError) as err:
        Scripted(["BUILDING"]).wait_for_index("ks", "ix", timeout=0.05, interval=0.01)
    assert err.value.code is ErrorCode.TIMEOUT and "still BUILDING" in err.value.message
    with pytest.raises(ShardexError) as err:
        Scripted([None]).wait_for_index("ks", "ix", timeout=0.05, interval=0.01)
    assert err.value.code is ErrorCode.INDEX_NOT_FOUND
    with pytest.raises(ShardexError) as err:
        Scripted(["BUILDING", None]).wait_for_index("ks", "ix", timeout=5, interval=0)
    assert err.value.code is ErrorCode.INDEX_NOT_FOUND and "dropped" in err.value.message
    with pytest.raises(ShardexError) as err:
        Scripted(["READY"]).wait_for_index("ks", "ix", "DONE")
    assert err.value.code is ErrorCode.BAD_REQUEST


def test_key_specs() -> None:
    assert _key("age") == IndexKey(expr="age")
    assert _key("LOWER( name ) DESC") == IndexKey(expr="LOWER(name)", desc=True)
    assert _key(("age", True)) == IndexKey(expr="age", desc=True)
    assert _key(IndexKey(expr="x")) == IndexKey(expr="x")


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda c: c.execute_ddl("CREATE INDEX ON ks(a)"), ErrorCode.SQL_SYNTAX),
        (lambda c: c.create_index("ks", "i", ["a +"]), ErrorCode.SQL_SYNTAX),
        (lambda c: c.create_index("ks", "i", [("a +", False)]), ErrorCode.EXPRESSION_SYNTAX),
        (lambda c: c.create_index("ks", "i", ["a"], num_partition=3), ErrorCode.BAD_REQUEST),
        (lambda c: c.create_index("ks", "9i", ["a"]), ErrorCode.BAD_REQUEST),
        (lambda c: c.create_index("k s", "i", ["a"]), ErrorCode.BAD_REQUEST),
        (lambda c: c.create_index("ks", "i", []), ErrorCode.BAD_REQUEST),
        (lambda c: c.create_index("ks", "i", ["a"], num_replica=4), ErrorCode.BAD_REQUEST),
        (lambda c: c.create_index("ks", "i", ["a"], num_replica=-1), ErrorCode.BAD_REQUEST),
        (
            lambda c: c.execute_ddl('CREATE INDEX i ON ks(a) WITH {"num_replica": 9}'),
            ErrorCode.SQL_SYNTAX,
        ),
        (lambda c: c.build_index("ks"), ErrorCode.BAD_REQUEST),
        (lambda c: c.drop_index("ks"), ErrorCode.BAD_REQUEST),
    ],
)
def test_local_checks_fail_before_sending(call: Any, code: ErrorCode) -> None:
    c = Scripted(["READY"])
    with pytest.raises(ShardexError) as err:
        call(c)
    assert err.value.code is code
    assert not c.sent


def test_describe_index_shows_the_replicas() -> None:
    defn = make_definition(id="1.1.x", name="x", keyspace="ks", keys=["a"])
    rec = IndexRecord(definition=defn, state=ACTIVE, num_replica=1)
    topo = Topology(seq_num=1, assignment={0: "n1"}, replicas={0: ["n2"]})
    d = describe_index(rec, topo, 3)
    assert d["num_replica"] == 1 and d["replicas"] == {0: ["n2"]}
    assert d["nodes"] == ["n1", "n2"] and d["partitions"] == {0: "n1"}
    plain = describe_index(msgspec.structs.replace(rec, num_replica=0), None, 3)
    assert plain["num_replica"] == 0 and plain["replicas"] == {} and plain["nodes"] == []
