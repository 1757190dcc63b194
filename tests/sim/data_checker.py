"""What the data service promises across crashes, checked against what a client saw.

``DataHistory`` records every write the client sent (its document, durability and outcome),
every crash of a data node (kill -9 or power-off) and each partition's failover log as a
restarted node opened it. ``check`` takes that history and what was read back at the end
(each partition's change stream from 0, its failover log and high seqno, each document) and
asserts the promises of ``data/documents.py`` and ``data/recovery.py``:

* durability: a write acknowledged with ``"persist"`` was synced before its ack and survives
  any crash; one acknowledged with ``"memory"`` survives a process crash (kill -9) and may be
  lost only by a power-off of its node after the ack;
* history: an acknowledged change is either in its partition's history (its uuid's branch
  reaches its seqno) and then in the change stream at that seqno with its document, CAS and
  operation; or it was lost, and then its partition started a new branch below it, so a
  consumer at (uuid, seqno) is told to roll back to the branch point;
* seqnos: per partition and branch a seqno is acknowledged once, and one writer's
  acknowledged seqnos on a branch strictly increase (a restart never reuses a gap); the
  stream from 0 yields seqnos 1..high, dense and strictly increasing;
* branches: a restart after a kill -9 keeps every failover log as it was; after a power-off
  a partition keeps its log or starts exactly one branch, at its recovered high seqno (only
  recovery branches here);
* no phantom: every change in a stream is a write the client sent and the node did not
  refuse; each document reads back as its partition's last change for it (so at its last
  acknowledged seqno and CAS or later).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardex.api.records import OP_DELETE, Change, FailoverEntry, MutationResult
from shardex.errors import ErrorCode, ShardexError

# partition -> (failover log, high seqno), as a node holds them
Logs = dict[int, tuple[list[FailoverEntry], int]]

# Refused before anything was written: such a write must never show up in a stream.
REFUSED = (ErrorCode.CAS_MISMATCH, ErrorCode.DOC_NOT_FOUND, ErrorCode.DOC_EXISTS)


@dataclass
class Write:
    """One write the client sent: ``body`` identifies it (each body names its write)."""

    wid: str
    writer: int
    docid: str
    kind: str  # upsert / replace / delete
    body: bytes | None  # None for a delete
    durability: str
    result: MutationResult | None = None  # the acknowledgement
    acked_at: float = 0.0  # virtual time of the acknowledgement
    error: ErrorCode | None = None  # the failure, when not acknowledged


@dataclass
class Opened:
    """A data node's partitions as it opened them: failover log and high seqno each."""

    at: float
    logs: Logs


@dataclass
class Crash:
    """A crash of a data node, with its partitions' logs and high seqnos just before it."""

    at: float
    power_off: bool
    logs: Logs


@dataclass
class FinalRead:
    """What the client read back once the faults were over."""

    streams: dict[int, list[Change]]  # partition -> its change stream from 0, in order
    logs: Logs  # every partition's, read from its owner
    docs: dict[str, tuple[bytes, int, int] | None]  # docid -> (body, cas, seqno), None: absent
    # (partition, uuid, seqno) of lost acknowledged changes -> what a stream opened there
    # answered: its rollback seqno, or None when it did not ask to roll back
    rollbacks: dict[tuple[int, int, int], int | None] = field(default_factory=dict)


@dataclass
class DataHistory:
    owner: dict[int, str]  # partition -> the data node holding it
    writes: dict[str, Write] = field(default_factory=dict)
    events: dict[str, list[Crash | Opened]] = field(default_factory=dict)  # per node, in order

    def sent(self, write: Write) -> None:
        self.writes[write.wid] = write

    def acked(self, wid: str, result: MutationResult, at: float) -> None:
        self.writes[wid].result = result
        self.writes[wid].acked_at = at

    def failed(self, wid: str, exc: ShardexError) -> None:
        self.writes[wid].error = exc.code

    def crashed(self, host: str, at: float, power_off: bool, logs: Logs) -> None:
        self.events.setdefault(host, []).append(Crash(at, power_off, logs))

    def opened(self, host: str, at: float, logs: Logs) -> None:
        self.events.setdefault(host, []).append(Opened(at, logs))

    def acks(self) -> list[Write]:
        return [w for w in self.writes.values() if w.result is not None]

    def lost_acks(self, final: FinalRead) -> list[Write]:
        """Acknowledged writes whose change is not in their partition's final history."""
        return [
            w
            for w in self.acks()
            if not _in_history(w.result, final.logs[w.result.partition])  # type: ignore[arg-type]
        ]

    def power_off_after(self, host: str, at: float) -> bool:
        return any(isinstance(e, Crash) and e.power_off and e.at >= at for e in self.events[host])


def branch_end(log: list[FailoverEntry], high: int, uuid: int) -> int | None:
    """Where branch ``uuid`` of a history ends (the next newer branch's start, or ``high``
    on the newest); None when the uuid is not in the log."""
    for i, entry in enumerate(log):
        if entry.uuid == uuid:
            return high if i == 0 else log[i - 1].seqno
    return None


def _in_history(result: MutationResult, log_high: tuple[list[FailoverEntry], int]) -> bool:
    end = branch_end(*log_high, result.uuid)
    return end is not None and result.seqno <= end


def check(history: DataHistory, final: FinalRead) -> dict[str, int]:
    """Assert every promise (module docstring); returns counts of what was checked."""
    _check_seqnos(history)
    _check_branches(history, final)
    _check_streams(history, final)
    lost = _check_acked_changes(history, final)
    _check_documents(history, final)
    acks = history.acks()
    return {
        "acked": len(acks),
        "acked_memory": sum(w.durability == "memory" for w in acks),
        "lost_memory": lost,
        "unknown": sum(
            w.result is None and w.error not in REFUSED for w in history.writes.values()
        ),
        "refused": sum(w.error in REFUSED for w in history.writes.values()),
        "branches": sum(len(log) - 1 for log, _ in final.logs.values()),
        "changes": sum(len(s) for s in final.streams.values()),
    }


def _check_seqnos(history: DataHistory) -> None:
    seen: dict[tuple[int, int, int], str] = {}
    last: dict[tuple[int, int, int], tuple[int, str]] = {}  # (writer, partition, uuid)
    for w in history.acks():  # in send order, which per writer is ack order
        r = w.result
        assert r is not None
        key = (r.partition, r.uuid, r.seqno)
        assert key not in seen, (
            f"seqno {r.seqno} of partition {r.partition} (uuid {r.uuid}) acknowledged "
            f"twice: {seen[key]} and {w.wid}"
        )
        seen[key] = w.wid
        mine = (w.writer, r.partition, r.uuid)
        if mine in last:
            prev, prev_wid = last[mine]
            assert r.seqno > prev, (
                f"writer {w.writer}: {w.wid} got seqno {r.seqno} after {prev_wid} got {prev} "
                f"on partition {r.partition}, same branch"
            )
        last[mine] = (r.seqno, w.wid)


def _check_branches(history: DataHistory, final: FinalRead) -> None:
    """Logs change only when a node opens after a power-off, by one branch at the recovered
    high seqno: compared with the logs just before the crash, and between an open and the
    next crash (or the end) they stay as they are."""
    for host, events in history.events.items():
        last: Logs = {}
        crash: Crash | None = None
        for ev in events:
            for p, (log, _high) in ev.logs.items():
                if isinstance(ev, Crash) and p in last:
                    assert log == last[p][0], f"partition {p} branched while {host} ran"
            if isinstance(ev, Crash):
                crash = ev
            elif crash is not None:
                for p, (log, high) in ev.logs.items():
                    if p not in crash.logs:
                        continue
                    old = crash.logs[p][0]
                    where = f"{host} partition {p} after the crash at {crash.at:.3f}"
                    if not crash.power_off:
                        assert log == old, f"{where} (kill -9) changed its log: {old} -> {log}"
                    elif log != old:
                        assert log[1:] == old and log[0].uuid not in {e.uuid for e in old}, (
                            f"{where}: not one new branch: {old} -> {log}"
                        )
                        assert log[0].seqno == high, (
                            f"{where}: branch at {log[0].seqno}, recovered high seqno {high}"
                        )
            last = ev.logs
        for p, (log, _high) in last.items():
            assert final.logs[p][0] == log, f"partition {p} branched while {host} ran"


def _check_acked_changes(history: DataHistory, final: FinalRead) -> int:
    lost = 0
    for w in history.acks():
        r = w.result
        assert r is not None
        log, high = final.logs[r.partition]
        end = branch_end(log, high, r.uuid)
        what = (
            f"{w.wid} ({w.kind} {w.docid!r}, {w.durability}, acknowledged at "
            f"{w.acked_at:.3f} as seqno {r.seqno} uuid {r.uuid} of partition {r.partition})"
        )
        if end is not None and r.seqno <= end:
            stream = final.streams[r.partition]
            assert 0 < r.seqno <= len(stream), f"{what}: not in the change stream (high {high})"
            c = stream[r.seqno - 1]
            assert (c.docid, c.cas) == (w.docid, r.cas), (
                f"{what}: the stream has {c.docid!r} cas {c.cas} at its seqno"
            )
            assert (c.op == OP_DELETE) == (w.kind == "delete"), f"{what}: the stream has op {c.op}"
            if w.kind != "delete":
                assert c.body == w.body, f"{what}: the stream has body {c.body!r}"
            continue
        lost += 1
        assert w.durability == "memory", (
            f"{what}: LOST, yet it was synced before its ack (final log {log}, high {high})"
        )
        host = history.owner[r.partition]
        assert history.power_off_after(host, w.acked_at), (
            f"{what}: lost without a power-off of {host} after its ack"
        )
        assert end is not None and log[0].uuid != r.uuid, (
            f"{what}: lost, and its branch was not closed by a new one (log {log}, high {high})"
        )
        # A consumer that saw it resumes there: it must be sent back to the branch point.
        probe = final.rollbacks.get((r.partition, r.uuid, r.seqno))
        assert probe == end, (
            f"{what}: a stream opened there answered rollback seqno {probe} (None: no "
            f"rollback), not the branch point {end}"
        )
    return lost


def _check_streams(history: DataHistory, final: FinalRead) -> None:
    bodies = {w.body: w for w in history.writes.values() if w.body is not None}
    deletes = {
        w.docid for w in history.writes.values() if w.kind == "delete" and w.error not in REFUSED
    }
    for p, stream in final.streams.items():
        _log, high = final.logs[p]
        seqnos = [c.seqno for c in stream]
        assert seqnos == list(range(1, high + 1)), (
            f"partition {p}: stream seqnos {seqnos[:20]}... not 1..{high}"
        )
        for c in stream:
            if c.op == OP_DELETE:
                assert c.docid in deletes, (
                    f"partition {p} seqno {c.seqno}: a delete of {c.docid!r} nobody sent"
                )
                continue
            w = bodies.get(c.body)
            assert w is not None and w.docid == c.docid, (
                f"partition {p} seqno {c.seqno}: a write nobody sent: {c.docid!r} {c.body!r}"
            )
            assert w.error not in REFUSED, (
                f"partition {p} seqno {c.seqno}: {w.wid} was refused ({w.error}) yet applied"
            )


def _check_documents(history: DataHistory, final: FinalRead) -> None:
    last: dict[str, Change] = {}
    for stream in final.streams.values():
        for c in stream:
            last[c.docid] = c
    newest_ack: dict[str, Write] = {}
    for w in history.acks():
        assert w.result is not None
        if _in_history(w.result, final.logs[w.result.partition]):
            prev = newest_ack.get(w.docid)
            if prev is None or w.result.seqno > prev.result.seqno:  # type: ignore[union-attr]
                newest_ack[w.docid] = w
    for docid, got in final.docs.items():
        c = last.get(docid)
        if c is None or c.op == OP_DELETE:
            assert got is None, f"{docid!r} reads back as {got}, its last change is {c}"
        else:
            assert got == (c.body, c.cas, c.seqno), (
                f"{docid!r} reads back as {got}, its last change is seqno {c.seqno} "
                f"cas {c.cas} {c.body!r}"
            )
        w = newest_ack.get(docid)
        if w is not None:
            assert c is not None and c.seqno >= w.result.seqno, (
                f"{docid!r} is older than its acknowledged {w.wid}"
            )  # type: ignore[union-attr]
