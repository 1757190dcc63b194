"""Crash recovery for real: an indexer process is SIGKILLed between (or during) stabilises.
After reopening, each index's applied TS is one that was committed (the last acknowledged,
or the next one if the kill hit after its commit but before the ack was printed), the
entries equal the oracle at that TS, queued-but-unapplied key versions are gone, and
re-delivering from the applied TS converges to the final state."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from shardex.index import IndexerEngine
from shardex.testing.index import LocalPipeline, workload_definitions

STEPS = 40

HISTORY = textwrap.dedent(
    """
    import random
    from shardex.testing.index import FakeKeyspace, random_workload

    def history(steps):
        ks = FakeKeyspace(num_partitions=4)
        rng = random.Random(5)
        tss = []
        for _ in range(steps):
            random_workload(ks, rng, 25)
            tss.append(ks.ts())
        return ks, tss
    """
)

CHILD = HISTORY + textwrap.dedent(
    """
    import sys, time
    from shardex.index import IndexerEngine
    from shardex.testing.index import LocalPipeline, workload_definitions

    ks, tss = history(int(sys.argv[2]))
    defs = workload_definitions()
    eng = IndexerEngine(sys.argv[1], sync=True)
    placement = {d.id: {p: "n1" for p in range(d.num_partition)} for d in defs}
    pipe = LocalPipeline(defs, {"n1": eng}, placement)
    pipe.create_slices()
    prev = None
    for i, t in enumerate(tss):
        pipe.deliver(ks.changes(prev, t))   # queued, not yet applied
        time.sleep(0.002)
        pipe.stabilise(t)
        print("ACK", i, flush=True)
        prev = t
    print("DONE", flush=True)
    time.sleep(60)
    """
)


def history(steps: int):
    ns: dict = {}
    exec(HISTORY, ns)
    return ns["history"](steps)


@pytest.mark.parametrize("kill_after", [2, 9, 17])
def test_kill_9_between_stabilises(tmp_path, kill_after: int) -> None:
    path = tmp_path / "idx"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(STEPS)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    last_ack = -1
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("ACK"):
                last_ack = int(line.split()[1])
                if last_ack >= kill_after:
                    time.sleep(random.Random(kill_after).random() * 0.01)
                    break
            else:
                pytest.fail(f"child finished before the kill: {line!r}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    # acks printed after the one we stopped reading at (the child ran on while we slept)
    assert proc.stdout is not None
    for line in proc.stdout.read().splitlines():
        # the kill may cut the last line short ("ACK" without its number): not counted, a
        # weaker claim than the child made, never a stronger one
        words = line.split()
        if len(words) == 2 and words[0] == "ACK":
            last_ack = int(words[1])
    ks, tss = history(STEPS)
    defs = workload_definitions()
    placement = {d.id: {p: "n1" for p in range(d.num_partition)} for d in defs}
    with IndexerEngine(path, sync=False) as eng:
        pipe = LocalPipeline(defs, {"n1": eng}, placement)
        for d in defs:
            applied = set(eng.applied_ts(d.id).values())
            assert len(applied) == 1, "slices of one index were stabilised in one batch"
            [ts] = applied
            k = tss.index(ts)
            assert k in (last_ack, last_ack + 1), (d.id, k, last_ack)
            for sl in eng.slices(d.id):
                assert sl.queued() == 0
        # every index at its own applied TS matches the oracle (at its recovery snapshot)
        for d in defs:
            [ts] = set(eng.applied_ts(d.id).values())
            single = LocalPipeline([d], {"n1": eng}, {d.id: placement[d.id]})
            single.check(ts, ks.documents_at(ts))
        # the pipeline resumes from the minimum applied TS and re-delivers
        resume = min((next(iter(eng.applied_ts(d.id).values())) for d in defs), key=tss.index)
        final = tss[-1]
        pipe.deliver(ks.changes(resume, final))
        pipe.stabilise(final)
        pipe.check(final, ks.documents_at(final))


def test_history_is_deterministic() -> None:
    """The child and the parent rebuild the same history from the random seed."""
    a, ta = history(5)
    b, tb = history(5)
    assert ta == tb and a.log == b.log
