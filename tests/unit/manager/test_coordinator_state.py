"""StateContext encoding, persistence and request deduplication."""

from __future__ import annotations

import os

import msgspec
import pytest

from shardex.api.coordinator import StateReply
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError, StorageError
from shardex.manager.coordinator import CoordinatorTiming
from shardex.meta.state import (
    STATE_FILE,
    CoordinatorRecord,
    FileStateStore,
    KeyspaceMeta,
    MemoryStateStore,
    StateContext,
    decode_record,
    decode_reply,
    decode_state,
    encode_record,
    encode_reply,
    encode_state,
    newest,
    record_reply,
    select_sections,
    state_digest,
    stored_reply,
    version_of,
)
from shardex.net.messages import Ack, Pong


def sample_state(cas: int = 7) -> StateContext:
    meta = KeyspaceMeta(name="users", num_partitions=4, uuid="u1", created_cas=3)
    topo = [
        Topology(seq_num=1, assignment={0: "n1", 1: "n2", 2: "n1", 3: "n2"}),
        Topology(seq_num=2, assignment={0: "n1", 1: "n3", 2: "n1", 3: "n2"}),
    ]
    return StateContext(
        cas=cas,
        keyspaces={"users": meta},
        data_topologies={"users": topo},
        applied_requests={"r1": encode_reply(Pong(payload=b"x"))},
        epoch=2,
        master="n1",
    )


def test_state_round_trips_with_int_partition_keys() -> None:
    state = sample_state()
    back = decode_state(encode_state(state))
    assert back == state
    assert back.data_topologies["users"][1].assignment[1] == "n3"  # int keys survive msgpack
    record = CoordinatorRecord(promised_epoch=3, leader="n2", state=state)
    assert decode_record(encode_record(record)) == record


def test_defaults_are_empty_and_not_shared() -> None:
    a, b = StateContext(), StateContext()
    assert (a.cas, a.epoch, a.keyspaces, a.master) == (0, 0, {}, "")
    assert a.keyspaces is not b.keyspaces  # msgspec copies mutable defaults
    assert CoordinatorRecord().state == StateContext()


def test_digest_ignores_dict_insertion_order_but_not_content() -> None:
    m1 = KeyspaceMeta(name="a", num_partitions=1, uuid="x", created_cas=1)
    m2 = KeyspaceMeta(name="b", num_partitions=1, uuid="y", created_cas=2)
    s1 = StateContext(cas=2, keyspaces={"a": m1, "b": m2})
    s2 = StateContext(cas=2, keyspaces={"b": m2, "a": m1})
    assert state_digest(s1) == state_digest(s2)
    assert state_digest(s1) != state_digest(msgspec.structs.replace(s1, cas=3))


def test_versions_order_by_term_then_cas() -> None:
    old_term_high_cas = StateContext(cas=9, epoch=1)
    new_term_low_cas = StateContext(cas=6, epoch=2)
    assert version_of(new_term_low_cas) > version_of(old_term_high_cas)
    assert newest([old_term_high_cas, new_term_low_cas]) is new_term_low_cas
    with pytest.raises(ValueError):
        newest([])


def test_select_sections() -> None:
    state = sample_state()
    only = select_sections(state, ["data_topologies"])
    assert only.data_topologies == state.data_topologies
    assert only.keyspaces == {} and only.applied_requests == {}
    assert (only.cas, only.epoch, only.master) == (7, 2, "n1")  # versions always kept
    assert select_sections(state, None) is state
    with pytest.raises(ShardexError) as err:
        select_sections(state, ["keyspaces", "bogus"])
    assert err.value.code is ErrorCode.BAD_REQUEST and err.value.details["unknown"] == ["bogus"]


def test_record_and_find_reply() -> None:
    state = StateContext()
    reply = StateReply(node="n1", master="n1", is_master=True, state=sample_state())
    state = record_reply(state, "req-1", reply)
    assert stored_reply(state, "req-1") == reply  # any registered message type round-trips
    assert stored_reply(state, "req-2") is None
    assert stored_reply(state, None) is None
    assert decode_reply(encode_reply(Ack())) == Ack()


def test_applied_requests_are_bounded_oldest_first() -> None:
    state = StateContext()
    for i in range(8):
        state = record_reply(state, f"r{i}", Pong(payload=bytes([i])), limit=5)
    assert list(state.applied_requests) == ["r3", "r4", "r5", "r6", "r7"]
    # Recording an id again makes it the youngest.
    state = record_reply(state, "r3", Pong(payload=b"again"), limit=5)
    state = record_reply(state, "r8", Pong(), limit=5)
    assert list(state.applied_requests) == ["r5", "r6", "r7", "r3", "r8"]
    # Order survives encoding (replicas evict the same ids as the master).
    assert list(decode_state(encode_state(state)).applied_requests) == list(state.applied_requests)


def test_memory_store_keeps_encoded_bytes() -> None:
    store = MemoryStateStore()
    assert store.load() is None
    record = CoordinatorRecord(promised_epoch=1, leader="n1", state=sample_state())
    store.save(record)
    assert isinstance(store.data, bytes) and store.saves == 1
    loaded = store.load()
    assert loaded == record and loaded is not record


def test_file_store_round_trip_and_atomic_replace(tmp_path: os.PathLike[str]) -> None:
    store = FileStateStore(tmp_path)  # type: ignore[arg-type]
    assert store.load() is None
    for cas in (1, 2, 3):
        store.save(CoordinatorRecord(promised_epoch=cas, state=sample_state(cas)))
    loaded = store.load()
    assert loaded is not None and loaded.state.cas == 3 and loaded.promised_epoch == 3
    assert sorted(os.listdir(tmp_path)) == [STATE_FILE]  # no temp file left behind


def test_file_store_refuses_garbage_and_other_formats(tmp_path: os.PathLike[str]) -> None:
    store = FileStateStore(tmp_path)  # type: ignore[arg-type]
    store.path.write_bytes(b"\xc1not msgpack")
    with pytest.raises(StorageError) as err:
        store.load()
    assert "hint" in err.value.details
    store.path.write_bytes(encode_record(CoordinatorRecord(format=99)))
    with pytest.raises(StorageError):
        store.load()


def test_timing_follows_failure_detection() -> None:
    t = CoordinatorTiming.for_membership(heartbeat_interval=0.5, failure_timeout=3.0)
    # A commit outlasts the failure-detection bound, so a dead replica is skipped, not fatal.
    assert t.commit_timeout > 3.0 + 2 * 0.5
    assert t.op_timeout > t.commit_timeout
    assert t.tick < 0.5
