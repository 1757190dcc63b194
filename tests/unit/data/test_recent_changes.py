"""An active copy's newest changes in memory (``Partition.recent_changes``), which a replica
sender sends instead of reading them back from the change log: the very tuples the change log
gives (``replica.read_run``), or None - never something else - when memory does not hold the
whole range on the branch asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardex.api.records import OP_DELETE
from shardex.data.engine import DataEngine
from shardex.data.partition import RECENT_BYTES, RECENT_CHANGES, Partition
from shardex.data.replica import read_run

KS = "ks"


@pytest.fixture
def engine(tmp_path: Path):
    eng = DataEngine(tmp_path / "e")
    eng.create_keyspace(KS, 1)
    eng.create_partition(KS, 0)
    yield eng
    eng.close()


def part_of(engine: DataEngine) -> Partition:
    part = engine.replicas.active_part(KS, 0)
    assert part is not None
    return part


def from_log(part: Partition, after: int) -> list:
    return read_run(part, after, part.meta.high_seqno, 10_000, 1 << 30)


def recent(part: Partition, after: int, upper: int, uuid: int) -> list | None:
    """The changes ``recent_changes`` gives (without the live flags), or None."""
    got = part.recent_changes(after, upper, uuid)
    return None if got is None else got[0]


def test_memory_gives_what_the_change_log_gives(engine: DataEngine) -> None:
    part = part_of(engine)
    engine.upsert(KS, "a", {"v": 0})
    # Nothing asked for yet: nothing kept (a partition without replicas pays nothing).
    assert recent(part, 0, part.meta.high_seqno, part.meta.uuid) is None
    assert part.keep_recent
    engine.upsert(KS, "a", {"v": 1})
    engine.upsert(KS, "b", {"v": 2})
    engine.delete(KS, "a")
    engine.mutate_many(KS, [("upsert", "c", {"v": 3}, None), ("upsert", "b", {"v": 4}, None)])
    high = part.meta.high_seqno
    assert high == 6
    for after in range(1, high):
        assert recent(part, after, high, part.meta.uuid) == from_log(part, after)
    # A delete travels with no body, as the change log has it.
    ((seqno, docid, op, _cas, body, _flags, _expiry),) = recent(part, 3, 4, part.meta.uuid)
    assert (seqno, docid, op, body) == (4, "a", OP_DELETE, None)
    # Whether each document was live before its change: a replica counts documents by it.
    got = part.recent_changes(1, high, part.meta.uuid)
    assert got is not None and got[1] == [True, False, True, False, True]
    # Below what memory holds (the first write above), another branch, an empty range: None.
    assert recent(part, 0, high, part.meta.uuid) is None
    assert recent(part, 1, high, part.meta.uuid + 1) is None
    assert recent(part, high, high, part.meta.uuid) is None


def test_memory_is_bounded_and_falls_back_below_it(engine: DataEngine) -> None:
    part = part_of(engine)
    part.recent_changes(0, 0, part.meta.uuid)  # a sender asks: keep from now on
    for i in range(RECENT_CHANGES + 10):
        engine.upsert(KS, f"d{i}", {"i": i})
    high = part.meta.high_seqno
    assert recent(part, high - RECENT_CHANGES, high, part.meta.uuid) == from_log(
        part, high - RECENT_CHANGES
    )
    assert recent(part, high - RECENT_CHANGES - 1, high, part.meta.uuid) is None
    big = "x" * (RECENT_BYTES // 4)
    for i in range(5):
        engine.upsert(KS, f"big{i}", {"x": big})
    high = part.meta.high_seqno
    assert recent(part, high - 3, high, part.meta.uuid) == from_log(part, high - 3)
    assert recent(part, high - 5, high, part.meta.uuid) is None


def test_a_commit_not_of_its_own_writes_empties_memory(engine: DataEngine) -> None:
    part = part_of(engine)
    part.recent_changes(0, 0, part.meta.uuid)
    engine.upsert(KS, "a", {"v": 1})
    engine.upsert(KS, "a", {"v": 2})
    old_uuid = part.meta.uuid
    assert recent(part, 1, 2, old_uuid) == from_log(part, 1)
    engine.new_branch(KS, 0)  # a new branch at the same seqno: nothing kept stays valid
    assert recent(part, 1, 2, old_uuid) is None
    assert recent(part, 1, 2, part.meta.uuid) is None
    engine.upsert(KS, "a", {"v": 3})
    assert recent(part, 2, 3, part.meta.uuid) == from_log(part, 2)
    assert recent(part, 1, 3, part.meta.uuid) is None


def test_a_replica_counts_documents_alike_with_and_without_the_live_flags(
    tmp_path: Path,
) -> None:
    from shardex.api.records import OP_UPSERT, FailoverEntry
    from shardex.api.replication import ReplicaRun

    log = [FailoverEntry(77, 0)]
    changes = [
        (1, "a", OP_UPSERT, 11, b"{}", 0, 0),
        (2, "a", OP_UPSERT, 12, b"{}", 0, 0),
        (3, "b", OP_UPSERT, 13, b"{}", 0, 0),
        (4, "a", OP_DELETE, 14, None, 0, 0),
        (5, "c", OP_UPSERT, 15, b"{}", 0, 0),
        (6, "a", OP_UPSERT, 16, b"{}", 0, 0),
    ]
    lives = [False, True, False, True, False, False]
    counts = []
    for i, flags in enumerate((None, lives)):
        with DataEngine(tmp_path / f"r{i}") as eng:
            eng.create_keyspace(KS, 1)
            eng.replicas.create_empty(KS, 0)
            # In two runs, the second starting inside the first's range (a resend).
            (ack,) = eng.replicas.apply_runs(
                KS,
                [ReplicaRun(0, 77, 0, changes[:3], log, live_before=flags and flags[:3])],
                sync=False,
            )
            assert ack.high == 3
            (ack,) = eng.replicas.apply_runs(
                KS,
                [ReplicaRun(0, 77, 1, changes[1:], None, live_before=flags and flags[1:])],
                sync=False,
            )
            assert ack.high == 6
            counts.append(eng.partition_info(KS, 0).doc_count)
    assert counts == [3, 3]
