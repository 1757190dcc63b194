"""Crash safety for real: a writer process is SIGKILLed mid-stream; every acknowledged
mutation must be there exactly once after reopening, and seqnos must continue."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict

from shardex.api.records import Change, SnapshotMarker
from shardex.data.engine import DataEngine

WRITER = textwrap.dedent(
    """
    import sys, threading
    from shardex.api.records import MutationResult
    from shardex.data.engine import DataEngine

    eng = DataEngine(sys.argv[1])
    eng.create_keyspace("ks", 4, exist_ok=True)
    for p in range(4):
        eng.create_partition("ks", p, exist_ok=True)
    out = threading.Lock()

    def ack(op, docid, r):
        with out:
            sys.stdout.write(f"ACK {op} {docid} {r.partition} {r.seqno}\\n")
            sys.stdout.flush()

    def writer(t):
        i = 0
        live = []
        while True:
            i += 1
            if i % 4 == 0:
                items = [(f"t{t}-b{i}-{j}", {"t": t, "i": i, "j": j}) for j in range(5)]
                for (docid, _), r in zip(items, eng.upsert_many("ks", items)):
                    ack("upsert", docid, r)
            elif i % 7 == 0 and live:
                docid = live.pop()
                ack("delete", docid, eng.delete("ks", docid))
            else:
                docid = f"t{t}-{i}"
                ack("upsert", docid, eng.upsert("ks", docid, {"t": t, "i": i, "pad": "x" * 300}))
                live.append(docid)

    with out:
        print("READY", flush=True)
    for t in range(2):
        threading.Thread(target=writer, args=(t,), daemon=True).start()
    threading.Event().wait()
    """
)


def test_kill_9_loses_no_acknowledged_write_and_duplicates_nothing(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    db = tmp_path / "db"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    acks: list[tuple[str, str, int, int]] = []
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        deadline = time.monotonic() + 30
        while len(acks) < 400 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break  # the writer died on its own: the assertion below reports it
            if line.startswith("ACK "):
                _, op, docid, p, seqno = line.split()
                acks.append((op, docid, int(p), int(seqno)))
        os.kill(proc.pid, signal.SIGKILL)
        # Whatever the writer printed before dying was acknowledged: collect it too.
        for line in proc.stdout:
            parts = line.split()
            if len(parts) == 5 and parts[0] == "ACK":
                acks.append((parts[1], parts[2], int(parts[3]), int(parts[4])))
    finally:
        proc.kill()
        proc.wait()
    assert len(acks) >= 400, "the writer did not get going"

    with DataEngine(db) as eng:
        logs: dict[int, list[Change]] = {}
        for p in range(4):
            items = list(eng.stream("ks", p, 0, 0))
            assert all(isinstance(i, Change) for i in items[1:])
            assert isinstance(items[0], SnapshotMarker)
            logs[p] = [i for i in items if isinstance(i, Change)]
            high = eng.partition_info("ks", p).high_seqno
            # Gap-free, each seqno exactly once, and the log ends at the persisted high seqno.
            assert [c.seqno for c in logs[p]] == list(range(1, high + 1))

        by_seqno = {(p, c.seqno): c for p, log in logs.items() for c in log}
        last_in_log: dict[str, Change] = {}
        for log in logs.values():
            for c in log:
                last_in_log[c.docid] = c
        for op, docid, p, seqno in acks:
            c = by_seqno.get((p, seqno))
            assert c is not None, f"acknowledged {op} {docid}@{p}:{seqno} lost"
            assert (c.docid, c.op) == (docid, op)

        # Each (docid, seqno) appears once in the logs, and every document's record is the
        # last version in its log (the acked one, or a later write that also committed).
        seen = defaultdict(int)
        for log in logs.values():
            for c in log:
                seen[(c.docid, c.seqno)] += 1
        assert max(seen.values()) == 1
        for docid, c in last_in_log.items():
            rec = eng._parts[("ks", c.partition)].read_doc(docid)
            assert rec is not None and rec.seqno == c.seqno and rec.deleted == c.deleted
            if not c.deleted:
                assert eng.get("ks", docid).seqno == c.seqno

        # Seqnos continue from the persisted high seqno.
        for p in range(4):
            high = eng.partition_info("ks", p).high_seqno
            docid = next(f"new{i}" for i in range(1000) if eng.partition_for("ks", f"new{i}") == p)
            assert eng.upsert("ks", docid, {}).seqno == high + 1
