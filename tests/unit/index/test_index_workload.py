"""Randomized workloads through projector -> router -> several indexer nodes, checked with the
oracle at every stability TS (and at older snapshots), with re-delivered key versions,
random batch boundaries and stabilisations that cut through what was delivered.

A failing seed replays exactly:
``SHARDEX_INDEX_SEED=N pytest tests/unit/index/test_index_workload.py``.
"""

from __future__ import annotations

import os
import random

import pytest

from shardex.core.timestamp import Timestamp
from shardex.index import UPSERT, IndexerEngine
from shardex.index.oracle import check_index, expected_errors
from shardex.pipeline.project.projector import Projector, project
from shardex.testing.index import (
    FakeKeyspace,
    LocalPipeline,
    random_workload,
    workload_definitions,
)

SEEDS = [int(os.environ["SHARDEX_INDEX_SEED"])] if "SHARDEX_INDEX_SEED" in os.environ else [1, 2, 3]
NODES = ["n1", "n2", "n3"]


def make_pipeline(
    tmp_path, rng: random.Random, keep: int = 4, num_replica: int = 0
) -> LocalPipeline:
    defs = workload_definitions()
    engines = {n: IndexerEngine(tmp_path / n, keep_snapshots=keep, sync=False) for n in NODES}
    placement = {d.id: {p: rng.choice(NODES) for p in range(d.num_partition)} for d in defs}
    # Replica copies of each partition on other nodes, as place_replicas would put them.
    replicas = {
        d.id: {p: rng.sample([n for n in NODES if n != node], num_replica) for p, node in a.items()}
        for d in defs
        for a in [placement[d.id]]
    }
    pipe = LocalPipeline(defs, engines, placement, replicas=replicas if num_replica else {})
    pipe.create_slices()
    return pipe


def close(pipe: LocalPipeline) -> None:
    for e in pipe.engines.values():
        e.close()


def cut(rng: random.Random, start: Timestamp | None, end: Timestamp) -> Timestamp:
    """A TS between ``start`` and ``end`` per partition (stabilise through a delivery)."""
    out = {}
    for p, e in end.items():
        lo = start.seqno(p) if start is not None and p in start else 0
        out[p] = (rng.randint(lo, e.seqno), e.uuid)
    return Timestamp(out)


@pytest.mark.parametrize(("seed", "num_replica"), [(s, 0) for s in SEEDS] + [(SEEDS[0], 2)])
def test_random_workload_matches_oracle(tmp_path, seed: int, num_replica: int) -> None:
    """With replicas, every copy gets the same rows and stabilise and must hold exactly its
    primary's entries at every TS (``LocalPipeline.check``)."""
    rng = random.Random(seed)
    ks = FakeKeyspace(num_partitions=8)
    pipe = make_pipeline(tmp_path, rng, num_replica=num_replica)
    delivered: Timestamp | None = None  # what the pipeline has sent (end of last batch)
    stable: list[Timestamp] = []
    try:
        for _ in range(14):
            random_workload(ks, rng, rng.randint(5, 60))
            end = ks.ts()
            changes = ks.changes(delivered, end)
            if rng.random() < 0.3 and delivered is not None:
                # a re-run micro-batch: the same range again, from an earlier start
                changes = ks.changes(stable[-1] if stable else None, end)
            pipe.deliver(changes, rng=rng, redeliver=0.3)
            if len(stable) > 2 and rng.random() < 0.5:
                # an old micro-batch re-run after the indexers applied it: must change nothing
                i = rng.randrange(len(stable) - 1)
                pipe.deliver(ks.changes(stable[i], stable[i + 1]), rng=rng)
            delivered = end
            # stabilise at the end, or somewhere in the middle of what was delivered
            t = end if rng.random() < 0.6 else cut(rng, stable[-1] if stable else None, end)
            if stable and not all(t.seqno(p) >= stable[-1].seqno(p) for p in t):
                t = end
            acks = pipe.stabilise(t)
            assert all(a.ts == t for a in acks)
            stable.append(t)
            pipe.check(t, ks.documents_at(t))
            # an older stability TS still kept is still exact (scans at it see its state)
            if len(stable) > 2:
                old = stable[-3]
                for d in pipe.definitions:
                    check_index(d, pipe.entries(d.id, old), ks.documents_at(old), context="old")
                    pipe.check_copies(d.id, old)
        # drain: everything delivered becomes stable; re-deliver the whole history
        final = ks.ts()
        pipe.deliver(ks.changes(None, final), rng=rng, redeliver=0.5)
        pipe.stabilise(final)
        pipe.check(final, ks.documents_at(final))
        # evaluation errors were counted, not raised, and the oracle agrees on which
        docs = ks.documents_at(final)
        w_age = next(d for d in pipe.definitions if d.id == "w_age")
        res = Projector([w_age]).project(
            [(k, 0, 1, "upsert", v) for k, v in docs.items()], sample_limit=None
        )
        assert {e.docid for e in res.samples} == expected_errors(w_age, docs)
        assert res.errors.get("w_age", 0) == len(expected_errors(w_age, docs))
        assert sum(pipe.errors.values()) > 0
    finally:
        close(pipe)


def test_initial_build_while_writes_continue(tmp_path) -> None:
    """INIT -> MAINT (pipeline notes): build from a snapshot at T0 taken at a batch boundary
    while the stream runs; key versions <= T0 are dropped, later ones applied."""
    rng = random.Random(11)
    ks = FakeKeyspace(num_partitions=8)
    pipe = make_pipeline(tmp_path, rng, num_replica=1)
    try:
        random_workload(ks, rng, 80)
        t0 = ks.ts()
        # the stream already sent some batches past... and keeps sending during the build
        random_workload(ks, rng, 40)
        t1 = ks.ts()
        pipe.deliver(ks.changes(None, t1), rng=rng, redeliver=0.2)  # arrives during loading
        docs0 = ks.documents_at(t0)
        changes0 = [
            (d, ks.partition(d), t0.seqno(ks.partition(d)), "upsert", b) for d, b in docs0.items()
        ]
        res = project(pipe.definitions, changes0)
        per_slice: dict[tuple[str, int], list] = {}
        for row in res.rows:
            if row[2] == UPSERT:
                per_slice.setdefault((row[0], row[1]), []).append(row)
        for d in pipe.definitions:
            for p, node in pipe.copies(d.id):  # every copy loads the same rows
                pipe.engines[node].bulk_load(d.id, p, per_slice.get((d.id, p), []), t0)
        pipe.check(t0, docs0)
        pipe.stabilise(t1)
        pipe.check(t1, ks.documents_at(t1))
    finally:
        close(pipe)


def test_a_copy_that_missed_a_stabilise_is_caught_by_the_check(tmp_path) -> None:
    """The copies check is not vacuous: primaries on n1, replicas on n2, only n1 stabilised."""
    defs = workload_definitions()
    engines = {n: IndexerEngine(tmp_path / n, sync=False) for n in ("n1", "n2")}
    placement = {d.id: dict.fromkeys(range(d.num_partition), "n1") for d in defs}
    replicas = {d.id: {p: ["n2"] for p in range(d.num_partition)} for d in defs}
    pipe = LocalPipeline(defs, engines, placement, replicas=replicas)
    pipe.create_slices()
    try:
        ks = FakeKeyspace(num_partitions=8)
        random_workload(ks, random.Random(5), 40)
        pipe.deliver(ks.changes(None, ks.ts()))
        for d in defs:
            engines["n1"].stabilise(d.id, ks.ts())
        check_index(defs[0], pipe.entries(defs[0].id, None), ks.documents_at(ks.ts()))
        with pytest.raises(AssertionError, match="replica 1 of slice"):
            pipe.check(ks.ts(), ks.documents_at(ks.ts()), tip=True)
        for d in defs:
            engines["n2"].stabilise(d.id, ks.ts())
        pipe.check(ks.ts(), ks.documents_at(ks.ts()))
    finally:
        close(pipe)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 140))
def test_random_workload_many_seeds(tmp_path, seed: int) -> None:
    # every tenth seed with replicas, so copies are checked across the seeds too
    test_random_workload_matches_oracle(tmp_path, seed, 1 if seed % 10 == 0 else 0)
