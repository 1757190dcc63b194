"""The indexer's CPU per key version: ``python -m bench.diagnostics.indexer_profile [--profile]``.

In-process ``IndexerEngine`` over a temporary RocksDB store (no network, no Spark):

* **maintenance**: 2 indexes x ``--slices`` slices; ``--versions`` changes per round,
  projected and routed (upserts that change keys, unchanged re-upserts, deletes) plus a
  re-delivery of half the previous round's key versions; ``--rounds`` rounds of ``enqueue``,
  ``decide_pending`` (what an indexer does after acknowledging an early delivery:
  ``index/slice_decisions.py``) then ``stabilise_many`` at the round's TS;
* **load**: ``--load-rows`` UPSERT rows into one slice through ``load_chunk`` (frames of
  ``MAX_ROWS_PER_FRAME``) and ``load_finish`` (sort, SST, ingest).

Prints CPU microseconds per key version of the calling thread (``time.thread_time``: RocksDB's
background flushes and compactions are left out, and the figure is less noisy than wall time
on a shared machine) for each stage; ``--profile`` adds the top cProfile entries per stage.
``--sync`` WAL-syncs each stabilise as a node does; ``--phases`` adds the wall time of a
stabilise's phases (medians over the rounds, ms per stabilise: the slices' ``prepare``,
the store's write, their ``commit``); ``--rows-frames`` sends the load as
whole key-version rows instead of columns. For before/after figures run an older tree with
``PYTHONPATH=<git archive of it>/src`` (the bench adapts to a ``LoadChunk`` without columns).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import tempfile
import time
from collections.abc import Callable
from typing import Any

import msgspec

from shardex.api.delivery import MAX_ROWS_PER_FRAME, LoadChunk
from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.index.engine import IndexerEngine
from shardex.index.keyversion import DELETE, UPSERT, UPSERT_DELETION, KeyVersion
from shardex.meta.index_definition import make_definition
from shardex.pipeline.project.projector import project
from shardex.pipeline.project.router import IndexRoute, route

NUM_PARTITIONS = 8
UUID = 7


def _defs(slices: int) -> list[Any]:
    return [
        make_definition(
            id="i1",
            name="by_age",
            keyspace="ks",
            keys=["age"],
            partition_by=["META().id"],
            num_partition=slices,
        ),
        # partitioned by city: a key change moves the entry between slices (UpsertDeletions)
        make_definition(
            id="i2",
            name="by_city",
            keyspace="ks",
            keys=["city", "age"],
            partition_by=["city"],
            num_partition=slices,
        ),
    ]


def _rows_for_round(
    defs: list[Any], n: int, docs: int, seqnos: dict[int, int], rng: random.Random
) -> list[KeyVersion]:
    """Project ``n`` changes (80% upserts with a new key, 10% unchanged, 10% deletes) and
    route them to every slice (all slices are local)."""
    from shardex.meta.partitioning import partition_of
    from shardex.pipeline.project.projector import OP_DELETE, OP_UPSERT, ChangeRow

    changes: list[ChangeRow] = []
    for _ in range(n):
        docid = f"doc{rng.randrange(docs):08d}"
        p = partition_of(docid, NUM_PARTITIONS)
        seqnos[p] = seqnos.get(p, 0) + 1
        r = rng.random()
        if r < 0.1:
            changes.append((docid, p, seqnos[p], OP_DELETE, None))
        else:
            age = 30 if r < 0.2 else rng.randrange(100)
            body = b'{"age": %d, "city": "c%d"}' % (age, rng.randrange(50))
            changes.append((docid, p, seqnos[p], OP_UPSERT, body))
    res = project(defs, changes)
    routes = {d.id: IndexRoute.of(d, {i: "n1" for i in range(d.num_partition)}) for d in defs}
    return [r for rows in route(res.rows, routes).by_node.values() for r in rows]


def _measure(name: str, fn: Callable[[], Any], n: int, prof: cProfile.Profile | None) -> float:
    t0 = time.thread_time()
    if prof is not None:
        prof.enable()
    fn()
    if prof is not None:
        prof.disable()
    us = (time.thread_time() - t0) * 1e6 / max(n, 1)
    return us


class _Phases:
    """Wall time per stabilise of its phases (``--phases``): wraps ``Slice.prepare`` and
    ``Slice.commit`` (class attributes, restored by ``close``) and the store's ``write``."""

    NAMES = ("prepare", "write", "commit")

    def __init__(self, store: Any) -> None:
        from shardex.index.slice import Slice

        self.now: dict[str, float] = dict.fromkeys(self.NAMES, 0.0)
        self.rounds: list[dict[str, float]] = []
        self._saved = {n: getattr(Slice, n) for n in ("prepare", "commit")}
        for name, fn in self._saved.items():
            setattr(Slice, name, self._timed(name, fn))
        store.write = self._timed("write", store.write)

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.now[name] += time.perf_counter() - t

        return timed

    def start(self) -> None:
        self.now = dict.fromkeys(self.NAMES, 0.0)

    def stop(self, total: float) -> None:
        self.rounds.append({**self.now, "total": total})

    def close(self) -> None:
        from shardex.index.slice import Slice

        for name, fn in self._saved.items():
            setattr(Slice, name, fn)

    def report(self) -> None:
        import statistics

        for k in ("total", *self.NAMES):
            med = statistics.median(r[k] for r in self.rounds)
            print(f"  wall {k:8s} {med * 1e3:7.2f} ms per stabilise (median)")


def maintenance(args: argparse.Namespace) -> None:
    rng = random.Random(1)
    defs = _defs(args.slices)
    seqnos: dict[int, int] = {}
    # decide: what an indexer does right after acknowledging an early delivery
    # (``index/slice_decisions.py``); the stabilise then only writes the decisions.
    totals = {"enqueue": 0.0, "decide": 0.0, "stabilise": 0.0}
    n_total = 0
    profs = {k: cProfile.Profile() if args.profile else None for k in totals}
    with tempfile.TemporaryDirectory() as tmp:
        eng = IndexerEngine(tmp, sync=args.sync)
        phases = _Phases(eng.store) if args.phases else None
        for d in defs:
            for p in range(d.num_partition):
                eng.create_slice(d, p)
        prev: list[KeyVersion] = []
        for _ in range(args.rounds):
            rows = _rows_for_round(defs, args.versions, args.docs, seqnos, rng)
            batch = rows + prev[: len(prev) // 2]  # re-delivery of half the last round
            prev = rows
            ts = Timestamp({p: SeqnoEntry(s, UUID) for p, s in seqnos.items()})
            n_total += len(batch)
            totals["enqueue"] += _measure(
                "enqueue", lambda b=batch: eng.enqueue(b), 1, profs["enqueue"]
            )
            decide = getattr(eng, "decide_pending", None)  # absent before ``slice_decisions.py``
            if decide is not None:
                totals["decide"] += _measure("decide", decide, 1, profs["decide"])
            if phases is not None:
                phases.start()
            w = time.perf_counter()
            totals["stabilise"] += _measure(
                "stabilise",
                lambda t=ts: eng.stabilise_many([d.id for d in defs], t),
                1,
                profs["stabilise"],
            )
            if phases is not None:
                phases.stop(time.perf_counter() - w)
        kinds = {UPSERT: 0, UPSERT_DELETION: 0, DELETE: 0}
        for r in prev:
            kinds[r[2]] += 1
        stats = [s.stats for s in eng.slices()]
        print(
            f"maintenance: {n_total} key versions ({args.rounds} rounds, 2 indexes x "
            f"{args.slices} slices), applied {sum(s.applied for s in stats)}, "
            f"writes {sum(s.writes for s in stats)}, unchanged {sum(s.unchanged for s in stats)}"
        )
        for k, v in totals.items():
            print(f"  {k:10s} {v / n_total:7.2f} us CPU per key version")
        if phases is not None:
            phases.report()
            phases.close()
        eng.store.close()
    _print_profiles(profs)


def load(args: argparse.Namespace) -> None:
    rng = random.Random(2)
    d = make_definition(id="i1", name="by_age", keyspace="ks", keys=["age", "city"])
    from shardex.core.keycodec import encode_entry

    rows: list[KeyVersion] = []
    for i in range(args.load_rows):
        docid = f"doc{i:09d}"
        entry = encode_entry([rng.randrange(100), f"c{rng.randrange(50)}"], docid)
        rows.append(("i1", 0, UPSERT, entry, docid, i % NUM_PARTITIONS, i + 1))
    rng.shuffle(rows)
    ts0 = Timestamp({p: SeqnoEntry(args.load_rows + 1, UUID) for p in range(NUM_PARTITIONS)})
    profs = {k: cProfile.Profile() if args.profile else None for k in ("chunk", "finish")}
    with tempfile.TemporaryDirectory() as tmp:
        eng = IndexerEngine(tmp, sync=False)
        eng.create_slice(d, 0)
        n = len(rows)

        # The sender's frames, encoded as on the wire (not measured): the node's stage is
        # decoding them plus ``load_chunk``, what ``IndexDelivery.on_load_chunk`` runs.
        wire = dict(ts0.to_wire())
        frames = []
        for i in range(0, n, MAX_ROWS_PER_FRAME):
            frame = rows[i : i + MAX_ROWS_PER_FRAME]
            if args.rows_frames or not hasattr(LoadChunk, "columnar"):  # (older tree)
                msg = LoadChunk(index_id="i1", partition=0, ts0=wire, rows=frame)
            else:
                msg = LoadChunk.columnar("i1", 0, wire, frame)
            frames.append(msgspec.msgpack.encode(msg))
        wire_bytes = sum(len(f) for f in frames)
        dec = msgspec.msgpack.Decoder(LoadChunk)

        def chunks() -> None:
            for raw in frames:
                m = dec.decode(raw)
                if hasattr(m, "docids"):
                    cols = (m.entries, m.docids, m.partitions, m.seqnos)
                    eng.load_chunk("i1", 0, ts0, m.rows, m.docs, columns=cols)
                else:  # an older tree, for before/after figures
                    eng.load_chunk("i1", 0, ts0, m.rows, m.docs)

        c = _measure("chunk", chunks, n, profs["chunk"])
        f = _measure("finish", lambda: eng.load_finish("i1", 0, ts0), n, profs["finish"])
        kind = "rows" if args.rows_frames or not hasattr(LoadChunk, "columnar") else "columnar"
        print(
            f"load: {n} rows, {eng.slice('i1', 0).items_count} entries, {kind} frames of "
            f"{wire_bytes / n:.1f} bytes/row"
        )
        print(f"  load_chunk  {c:7.2f} us CPU per row (decode + load_chunk)")
        print(f"  load_finish {f:7.2f} us CPU per row")
        eng.store.close()
    _print_profiles(profs)


def _print_profiles(profs: dict[str, cProfile.Profile | None]) -> None:
    for k, p in profs.items():
        if p is None:
            continue
        print(f"--- {k} ---")
        pstats.Stats(p).sort_stats("tottime").print_stats(14)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=5_000, help="changes per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--slices", type=int, default=3)
    ap.add_argument("--load-rows", type=int, default=100_000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sync", action="store_true", help="WAL-synced stabilise (as on a node)")
    ap.add_argument("--phases", action="store_true", help="wall time of a stabilise's phases")
    ap.add_argument("--rows-frames", action="store_true", help="LoadChunk rows, not columns")
    ap.add_argument("--only", choices=("maintenance", "load"))
    args = ap.parse_args()
    if args.only != "load":
        maintenance(args)
    if args.only != "maintenance":
        load(args)


if __name__ == "__main__":
    main()
