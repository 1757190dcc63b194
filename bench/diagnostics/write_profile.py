"""CPU per write on the data path: ``python -m bench.diagnostics.write_profile [options]``.

What one acknowledged write costs the node processes and the client, for the write shape of
``bench.pipeline.maintain``'s paced writers (``--shape bench``: writer processes whose threads
send ``upsert_many`` chunks of ``rate / (writers * threads) * 20 ms`` every 20 ms, so each call
is split over the 3 nodes) or single upserts (``--shape single``: every thread calls
``ks.upsert`` once per document, acknowledged one by one, paced the same way).

A fresh 3-node cluster (``shardex cluster start --no-pipeline``, as ``bench.data_service``
starts it) gets a 64-partition keyspace and ``--preload`` documents; then ``--rounds`` rounds
of ``--writes`` updates of those documents at ``--rate`` writes/s. Per round it reads, from
``/proc``, the CPU time of the three node processes (split into the event-loop thread and all
other threads: the data service's I/O pool, RocksDB's own threads) and each writer process
reports its own CPU time for its timed section; both divided by the writes acknowledged. The
nodes' idle CPU (heartbeats, reconciliation) is measured before the rounds and reported
beside (not subtracted).

``--baseline-src DIR`` runs a second cluster whose nodes *and* writers import ``shardex`` from
``DIR`` (e.g. ``git archive HEAD src | tar -x -C DIR``, then ``DIR/src``), and the two take
turns round by round (A/B interleaved, so a load spike from other work on this shared machine
hits both); the summary rows give the median of each and the ratio current / baseline.
``--replicas N`` and ``--durability LEVEL`` set the keyspace's replica count and every
write's durability (e.g. ``--replicas 1 --durability majority --shape single --writers 16
--threads 1 --rate 1000000``: 16 unpaced clients at majority, ``bench.replication``'s goal
case). ``--chunk N`` keeps the bench shape's pacing but sends calls of exactly N documents: the
bench's own calls grow when round trips are slow, so a faster variant makes more, smaller
calls and its per-write client cost is not comparable (``writes/call`` shows it).
``--instructions`` adds user-space instructions per write from ``perf stat --per-thread``
(nodes, their event-loop threads, the writers): unlike CPU time, a loaded machine barely moves
them. ``--profile-nodes OUT`` writes a cProfile of every current-code node's event-loop thread
over one extra round (``bench/diagnostics/node_profile.py``; cProfile measures wall time, so
read call
counts and relative shares) and prints the top functions; ``--profile-client OUT`` does the
same for the writers (every thread). Results: ``bench/results/write_profile.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.local_cluster import shardex_cluster
from bench.common.runner import Row, load_average, percentile, report
from bench.diagnostics.node_profile import node_profiling, start_profiles, stop_profiles
from bench.diagnostics.scan_profile import node_pids

KEYSPACE = "people"
PARTITIONS = 64
TICK = 0.02  # as bench.pipeline.maintain: a paced thread sends what is due every TICK
MAX_CHUNK = 1000
SEED = 20240601


def log(msg: str) -> None:
    print(f"[write_profile] {msg}", file=sys.stderr, flush=True)


# --- CPU from /proc ------------------------------------------------------------------------


def _stat(stat_path: Path) -> tuple[str, int, int]:
    """(comm, utime, stime) in clock ticks from a /proc stat file."""
    text = stat_path.read_text()
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    return comm, int(fields[11]), int(fields[12])


# Thread buckets: the event loop (the main thread, task id = pid), RocksDB's own background
# threads (they name themselves ``rocksdb:...``) and every other thread (the data service's
# I/O pool and any other Python thread).
BUCKETS = ("loop", "rocksdb", "pool")


def node_cpu(pids: Sequence[int]) -> dict[str, float]:
    """CPU seconds of ``pids`` per bucket (user + system), plus ``sys``: the system part of
    all of them. Threads that ended are counted in ``pool`` (from the process total)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = dict.fromkeys((*BUCKETS, "sys"), 0)
    for pid in pids:
        with contextlib.suppress(OSError):
            seen = 0
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    comm, ut, st = _stat(task / "stat")
                    if int(task.name) == pid:
                        bucket = "loop"
                    elif comm.startswith("rocksdb"):
                        bucket = "rocksdb"
                    else:
                        bucket = "pool"
                    out[bucket] += ut + st
                    out["sys"] += st
                    seen += ut + st
            _, ut, st = _stat(Path(f"/proc/{pid}/stat"))
            out["pool"] += max(ut + st - seen, 0)
    return {k: v / tick for k, v in out.items()}


def perf_start(pids: Sequence[int]) -> subprocess.Popen[str] | None:
    """``perf stat`` counting user-space instructions per thread of ``pids`` until stopped:
    a measure of work that a loaded machine does not inflate (CPU time does: cache misses,
    GIL hand-offs); None when perf is not there."""
    if shutil.which("perf") is None:
        return None
    cmd = ["perf", "stat", "-e", "instructions:u", "-x", ",", "--per-thread"]
    cmd += ["-p", ",".join(map(str, pids))]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def perf_stop(proc: subprocess.Popen[str] | None) -> dict[int, int]:
    """Instructions per thread id counted by ``perf_start``'s process."""
    if proc is None:
        return {}
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    out: dict[int, int] = {}
    for line in err.splitlines():
        parts = line.split(",")
        if len(parts) > 3 and parts[3].startswith("instructions") and parts[1].isdigit():
            out[int(parts[0].rsplit("-", 1)[1])] = int(parts[1])
    return out


def threads_of(pids: Sequence[int]) -> dict[int, int]:
    """Thread id -> process id for every thread of ``pids`` now."""
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                out[int(task.name)] = pid
    return out


# --- the writer subprocess ------------------------------------------------------------------


def writer_main(spec: dict[str, Any]) -> None:
    """Connect, make the documents, say ``ready``, wait for ``go <t>`` on stdin, write from
    ``threads`` threads until done, print one JSON line of results. CPU and latencies cover
    the timed section only."""
    from bench.common.dataset import updates
    from shardex.client import connect_local

    client = connect_local(spec["cluster_dir"], name="bench-write-profile")
    ks = client.keyspace(KEYSPACE)
    threads, per_thread = spec["threads"], spec["per_thread"]
    docs = list(updates(threads * per_thread, spec["total_docs"], spec["seed"]))
    ks.partition_of(docs[0][0])  # the topology, before the clock starts
    # A warm-up call per thread's worth of connections (pool connects to every node).
    ks.upsert_many(docs[:30], chunk_size=30)
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    begin = float(line[1])
    rate = spec["rate_per_thread"]
    profiles: list[Any] = []
    if spec.get("profile_client"):  # one cProfile per thread: the callers and the loop's
        import cProfile

        def profile_here() -> None:
            prof = cProfile.Profile()
            profiles.append(prof)
            prof.enable()

        loop_prof = cProfile.Profile()
        profiles.append(loop_prof)
        client.rpc.loop.call_soon_threadsafe(loop_prof.enable)
    calls: list[list[float]] = [[] for _ in range(threads)]
    done = [0] * threads
    errors: list[str] = []

    def run(k: int) -> None:
        mine = docs[k * per_thread : (k + 1) * per_thread]
        per_tick = max(1, round(rate * TICK))
        sent = 0
        if profiles:
            profile_here()
        try:
            while time.time() < begin:
                time.sleep(0.001)
            while sent < len(mine):
                due = int(rate * (time.time() - begin))
                if spec["shape"] == "single":
                    n = 1
                    t0 = time.perf_counter()
                    docid, body = mine[sent]
                    ks.upsert(docid, body, durability=spec["durability"])
                else:
                    if spec["chunk"]:  # fixed-size calls: the same work per call in A and B
                        n = min(spec["chunk"], len(mine) - sent)
                    else:
                        n = min(max(due - sent, per_tick), MAX_CHUNK, len(mine) - sent)
                    t0 = time.perf_counter()
                    ks.upsert_many(
                        mine[sent : sent + n], chunk_size=n, durability=spec["durability"]
                    )
                calls[k].append(time.perf_counter() - t0)
                sent += n
                done[k] = sent
                delay = begin + sent / rate - time.time()
                if delay > 0:
                    time.sleep(delay)
        except BaseException as exc:  # reported, not hidden
            errors.append(repr(exc))

    while time.time() < begin:
        time.sleep(0.001)
    c0, t0 = os.times(), time.monotonic()
    ths = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    c1, t1 = os.times(), time.monotonic()
    if profiles:
        client.rpc.loop.call_soon_threadsafe(loop_prof.disable)
        for prof in profiles[1:]:
            prof.disable()  # ended threads: disabling from here only stops the bookkeeping
        time.sleep(0.2)
        # Only profiles that saw a call: pstats refuses an empty one (the loop's, when every
        # call went from the calling thread, ``client/direct_kv.py``).
        seen = []
        for prof in profiles:
            prof.create_stats()
            if prof.stats:  # type: ignore[attr-defined]
                seen.append(prof)
        stats = pstats.Stats(seen[0])
        for prof in seen[1:]:
            stats.add(prof)
        stats.dump_stats(str(Path(spec["profile_client"]) / f"client-{os.getpid()}.prof"))
    lat = sorted(x for c in calls for x in c)
    out = {
        "writes": sum(done),
        "calls": len(lat),
        "cpu": (c1.user - c0.user) + (c1.system - c0.system),
        "wall": t1 - t0,
        "p50": percentile(lat, 50),
        "p99": percentile(lat, 99),
        "errors": errors[:3],
    }
    print(json.dumps(out), flush=True)
    # Exit only when told: the parent stops counting instructions first, so the client's
    # close and this interpreter's teardown are not charged to the writes.
    sys.stdin.readline()
    client.close()


# --- the driver -----------------------------------------------------------------------------


@dataclass
class Variant:
    name: str
    src: Path | None  # PYTHONPATH for its nodes and writers (None: this checkout)
    cluster_dir: Path | None = None
    pids: list[int] | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)  # for ``bench`` itself
        paths = [str(self.src)] if self.src is not None else []
        env["PYTHONPATH"] = os.pathsep.join([*paths, root, env.get("PYTHONPATH", "")]).strip(
            os.pathsep
        )
        return env


@contextlib.contextmanager
def variant_cluster(v: Variant, base: Path) -> Iterator[None]:
    """The variant's 3-node cluster. Its ``PYTHONPATH`` is set only while ``cluster start``
    spawns the nodes (they inherit it), never while other variants start their processes."""
    with contextlib.ExitStack() as stack:
        saved = os.environ.get("PYTHONPATH")
        if v.src is not None:
            os.environ["PYTHONPATH"] = v.env()["PYTHONPATH"]
        try:
            cdir = stack.enter_context(shardex_cluster(base, 3))
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
        v.cluster_dir = cdir
        v.pids = node_pids(cdir)
        if len(v.pids) != 3:
            raise RuntimeError(f"expected 3 node processes for {cdir}, found {v.pids}")
        yield


def preload(v: Variant, docs: int, replicas: int = 0) -> None:
    """The keyspace (``replicas`` replicas) and ``docs`` documents (``user-<k>``), untimed,
    from this process."""
    from bench.common.dataset import updates
    from shardex.client import connect_local

    assert v.cluster_dir is not None
    with connect_local(v.cluster_dir, name="bench-write-profile-load") as client:
        client.create_keyspace(KEYSPACE, num_partitions=PARTITIONS, num_replicas=replicas)
        ks = client.keyspace(KEYSPACE)
        items = [(f"user-{k:07d}", body) for k, (_, body) in enumerate(updates(docs, docs, 1))]
        ks.upsert_many(items, chunk_size=1000)


def run_round(
    v: Variant, a: argparse.Namespace, seed: int, profile_client: str | None = None
) -> Row:
    assert v.cluster_dir is not None and v.pids is not None
    n_threads = a.writers * a.threads
    per_thread = -(-a.writes // n_threads)
    spec = {
        "cluster_dir": str(v.cluster_dir),
        "threads": a.threads,
        "per_thread": per_thread,
        "rate_per_thread": a.rate / n_threads,
        "total_docs": a.preload,
        "shape": a.shape,
        "chunk": a.chunk,
        "durability": a.durability,
        "profile_client": profile_client,
    }
    procs = []
    for w in range(a.writers):
        cmd = [
            sys.executable,
            "-m",
            "bench.diagnostics.write_profile",
            "--writer",
            json.dumps(spec | {"seed": seed + w}),
        ]
        procs.append(
            subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=v.env()
            )
        )
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"writer failed to start (exit {p.wait()})")
        writer_pids = [p.pid for p in procs]
        perf = perf_start([*v.pids, *writer_pids]) if a.instructions else None
        begin = time.time() + 0.3
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"go {begin}\n")
            p.stdin.flush()
        while time.time() < begin:
            time.sleep(0.001)
        cpu0 = node_cpu(v.pids)
        t0 = time.monotonic()
        outs = []
        for p in procs:
            assert p.stdout is not None
            outs.append(json.loads(p.stdout.readline()))
        wall = time.monotonic() - t0
        cpu1 = node_cpu(v.pids)
        node_tids = threads_of(v.pids)  # node threads live on; the writers' may have ended
        instr = perf_stop(perf)
    finally:
        for p in procs:  # "exit" (or EOF after an error) lets each writer close and end
            with contextlib.suppress(Exception):
                assert p.stdin is not None
                p.stdin.write("exit\n")
                p.stdin.close()
        for p in procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=30)
    writes = sum(o["writes"] for o in outs)
    errors = [e for o in outs for e in o["errors"]]
    if errors:
        raise RuntimeError(f"writer errors: {errors[:3]}")
    us = 1e6 / max(writes, 1)
    extra: Row = {}
    if instr:
        loop = sum(n for t, n in instr.items() if t in v.pids)
        node = sum(n for t, n in instr.items() if t in node_tids)
        client = sum(n for t, n in instr.items() if t not in node_tids)
        extra = {
            "node kinstr/write": round(node / max(writes, 1) / 1e3, 1),
            "loop kinstr": round(loop / max(writes, 1) / 1e3, 1),
            "client kinstr/write": round(client / max(writes, 1) / 1e3, 1),
        }
    return {
        "case": v.name,
        "writes": writes,
        "writes/s": round(writes / wall),
        "writes/call": round(writes / max(sum(o["calls"] for o in outs), 1), 1),
        "node us/write": round(sum(cpu1[b] - cpu0[b] for b in BUCKETS) * us, 1),
        **{f"{b} us": round((cpu1[b] - cpu0[b]) * us, 1) for b in BUCKETS},
        "node sys us": round((cpu1["sys"] - cpu0["sys"]) * us, 1),
        "client us/write": round(sum(o["cpu"] for o in outs) * us, 1),
        "call p50 ms": round(statistics.median(o["p50"] for o in outs) * 1e3, 2),
        "call p99 ms": round(max(o["p99"] for o in outs) * 1e3, 2),
        **extra,
        "load1": (load_average() or [None])[0],
    }


def idle_rate(v: Variant, seconds: float = 3.0) -> float:
    assert v.pids is not None
    c0 = node_cpu(v.pids)
    time.sleep(seconds)
    c1 = node_cpu(v.pids)
    return sum(c1[b] - c0[b] for b in BUCKETS) / seconds


def summary(rows: list[Row], names: Sequence[str]) -> list[Row]:
    out: list[Row] = []
    keys = ("node us/write", *(f"{b} us" for b in BUCKETS), "node sys us", "client us/write")
    keys += ("call p50 ms",)
    if all("node kinstr/write" in r for r in rows):
        keys += ("node kinstr/write", "loop kinstr", "client kinstr/write")
    med: dict[str, dict[str, float]] = {}
    for n in names:
        mine = [r for r in rows if r["case"] == n]
        med[n] = {k: statistics.median(r[k] for r in mine) for k in keys}
        out.append({"case": f"{n} median", "writes": sum(r["writes"] for r in mine), **med[n]})
    if len(names) == 2:
        a, b = names
        out.append(
            {
                "case": f"{a} / {b}",
                **{k: round(med[a][k] / med[b][k], 3) if med[b][k] else None for k in keys},
            }
        )
    return out


def print_profile(files: Sequence[Path], top: int) -> None:
    stats = pstats.Stats(*(str(f) for f in files))
    stats.sort_stats("tottime").print_stats(top)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.diagnostics.write_profile", description=__doc__
    )
    ap.add_argument("--writer", help=argparse.SUPPRESS)
    ap.add_argument("--shape", choices=("bench", "single"), default="bench")
    ap.add_argument(
        "--chunk",
        type=int,
        default=0,
        help="bench shape with calls of exactly this many documents (0: as the bench paces them,"
        " whose call sizes grow when round trips are slow, so A and B would do different work)",
    )
    ap.add_argument("--writes", type=int, default=20_000, help="writes per round and variant")
    ap.add_argument("--rate", type=float, default=5000.0, help="offered writes/s in total")
    ap.add_argument("--writers", type=int, default=2, help="writer processes")
    ap.add_argument("--threads", type=int, default=2, help="threads per writer process")
    ap.add_argument("--preload", type=int, default=20_000, help="documents written first")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=0, help="the keyspace's num_replicas")
    ap.add_argument("--durability", default="persist", help="of every write (e.g. majority)")
    ap.add_argument("--baseline-src", type=Path, help="a shardex src dir to compare against")
    ap.add_argument("--profile-nodes", type=Path, help="cProfile the nodes into this dir")
    ap.add_argument(
        "--instructions", action="store_true", help="also count instructions (perf stat)"
    )
    ap.add_argument("--profile-client", type=Path, help="cProfile the writers into this dir")
    ap.add_argument("--top", type=int, default=40, help="functions shown per profile")
    a = ap.parse_args(argv)
    if a.writer is not None:
        writer_main(json.loads(a.writer))
        return
    variants = [Variant("current", None)]
    if a.baseline_src is not None:
        variants.append(Variant("baseline", a.baseline_src.resolve()))
    start = time.perf_counter()
    rows: list[Row] = []
    idle: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="shardex-write-profile-", dir="/tmp") as tmp:
        base = Path(tmp)
        with contextlib.ExitStack() as stack:
            if a.profile_nodes is not None:
                stack.enter_context(node_profiling(a.profile_nodes))
            for v in variants:  # the baseline's nodes get the (unused) hook too: harmless
                stack.enter_context(variant_cluster(v, base))
            for v in variants:
                preload(v, a.preload, a.replicas)
                idle[v.name] = round(idle_rate(v), 3)
                log(f"{v.name}: preloaded {a.preload}, idle node CPU {idle[v.name]} cores")
            for r in range(a.rounds):
                for v in variants if r % 2 == 0 else variants[::-1]:
                    row = run_round(v, a, SEED + 10 * r)
                    log(str(row))
                    rows.append({"round": r, **row})
            if a.profile_nodes is not None:
                v = variants[0]
                assert v.pids is not None
                start_profiles(v.pids)
                run_round(v, a, SEED + 999)
                files = stop_profiles(v.pids, a.profile_nodes)
                log(f"node profiles: {[str(f) for f in files]}")
                print_profile(files, a.top)
            if a.profile_client is not None:
                a.profile_client.mkdir(parents=True, exist_ok=True)
                for f in a.profile_client.glob("client-*.prof"):
                    f.unlink()
                run_round(variants[0], a, SEED + 998, str(a.profile_client.resolve()))
                print_profile(sorted(a.profile_client.glob("client-*.prof")), a.top)
    names = [v.name for v in variants]
    rows.extend(summary(rows, names))
    report(
        "write_profile",
        rows,
        elapsed=time.perf_counter() - start,
        extra={"args": {k: str(v) for k, v in vars(a).items()}, "idle_node_cores": idle},
        title=f"CPU per write ({a.shape}, {a.rate:.0f}/s offered)",
    )


if __name__ == "__main__":
    main()
