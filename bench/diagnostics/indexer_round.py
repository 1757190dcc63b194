"""Where one maintenance round's time goes, in process:
``python -m bench.diagnostics.indexer_round``.

One process plays the driver and three indexer nodes (an ``IndexerEngine`` each, on its own
temporary RocksDB store, WAL-synced as a node is unless ``--no-sync``), with the two indexes
of ``bench.pipeline`` (``by_city_age`` over 4 slices by docid, ``by_email`` unpartitioned
with a WHERE) spread over the nodes as a cluster places them. Documents are the bench's demo
users over 64 data partitions, first loaded by a round of their own. Then each round
changes ``--changes`` documents and runs, phase by phase, what the pipeline and the
indexers do for one batch:

* driver: ``route`` (by the topologies), then per node the ``DeliverAndStabilise`` message
  built and encoded as a frame (``encode``);
* indexer, per node (summed over the three): the frame decoded (``decode``), ``enqueue``,
  the stabilise's ``prepare`` (decide + gather into the batch), the store's ``write`` (and
  fsync), ``commit`` (queue dropped, snapshot), and the ``Stabilised`` reply built and
  encoded (``reply``).

Two shapes alternate (``--shape``): ``drain`` (every row in the round, what the drain of a
backlog and a fallback do) and ``early`` (rows delivered ahead as ``DeliverKeyVersions``,
decoded, queued and decided beforehand as the indexer does after its reply; the round then
carries no rows). Thread CPU per phase (``time.thread_time``; the network, the event loop
and the executor hop are not in it: ``bench.pipeline`` measures rounds on a real cluster),
printed per key version and per round, medians over ``--rounds`` after one warm-up round;
``--json PATH`` writes every round. For before/after figures run another tree with
``PYTHONPATH=<git archive of it>/src:.`` (this bench file from this tree).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common.dataset import SEED, updates
from bench.common.runner import load_average, print_table

PARTITIONS = 64
NODES = ("n0", "n1", "n2")
UUID = 11

PHASES = (
    "route",
    "encode",
    "decode",
    "enqueue",
    "decide",
    "prepare",
    "write",
    "commit",
    "reply",
)


def _defs() -> list[Any]:
    from shardex.meta.index_definition import make_definition

    return [
        make_definition(
            id="ix_city_age",
            name="by_city_age",
            keyspace="ks",
            keys=["address.city", "age"],
            partition_by=["META().id"],
            num_partition=4,
        ),
        make_definition(
            id="ix_email", name="by_email", keyspace="ks", keys=["email"], where="status = 'active'"
        ),
    ]


class _Clock:
    """Thread CPU per phase, accumulated between ``start`` and ``take``."""

    def __init__(self) -> None:
        self.now: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **kw: Any) -> Any:
            t = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                self.now[name] += time.thread_time() - t

        return run

    def take(self) -> dict[str, float]:
        out, self.now = self.now, dict.fromkeys(PHASES, 0.0)
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=20_000, help="changes per round")
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=4, help="measured rounds per shape")
    ap.add_argument("--shape", choices=("drain", "early", "both"), default="both")
    ap.add_argument("--no-sync", action="store_true", help="no WAL fsync per stabilise")
    ap.add_argument("--json", type=Path, help="write every round here")
    args = ap.parse_args(argv)

    from shardex.api.delivery import DeliverAndStabilise, DeliverKeyVersions
    from shardex.core.timestamp import SeqnoEntry, Timestamp
    from shardex.index.engine import IndexerEngine
    from shardex.meta.partitioning import partition_of
    from shardex.net.messages import Envelope, Kind, decode_frame, encode_frame
    from shardex.pipeline.project.projector import OP_UPSERT, project
    from shardex.pipeline.project.router import IndexRoute, route

    defs = _defs()
    owners = {d.id: {p: NODES[p % len(NODES)] for p in range(d.num_partition)} for d in defs}
    routes = {d.id: IndexRoute.of(d, owners[d.id]) for d in defs}
    plan = {n: sorted({i for i, o in owners.items() if n in o.values()}) for n in NODES}
    clock = _Clock()
    seqnos: dict[int, int] = {}
    shapes = ["drain", "early"] if args.shape == "both" else [args.shape]
    results: list[dict[str, Any]] = []

    with tempfile.TemporaryDirectory(prefix="shardex-bench-round-") as tmp:
        engines = {n: IndexerEngine(Path(tmp) / n, sync=not args.no_sync) for n in NODES}
        for n, eng in engines.items():
            for d in defs:
                for p, owner in owners[d.id].items():
                    if owner == n:
                        eng.create_slice(d, p)
            eng.store.write = clock.timed("write", eng.store.write)
            for sl in eng.slices():  # timed on the instances: the class stays as it is
                sl.prepare = clock.timed("prepare", sl.prepare)  # type: ignore[method-assign]
                sl.commit = clock.timed("commit", sl.commit)  # type: ignore[method-assign]

        def changes(n: int, seed: int) -> tuple[list[Any], Timestamp]:
            out = []
            for docid, body in updates(n, args.docs, seed):
                p = partition_of(docid, PARTITIONS)
                seqnos[p] = seqnos.get(p, 0) + 1
                out.append((docid, p, seqnos[p], OP_UPSERT, body))
            out.sort(key=lambda c: (c[1], c[2]))  # a batch is read partition by partition
            ts = Timestamp({p: SeqnoEntry(s, UUID) for p, s in seqnos.items()})
            return project(defs, out).rows, ts

        def round_(batch: int, rows: list[Any], ts: Timestamp, shape: str) -> dict[str, Any]:
            clock.take()
            w0 = time.perf_counter()
            by_node = clock.timed("route", lambda: route(rows, routes).by_node)()
            wire = dict(ts.to_wire())
            kvs = sum(len(v) for v in by_node.values())
            if shape == "early":
                for n in NODES:
                    msg = DeliverKeyVersions(
                        keyspace="ks", batch_id=batch, rows=list(by_node.get(n, ()))
                    )
                    frame = clock.timed("encode", encode_frame)(Envelope(Kind.REQUEST, 1, msg))
                    got = clock.timed("decode", decode_frame)(frame).body
                    eng = engines[n]
                    clock.timed("enqueue", eng.enqueue)(got.rows, keyspace="ks")
                    clock.timed("decide", getattr(eng, "decide_pending", lambda: 0))()
                by_node = {}
            for n in NODES:
                msg = DeliverAndStabilise(
                    keyspace="ks",
                    batch_id=batch,
                    rows=list(by_node.get(n, ())),
                    ts=wire,
                    index_ids=plan[n],
                )
                frame = clock.timed("encode", encode_frame)(Envelope(Kind.REQUEST, 2, msg))
                got = clock.timed("decode", decode_frame)(frame).body
                eng = engines[n]
                enq = clock.timed("enqueue", eng.enqueue)
                kw: dict[str, Any] = {"keyspace": "ks"}
                if "ahead" in eng.enqueue.__code__.co_varnames:
                    kw["ahead"] = False
                enq(got.rows, **kw)
                res = eng.stabilise_many(got.index_ids, Timestamp.from_wire(got.ts), got.slices)
                t = time.thread_time()
                reply = [(r.index_id, r.partition, dict(r.applied.to_wire())) for r in res.slices]
                encode_frame(Envelope(Kind.RESPONSE, 2, _ack(reply)))
                clock.now["reply"] += time.thread_time() - t
            wall = time.perf_counter() - w0
            cpu = clock.take()
            return {"batch": batch, "shape": shape, "kvs": kvs, "wall": wall, "cpu": cpu}

        rows, ts = changes(args.docs, SEED)  # every document once: the back index filled
        round_(0, rows, ts, "drain")
        batch = 0
        for r in range(args.rounds + 1):
            for shape in shapes:
                batch += 1
                rows, ts = changes(args.changes, SEED + batch)
                got = round_(batch, rows, ts, shape)
                if r > 0:  # the first of each shape warms caches
                    results.append(got)
        for eng in engines.values():
            eng.close()

    table = []
    for shape in shapes:
        got = [g for g in results if g["shape"] == shape]
        kvs = statistics.median(g["kvs"] for g in got)
        row: dict[str, Any] = {"shape": shape, "key versions": int(kvs)}
        total = [sum(g["cpu"].values()) for g in got]
        for ph in PHASES:
            med = statistics.median(g["cpu"][ph] for g in got)
            row[ph] = round(med * 1e6 / kvs, 2)
        row["sum us/kv"] = round(statistics.median(total) * 1e6 / kvs, 2)
        row["round CPU ms"] = round(statistics.median(total) * 1e3, 1)
        row["wall ms"] = round(statistics.median(g["wall"] for g in got) * 1e3, 1)
        table.append(row)
    print_table(
        f"one round's thread CPU per key version (us), by phase; load {load_average()}", table
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json)},
                    "load": load_average(),
                    "rounds": results,
                },
                indent=1,
            )
        )
    return 0


def _ack(reply: list[Any]) -> Any:
    from shardex.api.delivery import SliceAck, Stabilised

    return Stabilised(
        node="n0",
        incarnation="x" * 32,
        acks=[
            SliceAck(index_id=i, partition=p, applied=a, items_count=0, state="active")
            for i, p, a in reply
        ],
    )


if __name__ == "__main__":
    sys.exit(main())
