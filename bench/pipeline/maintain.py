"""Parts 2-4 of ``bench.pipeline``: maintenance with both indexes ACTIVE.

2. Drain rate: the driver is stopped, ``mutations`` updates that change every indexed field
   are written (writer processes, unpaced, ``upsert_many`` in chunks of 1000), a new driver
   is started on the same checkpoints and timed until the published stability TS (the
   timekeeper's, ``client.stability``) covers the high seqnos: mutations/s, from the restart
   and from the start of the first batch (the query's start-up excluded).
3. Freshness: writer processes (threads pacing ``upsert_many`` chunks every 20 ms; a thread
   behind its schedule sends everything due in one bigger chunk, up to 1000, so the offered
   rate holds while each call's round trip is slow) offer ``rate`` mutations/s for
   ``seconds``; each chunk's ack time and the (partition, seqno) of
   every write are kept; a poller process reads the published stability TS every ~10 ms.
   Per write: the first poll at or after its ack whose TS covers it, minus the ack time.
4. The empty-micro-batch floor: single writes, one every ~1 s, each after the previous one
   was published: ack -> stability as in 3, and the BatchStats.total of the batch that
   carried it (plus Spark's own durations of those batches from ``recentProgress``).

Ack and poll times are wall clocks (``time.time()``) of processes on the same machine. The
writers and the poller run in their own processes (spawned) so the GIL of this process,
which runs the driver's foreachBatch, does not delay their clocks.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.dataset import KEYSPACE, updates
from bench.common.driver import InProcessDriver, covers
from bench.common.runner import Row, load1, log, ms, pct_ms
from bench.pipeline.stats import batch_row, between_row, progress_row, seqnos, wait_covered

TICK = 0.02  # a paced writer thread sends one chunk every TICK seconds (more when behind)
MAX_CHUNK = 1000  # the most one paced call sends (a writer far behind catches up in these)
POLL = 0.01


# --- subprocesses ----------------------------------------------------------------------------


def writer_main(
    cluster_dir: str,
    seed: int,
    total_docs: int,
    threads: int,
    per_thread: int,
    rate_per_thread: float | None,
    seconds: float,
    ready: Any,
    go: Any,
    start_at: Any,
    out: str,
) -> None:
    """Write ``per_thread`` updates from each of ``threads`` threads: paced at
    ``rate_per_thread`` for ``seconds`` (chunks every TICK from ``start_at``), or unpaced in
    chunks of 1000 when the rate is None. Saves partition, seqno and ack time per write."""
    from shardex.client import connect_local

    client = connect_local(cluster_dir, name="bench-writer", as_node=True)
    ks = client.keyspace(KEYSPACE)
    docs = list(updates(per_thread * threads, total_docs, seed))
    ks.partition_of(docs[0][0])  # the topology, before the clock starts
    ready.put(1)
    go.wait()
    begin = start_at.value
    acks: list[list[tuple[int, int, float]]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def run(k: int) -> None:
        mine = docs[k * per_thread : (k + 1) * per_thread]
        try:
            while time.time() < begin:
                time.sleep(0.001)
            if rate_per_thread is None:
                for i in range(0, len(mine), 1000):
                    res = ks.upsert_many(mine[i : i + 1000], chunk_size=1000)
                    now = time.time()
                    acks[k].extend((r.partition, r.seqno, now) for r in res)
                return
            # Paced by the clock, not by the calls: each call sends what is due by now (at
            # least one tick's worth, at most MAX_CHUNK), so a slow round trip makes the next
            # chunk bigger instead of lowering the offered rate; ahead of the schedule the
            # thread sleeps until its next chunk is due.
            per_tick = max(1, round(rate_per_thread * TICK))
            sent = 0
            while sent < len(mine) and time.time() < begin + seconds:
                due = int(rate_per_thread * (time.time() - begin))
                n = min(max(due - sent, per_tick), MAX_CHUNK, len(mine) - sent)
                res = ks.upsert_many(mine[sent : sent + n], chunk_size=n)
                now = time.time()
                acks[k].extend((r.partition, r.seqno, now) for r in res)
                sent += n
                delay = begin + sent / rate_per_thread - now
                if delay > 0:
                    time.sleep(delay)
        except BaseException as exc:
            errors.append(exc)

    ths = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    client.close()
    flat = [a for per in acks for a in per]
    arr = np.array(flat, dtype=np.float64).reshape(-1, 3)
    np.save(out, arr)
    if errors:
        raise errors[0]


def poller_main(cluster_dir: str, ids: list[str], parts: int, out: str, stop: Any) -> None:
    """Every POLL s: the wall time and, per data partition, the seqno both indexes'
    published stability TS cover (-1: not published). Saved at ``stop``."""
    from bench.pipeline.stats import stable_seqnos
    from shardex.client import connect_local

    client = connect_local(cluster_dir, name="bench-poller", as_node=True)
    times: list[float] = []
    rows: list[list[int]] = []
    nxt = time.time()
    while not stop.is_set():
        st = stable_seqnos(client, ids)
        times.append(time.time())
        rows.append([-1] * parts if st is None else [st.get(p, 0) for p in range(parts)])
        nxt += POLL
        delay = nxt - time.time()
        if delay > 0:
            time.sleep(delay)
        else:
            nxt = time.time()
    client.close()
    np.savez(out, t=np.array(times), seq=np.array(rows, dtype=np.int64).reshape(-1, parts))


class Procs:
    """Spawned helper processes, terminated (by object) if still alive at exit."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.procs: list[Any] = []

    def start(self, target: Any, *args: Any) -> Any:
        p = self.ctx.Process(target=target, args=args, daemon=True)
        p.start()
        self.procs.append(p)
        return p

    def join_ok(self, p: Any, timeout: float) -> None:
        p.join(timeout)
        if p.is_alive():
            raise TimeoutError(f"helper process {p.pid} still running after {timeout}s")
        if p.exitcode != 0:
            raise RuntimeError(f"helper process {p.pid} failed (exit code {p.exitcode})")

    def close(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(5)


def write_updates(
    procs: Procs,
    work: Path,
    cluster_dir: Path,
    *,
    tag: str,
    seed: int,
    total_docs: int,
    writers: int,
    threads: int,
    per_thread: int,
    rate: float | None,
    seconds: float,
    timeout: float,
) -> np.ndarray:
    """Run ``writers`` writer processes; returns their (partition, seqno, ack) rows."""
    ready, go = procs.ctx.Queue(), procs.ctx.Event()
    start_at = procs.ctx.Value("d", 0.0)
    outs = [work / f"acks-{tag}-{w}.npy" for w in range(writers)]
    per_rate = None if rate is None else rate / (writers * threads)
    ps = [
        procs.start(
            writer_main,
            str(cluster_dir),
            seed + 1000 * w,
            total_docs,
            threads,
            per_thread,
            per_rate,
            seconds,
            ready,
            go,
            start_at,
            str(outs[w]),
        )
        for w in range(writers)
    ]
    for _ in ps:  # every writer has generated its documents
        ready.get(timeout=timeout)
    start_at.value = time.time() + 0.2
    go.set()
    for p in ps:
        procs.join_ok(p, timeout)
    return np.concatenate([np.load(o) for o in outs])


class Poller:
    def __init__(self, procs: Procs, work: Path, cluster_dir: Path, ids: list[str], parts: int):
        self.out = work / f"poll-{time.monotonic_ns()}.npz"
        self.stop_event = procs.ctx.Event()
        self.procs = procs
        self.proc = procs.start(
            poller_main, str(cluster_dir), ids, parts, str(self.out), self.stop_event
        )

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        self.stop_event.set()
        self.procs.join_ok(self.proc, 30)
        data = np.load(self.out)
        return data["t"], data["seq"]


def ack_to_stable(acks: np.ndarray, t: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Per write: seconds from its ack to the first poll at or after the ack whose TS covers
    its (partition, seqno); NaN if no poll did."""
    out = np.full(len(acks), np.nan)
    for p in np.unique(acks[:, 0]).astype(int):
        sel = np.nonzero(acks[:, 0] == p)[0]
        col = np.maximum.accumulate(seq[:, p])  # published TSs only move forward
        first_cov = np.searchsorted(col, acks[sel, 1], side="left")
        first_after = np.searchsorted(t, acks[sel, 2], side="left")
        idx = np.maximum(first_cov, first_after)
        ok = idx < len(t)
        out[sel[ok]] = t[idx[ok]] - acks[sel[ok], 2]
    return out


def spark_progress(driver: InProcessDriver, recs: list[tuple[float, Any]]) -> list[dict]:
    """Spark's queryProgress of the batches in ``recs`` (as far as recentProgress holds;
    one per batch: idle triggers report the next batch id too, without ``addBatch``)."""
    kp = driver.keyspace()
    wanted = {s.batch_id for _, s in recs}
    progress = [] if kp is None or kp.query is None else kp.query.recentProgress
    by_id = {p["batchId"]: p for p in progress if "addBatch" in p.get("durationMs", {})}
    return [p for b, p in sorted(by_id.items()) if b in wanted]


# --- part 2: drain ---------------------------------------------------------------------------


def drain(
    ctx: Any, driver: InProcessDriver, mutations: int
) -> tuple[list[Row], list[Row], InProcessDriver]:
    """Stop the driver, write, restart, time until covered. Returns the new driver."""
    client, ids = ctx.client, ctx.ids
    wait_covered(client, ids, seqnos(client.high_seqnos(KEYSPACE)), timeout=300)
    driver.stop()
    log(f"drain: driver stopped; writing {mutations} updates")
    t = time.perf_counter()
    acks = write_updates(
        ctx.procs,
        ctx.work,
        ctx.cluster_dir,
        tag="drain",
        seed=ctx.seed + 11,
        total_docs=ctx.docs,
        writers=ctx.writers,
        threads=ctx.threads,
        per_thread=-(-mutations // (ctx.writers * ctx.threads)),
        rate=None,
        seconds=0,
        timeout=1800,
    )
    write_s = time.perf_counter() - t
    target = seqnos(client.high_seqnos(KEYSPACE))
    log(f"drain: {len(acks)} written in {write_s:.1f} s; restarting the driver")
    load = load1()
    driver = ctx.new_driver()
    t0 = driver.started
    t1 = wait_covered(client, ids, target, timeout=max(300.0, mutations / 200))
    ctx.batches.wait_end(target)
    recs = ctx.batches.since(t0)
    active = [(t, s) for t, s in recs if s.changes > 0]
    first_start = min(t - s.total for t, s in active) if active else t0
    changes = sum(s.changes for _, s in active)
    rows = [
        {
            "part": "2 drain",
            "mutations": len(acks),
            "changes": changes,
            "written/s": round(len(acks) / write_s),
            "drain s": round(t1 - t0, 2),
            "query start s": round(first_start - t0, 2),
            "mutations/s": round(len(acks) / (t1 - t0)),
            "from 1st batch s": round(t1 - first_start, 2),
            "mutations/s (batches)": round(len(acks) / (t1 - first_start)),
            "target/s": 25_000,
            "gap x": round(25_000 / (len(acks) / (t1 - first_start)), 1),
            "batches": len(active),
            "load_1m": load,
        }
    ]
    stats = [
        batch_row("2 drain", active),
        progress_row("2 drain (Spark)", spark_progress(driver, active)),
    ]
    from shardex.pipeline.rounds.between import BetweenStats

    kp = driver.keyspace()
    if kp is not None and kp.job.stabilise_ahead:
        # A new job: every round between its batches belongs to this drain.
        stats.append(between_row("2 drain (rounds between batches)", kp.job, BetweenStats()))
        pieces = pieces_row("2 drain (read-ahead pieces)", kp.job.read_ahead.piece_reads)
        if pieces is not None:
            stats.append(pieces)
    return rows, stats, driver


def pieces_row(part: str, reads: list[tuple[int, float]]) -> Row | None:
    """The read-ahead's last pieces (changes, seconds): how many, their size and read time."""
    if not reads:
        return None
    return {
        "part": part,
        "pieces": len(reads),
        "changes/piece p50": statistics.median(n for n, _ in reads),
        "read ms p50": round(statistics.median(s for _, s in reads) * 1e3, 1),
        "read us/change": round(
            sum(s for _, s in reads) / max(1, sum(n for n, _ in reads)) * 1e6, 1
        ),
    }


# --- part 3: freshness -----------------------------------------------------------------------


def freshness(
    ctx: Any, driver: InProcessDriver, rate: float, seconds: float
) -> tuple[list[Row], list[Row]]:
    client, ids = ctx.client, ctx.ids
    poller = Poller(ctx.procs, ctx.work, ctx.cluster_dir, ids, ctx.partitions)
    load = load1()
    kp = driver.keyspace()
    between = None if kp is None else copy.deepcopy(kp.job.between.stats)
    pieces_before = 0 if kp is None else kp.job.read_ahead.pieces
    try:
        t0 = time.time()
        acks = write_updates(
            ctx.procs,
            ctx.work,
            ctx.cluster_dir,
            tag="fresh",
            seed=ctx.seed + 23,
            total_docs=ctx.docs,
            writers=ctx.writers,
            threads=ctx.threads,
            per_thread=int(rate * seconds / (ctx.writers * ctx.threads) * 1.2) + 1,
            rate=rate,
            seconds=seconds,
            timeout=seconds + 600,
        )
        target = seqnos(client.high_seqnos(KEYSPACE))
        wait_covered(client, ids, target, timeout=600)
        ctx.batches.wait_end(target)
        time.sleep(0.1)
    finally:
        t, seq = poller.finish()
    lat = ack_to_stable(acks, t, seq)
    got = lat[~np.isnan(lat)]
    span = float(acks[:, 2].max() - acks[:, 2].min()) if len(acks) > 1 else float("nan")
    gaps = np.diff(t)
    recs = ctx.batches.since(t0)
    rows = [
        {
            "part": "3 freshness",
            "offered/s": rate,
            "achieved/s": round(len(acks) / span) if span > 0 else float("nan"),
            "writes": len(acks),
            "p50 ms": pct_ms(got.tolist(), 50),
            "p99 ms": pct_ms(got.tolist(), 99),
            "max ms": ms(float(got.max())) if len(got) else float("nan"),
            "target p50/p99 ms": "400 / 1500",
            "gap p50 x": round(pct_ms(got.tolist(), 50) / 400, 2),
            "gap p99 x": round(pct_ms(got.tolist(), 99) / 1500, 2),
            "poll ms p50": ms(float(np.median(gaps))) if len(gaps) else float("nan"),
            "unmatched": int(np.isnan(lat).sum()),
            "load_1m": load,
        }
    ]
    active = [(t, s) for t, s in recs if s.changes > 0]
    prog = spark_progress(driver, active)
    out = [batch_row("3 freshness", recs), progress_row("3 freshness (Spark)", prog)]
    if kp is not None and between is not None and kp.job.stabilise_ahead:
        out.append(between_row("3 freshness (rounds between batches)", kp.job, between))
        # the pieces read during this part (the list keeps the last 200)
        fresh = kp.job.read_ahead.pieces - pieces_before
        pieces = pieces_row(
            "3 freshness (read-ahead pieces)",
            kp.job.read_ahead.piece_reads[-fresh:] if fresh > 0 else [],
        )
        if pieces is not None:
            out.append(pieces)
    return rows, out


# --- part 4: the floor -----------------------------------------------------------------------


def floor(ctx: Any, driver: InProcessDriver, writes: int) -> tuple[list[Row], list[Row]]:
    client, ids = ctx.client, ctx.ids
    ks = client.keyspace(KEYSPACE)
    docs = list(updates(writes, ctx.docs, ctx.seed + 31))
    poller = Poller(ctx.procs, ctx.work, ctx.cluster_dir, ids, ctx.partitions)
    load = load1()
    acks: list[tuple[int, int, float]] = []
    t0 = time.time()
    try:
        time.sleep(1.0)
        for docid, body in docs:
            r = ks.upsert(docid, body)
            acked = time.time()
            acks.append((r.partition, r.seqno, acked))
            wait_covered(client, ids, {r.partition: r.seqno}, timeout=60, interval=0.005)
            ctx.batches.wait_end({r.partition: r.seqno})
            time.sleep(max(0.0, acked + 1.0 - time.time()))
    finally:
        t, seq = poller.finish()
    arr = np.array(acks, dtype=np.float64).reshape(-1, 3)
    lat = ack_to_stable(arr, t, seq)
    got = lat[~np.isnan(lat)].tolist()
    # The batch of each write: the first batch whose end covers it.
    recs = ctx.batches.since(t0)
    mine: list[tuple[float, Any]] = []
    for p, s, _ in acks:
        for rec in recs:
            if covers({q: e[0] for q, e in rec[1].end.items()}, {p: s}):
                if rec not in mine:
                    mine.append(rec)
                break
    totals = [s.total for _, s in mine]
    prog = spark_progress(driver, mine)
    rows = [
        {
            "part": "4 floor",
            "writes": len(acks),
            "ack->stable p50 ms": pct_ms(got, 50),
            "ack->stable p99 ms": pct_ms(got, 99),
            "ack->stable min ms": ms(min(got)) if got else float("nan"),
            "BatchStats.total p50 ms": pct_ms(totals, 50),
            "batches": len(mine),
            "load_1m": load,
        }
    ]
    return rows, [batch_row("4 floor", mine), progress_row("4 floor (Spark)", prog)]
