"""Writes on the event loop (``inline``): a replica's small unsynced apply, like group
commit's small unsynced groups, refuses (``WouldBlock``, nothing written) whatever would make
the loop wait - a dirty mark to fsync, a partition lock another thread holds - and the pool
then does it; a store write that would stall is refused by RocksDB itself (``no_stall``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardex.api.records import OP_UPSERT, STATE_REPLICA, FailoverEntry
from shardex.api.replication import ReplicaRun
from shardex.data.engine import DataEngine
from shardex.data.engine_io import WouldBlock
from shardex.storage.rocks import Store

UUID = 4242
LOG = [FailoverEntry(UUID, 0)]


def run(after: int, n: int) -> ReplicaRun:
    changes = [
        (s, f"d{s}", OP_UPSERT, 1000 + s, b'{"s": %d}' % s, 0, 0)
        for s in range(after + 1, after + n + 1)
    ]
    return ReplicaRun(0, UUID, after, changes, LOG)


@pytest.fixture
def engine(tmp_path: Path):
    eng = DataEngine(tmp_path / "e")
    eng.create_keyspace("ks", 1, uuid="u1", created_cas=1)
    eng.replicas.create_empty("ks", 0)
    yield eng
    eng.close()


def test_a_replica_apply_on_the_loop_never_waits(engine: DataEngine) -> None:
    ops = engine.replicas
    part = engine._local.parts[("ks", 0)]
    with pytest.raises(WouldBlock):  # the copy's first unsynced write fsyncs its dirty mark
        ops.apply_runs("ks", [run(0, 2)], sync=False, inline=True)
    assert part.meta.high_seqno == 0
    ops.apply_runs("ks", [run(0, 2)], sync=False)  # in the pool: the mark goes down
    with part.lock, pytest.raises(WouldBlock):  # another thread's lock: never waited for
        ops.apply_runs("ks", [run(2, 2)], sync=False, inline=True)
    assert part.meta.high_seqno == 2
    (ack,) = ops.apply_runs("ks", [run(2, 2)], sync=False, inline=True)
    assert (ack.state, ack.high, ack.uuid) == (STATE_REPLICA, 4, UUID)
    assert ops.get_raw("ks", "d4") == (b'{"s": 4}', 1004, 4, 0)  # body, cas, seqno, expiry


def test_no_stall_writes_and_refuses_only_with_a_sync(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    try:
        cf = store.column_family()
        batch = store.batch()
        batch.put(cf, b"k", b"v")
        store.write(batch, no_stall=True)
        assert cf.get(b"k") == b"v"
        with pytest.raises(ValueError):
            store.write(store.batch(), sync=True, no_stall=True)
    finally:
        store.close()
