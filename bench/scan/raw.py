"""The local limit of a large scan: raw RocksDB iteration of the very slice files a scan
reads, on the same machine, in one Python process (``bench.scan``).

Each indexer node keeps its slices in ``<node dir>/index`` (one RocksDB per node; a slice's
entries are the column family ``cf_names(index_id, partition)[0]``, see
``shardex.index.records``). We open that database read-only next to the running node
(RocksDB allows read-only opens beside the writer: no lock is taken; the WAL is replayed
into the reader's own memtable) and iterate every entry key of every slice of the index
through rocksdict, counting keys: no decoding, no network, no merge. That is what one Python
reader on this machine can pull out of those files at best.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def slice_locations(client: Any, cluster_dir: Path, keyspace: str, index: str) -> list[Any]:
    """(index db path, entries column family) of every slice of ``index``, from its latest
    topology and the cluster spec (node name -> data dir)."""
    from shardex.index.records import cf_names
    from shardex.meta import cluster_dir as cdir
    from shardex.meta.index_state import find_index, latest_index_topology
    from shardex.pipeline.indexers import index_state

    state = index_state(client)
    rec = find_index(state.indexes, keyspace, index)
    if rec is None:
        raise RuntimeError(f"no index {index!r} on {keyspace!r}")
    topo = latest_index_topology(state.index_topologies, rec.id)
    if topo is None:
        raise RuntimeError(f"index {index!r} has no topology")
    dirs = {n.name: n.path(cluster_dir) / "index" for n in cdir.load(cluster_dir).nodes}
    return [(dirs[node], cf_names(rec.id, p)[0]) for p, node in sorted(topo.assignment.items())]


def raw_iterate(locations: list[Any]) -> tuple[int, float, float]:
    """Open each node's index RocksDB read-only and count every key of the listed entry
    families; returns (keys, seconds of iteration, CPU seconds of iteration; opening
    excluded)."""
    from rocksdict import AccessType, Options, Rdict

    by_db: dict[Path, list[str]] = {}
    for path, cf in locations:
        by_db.setdefault(path, []).append(cf)
    dbs = []
    try:
        cfs = []
        for path, names in by_db.items():
            opts = Options(raw_mode=True)
            families = {n: Options(raw_mode=True) for n in Rdict.list_cf(str(path), opts)}
            db = Rdict(
                str(path),
                opts,
                column_families=families,
                access_type=AccessType.read_only(),
            )
            dbs.append(db)
            cfs.extend(db.get_column_family(n) for n in names)
        n = 0
        t, cpu = time.perf_counter(), time.thread_time()
        for cf in cfs:
            for _ in cf.keys():  # noqa: SIM118 (an Rdict: keys() is its key iterator)
                n += 1
        seconds, cpu = time.perf_counter() - t, time.thread_time() - cpu
    finally:
        for db in dbs:
            db.close()
    return n, seconds, cpu
