"""The data and index engines on the simulator's memory store (``open_store``): the same
engine code as on RocksDB, and what a power-off leaves of them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from shardex.data.engine import DataEngine
from shardex.errors import ShardexError, StorageError
from shardex.index import IndexerEngine
from shardex.storage.memory import MemoryDisk, MemoryStore
from shardex.testing.index import FakeKeyspace, LocalPipeline, random_workload, workload_definitions

NODES = ["n1", "n2"]


def _engines(disks: dict[str, MemoryDisk]) -> dict[str, IndexerEngine]:
    return {
        n: IndexerEngine(Path(n), open_store=lambda _p, d=d: MemoryStore(d))
        for n, d in disks.items()
    }


@pytest.mark.parametrize("seed", [1, 2])
def test_index_engine_on_memory_store_matches_oracle_and_survives_power_off(seed: int) -> None:
    rng = random.Random(seed)
    ks = FakeKeyspace(num_partitions=4)
    defs = workload_definitions()
    disks = {n: MemoryDisk() for n in NODES}
    placement = {d.id: {p: rng.choice(NODES) for p in range(d.num_partition)} for d in defs}
    pipe = LocalPipeline(defs, _engines(disks), placement)
    pipe.create_slices()
    start = None
    for _ in range(6):
        random_workload(ks, rng, rng.randint(5, 40))
        end = ks.ts()
        pipe.deliver(ks.changes(start, end), rng=rng, redeliver=0.3)
        pipe.stabilise(end)
        pipe.check(end, ks.documents_at(end))
        start = end
    # Rows queued but never stabilised, then the machines lose power: the stabilised TS
    # was synced, the queue was memory only.
    random_workload(ks, rng, 20)
    pipe.deliver(ks.changes(start, ks.ts()))
    for d in disks.values():
        d.crash(power_off=True, rng=rng)
    pipe.engines = _engines(disks)
    assert all(s.applied_ts() == start for e in pipe.engines.values() for s in e.slices())
    pipe.check(start, ks.documents_at(start))


def test_data_engine_on_memory_store_loses_only_unsynced_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the engine's path is relative: any file would land here
    disk = MemoryDisk()

    def open_engine() -> DataEngine:
        return DataEngine(Path("data"), open_store=lambda _p: MemoryStore(disk))

    eng = open_engine()
    eng.create_keyspace("ks", 2)
    for p in range(2):
        eng.create_partition("ks", p)
    eng.upsert("ks", "kept", {"v": 1})  # durability "persist": synced before it returns
    eng.upsert("ks", "lost", {"v": 2}, durability="memory")
    disk.crash(power_off=True)
    eng = open_engine()
    assert eng.get("ks", "kept").doc == {"v": 1}
    with pytest.raises(ShardexError):
        eng.get("ks", "lost")
    eng.upsert("ks", "survives", {"v": 3}, durability="memory")
    disk.crash()  # a process crash: the OS still had the write
    assert open_engine().get("ks", "survives").doc == {"v": 3}
    # A partition ingested from items, and a chunked copy refused (it is an SST file): on a
    # memory store the engine made no file and cleaned none.
    eng = open_engine()
    for p in range(2):
        with eng.snapshot_partition("ks", p) as snap:
            info, items = snap.info, list(snap.raw_items())
        eng.drop_partition("ks", p)
        eng.ingest_partition("ks", p, info, items, activate=True)
    assert eng.get("ks", "kept").doc == {"v": 1}
    assert eng.get("ks", "survives").doc == {"v": 3}
    with pytest.raises(StorageError):
        eng.begin_ingest("ks", 1, info)
    eng.close()
    assert list(tmp_path.iterdir()) == []
