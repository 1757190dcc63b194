"""Cost of one request/reply through ``shardex.net``: ``python -m bench.diagnostics.net_roundtrip``.

A minimal server on the real net stack (``RpcServer`` over ``TcpTransport``, on the loop
nodes run: ``net/loops.py``) in its own process, and client processes on loopback, each
with a ``ConnectionPool`` on the sync client's loop thread (``client/client.py``'s
``LoopThread``), as the SDK has. Per request it reports the client's process CPU, the
server's CPU (``/proc/<pid>/task/*/schedstat``, nanoseconds), latency p50 and p90, and with
``--perf`` / ``--strace`` the instructions (``perf stat -e instructions``) and syscalls
(``strace -c -f``) of the server and of one client, per request.

Configurations: ``ping`` (the ``Ping`` every connection answers) and ``rpc`` (a routed
request with a 100-byte reply), each sent ``sync`` (one ``LoopThread.run`` hand-off per
request), ``async`` (sequential awaits on the loop thread, a node's path) or ``blocking``
(a ``BlockingConn`` in the calling thread, the path of the SDK's gets, writes and scans),
from 1 client and from 4 concurrent client processes.

``--callgrind`` counts instructions instead (valgrind's callgrind: the same count on every
run, for machines without hardware counters, where CPU time moves with other work): per
configuration, one client's ``--requests`` requests, with the server and that client
instrumented only while they run; no timings.

``--tls on`` runs every connection over TLS 1.3 (certificates made by ``net/certs.py`` in a
temporary directory; the server verifies nothing of the client, as for a user's client).
``--tls ab`` compares TLS with plaintext on the same code: side A plaintext, side B TLS
(no ``--before-src``): read the B/A ratios as the cost of TLS.

``--before-src DIR`` (a copy of ``src/`` before a change) runs side A's server and clients
on that code and side B's on this tree, the two taking turns round by round (ABBA), so a
load spike from other work lands on both alike: read the B/A ratios. Results go to
``bench/results/net_roundtrip.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.runner import load_average, percentile

SECRET = "net-bench-secret"
RESULTS = Path(__file__).parent / "results" / "net_roundtrip.json"
MODES = ("sync", "async", "blocking")
MSGS = ("ping", "rpc")
TLS_CHOICES = ("off", "on", "ab")


def _messages() -> tuple[type, type]:
    """The routed request and its reply (defined on first use: importing shardex here would
    pin the orchestrator's own tree, which never sends anything)."""
    from shardex.net import Message

    class NetBenchGet(Message):
        key: str

    class NetBenchValue(Message):
        key: str
        value: bytes

    return NetBenchGet, NetBenchValue


# --- server process ------------------------------------------------------------------------


def _tls(cert_dir: str | None, node: bool) -> Any:
    """The ``TlsConfig`` of a process of the bench (None in clear): the server's is a node's,
    a client's has the CA only."""
    if not cert_dir:
        return None
    from shardex.net.tls import TlsConfig

    if node:
        return TlsConfig.for_node(Path(cert_dir), "server")
    return TlsConfig(ca=TlsConfig.for_node(Path(cert_dir), "server").ca)


def serve(cert_dir: str | None) -> None:
    from shardex.net import RpcServer, TcpTransport
    from shardex.net.loops import new_event_loop

    get_cls, value_cls = _messages()
    value = b"v" * 100

    async def main() -> None:
        transport = TcpTransport(tls=_tls(cert_dir, node=True))
        server = RpcServer(transport, SECRET, name="net-bench-server")

        async def on_get(msg: Any, conn: Any) -> Any:
            return value_cls(key=msg.key, value=value)

        server.route(get_cls, on_get)
        print(await server.start("127.0.0.1:0"), flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.readline)  # until the parent closes it
        await server.stop()

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main())


# --- client process ------------------------------------------------------------------------


def client(address: str, cert_dir: str | None) -> None:
    """Reads ``run N MODE MSG`` lines; answers each with one JSON line (latencies, CPU)."""
    from shardex.client.loop_thread import LoopThread
    from shardex.net import ConnectionPool, Kind, Ping, Pong, TcpTransport
    from shardex.net.blocking import BlockingConn

    get_cls, value_cls = _messages()
    tls = _tls(cert_dir, node=False)
    io = LoopThread("net-bench-client")
    pool = io.run(_make_pool(ConnectionPool, lambda: TcpTransport(tls=tls)))
    msgs = {"ping": Ping(), "rpc": get_cls(key="k")}
    replies = {"ping": Pong, "rpc": value_cls}
    transport = TcpTransport(tls=tls)
    conn = BlockingConn.open(
        address,
        SECRET,
        name="net-bench-client",
        timeout=10.0,
        max_frame=transport.max_frame,
        nonce=transport.nonce,
        tls=tls,
    )

    def blocking(n: int, msg: Any, expect: type) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            rid = conn.new_request_id()
            conn.send(msg, rid, Kind.REQUEST)
            conn.reply(rid, msg, 10.0, expect)
            out.append(time.perf_counter() - t)
        return out

    async def many(n: int, msg: Any) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await pool.request(address, msg, 10.0)
            out.append(time.perf_counter() - t)
        return out

    print("ready", flush=True)
    for line in sys.stdin:
        _, n_s, mode, name = line.split()
        n, msg = int(n_s), msgs[name]
        cpu0 = time.process_time()
        if mode == "async":
            lat = io.run(many(n, msg))
        elif mode == "blocking":
            lat = blocking(n, msg, replies[name])
        else:
            lat = []
            for _ in range(n):
                t = time.perf_counter()
                io.run(pool.request(address, msg, 10.0))
                lat.append(time.perf_counter() - t)
        cpu = time.process_time() - cpu0
        print(json.dumps({"lat": lat, "cpu": cpu}), flush=True)
    conn.close()
    io.run(pool.close())
    io.stop()


async def _make_pool(pool_cls: Any, transport: Any) -> Any:
    return pool_cls(transport(), SECRET, name="net-bench-client")


# --- orchestration -------------------------------------------------------------------------


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` in ns (schedstat: finer than /proc/stat's ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended
            total += int((task / "schedstat").read_text().split()[0])
    return total


class Side:
    """One code version: a server process and its client processes."""

    def __init__(
        self,
        name: str,
        src: Path | None,
        clients: int,
        cert_dir: Path | None,
        wrap: Sequence[str] = (),
    ) -> None:
        """``wrap``: a command the server and the first client run under (valgrind)."""
        self.name = name
        env = dict(os.environ)
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(src.resolve()), env.get("PYTHONPATH", "")) if p
            )
        cmd = [sys.executable, "-m", "bench.diagnostics.net_roundtrip"]
        if cert_dir is not None:
            cmd += ["--cert-dir", str(cert_dir)]
        self.server = subprocess.Popen(
            [*wrap, *cmd, "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.server.stdout is not None
        self.address = self.server.stdout.readline().strip()
        if not self.address:
            raise RuntimeError(f"side {name}: the server did not start")
        self.clients = [
            subprocess.Popen(
                [*(wrap if i == 0 else ()), *cmd, "client", "--address", self.address],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for i in range(clients)
        ]
        for c in self.clients:
            assert c.stdout is not None
            if c.stdout.readline().strip() != "ready":
                raise RuntimeError(f"side {name}: a client did not start")

    def run(self, n: int, mode: str, msg: str, clients: int) -> tuple[list[float], float, float]:
        """``n`` requests from each of ``clients`` clients at once: latencies, client CPU
        seconds (summed), server CPU seconds."""
        procs = self.clients[:clients]
        before = _cpu_ns(self.server.pid)
        for c in procs:
            assert c.stdin is not None
            c.stdin.write(f"run {n} {mode} {msg}\n")
            c.stdin.flush()
        lat: list[float] = []
        cpu = 0.0
        for c in procs:
            assert c.stdout is not None
            out = json.loads(c.stdout.readline())
            lat.extend(out["lat"])
            cpu += out["cpu"]
        return lat, cpu, (_cpu_ns(self.server.pid) - before) / 1e9

    def stop(self) -> None:
        for p in [*self.clients, self.server]:
            if p.stdin is not None:
                p.stdin.close()
        for p in [*self.clients, self.server]:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def _attach(tool: list[str], pid: int, out: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([*tool, "-o", str(out), "-p", str(pid)], stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # attaching takes a moment; what it misses is idle time anyway
    return proc


def _detach(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(10)


def _perf_instructions(path: Path) -> float:
    for line in path.read_text().splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2].startswith("instructions") and parts[0].isdigit():
            return float(parts[0])
    return float("nan")


def _strace_calls(path: Path) -> dict[str, int]:
    calls: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        # "% time  seconds  usecs/call  calls  [errors]  syscall"
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            calls[parts[-1]] = int(parts[3])
    return calls


def traced(side: Side, n: int, mode: str, msg: str, tool: str, tmp: Path) -> dict[str, Any]:
    """Instructions or syscalls per request of the server and of one client (one client)."""
    targets = {"server": side.server.pid, "client": side.clients[0].pid}
    cmd = (
        ["perf", "stat", "-x", ",", "-e", "instructions"]
        if tool == "perf"
        else ["strace", "-c", "-f", "-q"]
    )
    procs = {k: _attach(cmd, pid, tmp / f"{side.name}-{k}.{tool}") for k, pid in targets.items()}
    side.run(n, mode, msg, 1)
    for p in procs.values():
        _detach(p)
    out: dict[str, Any] = {}
    for k in targets:
        path = tmp / f"{side.name}-{k}.{tool}"
        if tool == "perf":
            out[k] = _perf_instructions(path) / n
        else:
            calls = _strace_calls(path)
            out[k] = {
                "total": sum(calls.values()) / n,
                **{s: c / n for s, c in sorted(calls.items(), key=lambda kv: -kv[1]) if c >= n / 4},
            }
    return out


def _callgrind_wrap(out: Path) -> list[str]:
    """Run under callgrind, instrumenting nothing until ``callgrind_control -i on``."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--callgrind needs valgrind (and callgrind_control) on the PATH")
    return [
        "valgrind",
        "-q",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}/cg.%p",
    ]


def _callgrind_total(out: Path, pid: int) -> int:
    """Instructions ``pid`` ran while instrumented: the totals of its dumps."""
    total = 0
    for path in out.glob(f"cg.{pid}*"):
        for line in path.read_text().splitlines():
            if line.startswith("totals:"):
                total += int(line.split()[1])
    return total


def counted(side: Side, n: int, mode: str, msg: str, out: Path) -> dict[str, float]:
    """Instructions per request of the server and of the first client, over ``n`` requests
    of that client (a side made with ``_callgrind_wrap``)."""
    pids = {"server": side.server.pid, "client": side.clients[0].pid}

    def control(*flags: str) -> None:
        for pid in pids.values():
            subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True)

    control("--zero")  # what earlier runs counted
    control("-i", "on")
    side.run(n, mode, msg, 1)
    control("-i", "off")
    before = {k: _callgrind_total(out, pid) for k, pid in pids.items()}
    control("--dump")
    return {k: (_callgrind_total(out, pid) - before[k]) / n for k, pid in pids.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.diagnostics.net_roundtrip", description=__doc__
    )
    ap.add_argument("command", nargs="?", default="bench", choices=["bench", "serve", "client"])
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--cert-dir", help=argparse.SUPPRESS)
    ap.add_argument(
        "--tls",
        choices=TLS_CHOICES,
        default="off",
        help="on: every connection over TLS; ab: side A plaintext, side B TLS, same code",
    )
    ap.add_argument("--before-src", type=Path, help="side A's code: a copy of src/")
    ap.add_argument("--requests", type=int, default=1000, help="per client per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--mode", action="append", choices=MODES)
    ap.add_argument("--msg", action="append", choices=MSGS)
    ap.add_argument("--clients", type=int, action="append", help="default: 1 and 4")
    ap.add_argument("--perf", action="store_true", help="instructions per request (perf stat)")
    ap.add_argument("--strace", action="store_true", help="syscalls per request (strace -c)")
    ap.add_argument(
        "--callgrind",
        action="store_true",
        help="instructions per request (valgrind's callgrind), no timings",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    args.argv = argv
    if args.command == "serve":
        serve(args.cert_dir)
        return 0
    if args.command == "client":
        client(args.address, args.cert_dir)
        return 0
    if args.tls == "ab" and args.before_src is not None:
        ap.error("--tls ab compares TLS with plaintext on this tree: no --before-src with it")
    return bench(args)


def bench(args: argparse.Namespace) -> int:
    modes, msgs = args.mode or list(MODES), args.msg or list(MSGS)
    client_counts = sorted(set(args.clients or [1, 4]))
    configs = [(m, g, c) for c in client_counts for m in modes for g in msgs]
    names = ["A", "B"] if args.before_src or args.tls == "ab" else ["B"]
    srcs = {"A": args.before_src, "B": None}
    load0 = load_average()
    certs = Path(tempfile.mkdtemp(prefix="net_roundtrip-certs-"))
    if args.tls != "off":
        from shardex.net.certs import make_cluster_certs

        make_cluster_certs(certs, {"server": ["127.0.0.1"]})
    tls_of = {
        s: certs if args.tls == "on" or (args.tls == "ab" and s == "B") else None for s in names
    }
    if args.callgrind:
        return _count(args, modes, msgs, names, srcs, tls_of, certs, load0)
    sides = {s: Side(s, srcs[s], max(client_counts), tls_of[s]) for s in names}
    results: list[dict[str, Any]] = []
    try:
        for s in sides.values():  # warm-up: connections, decoders, caches
            for m, g, _ in configs:
                s.run(200, m, g, max(client_counts))
        for mode, msg, clients in configs:
            acc = {s: {"lat": [], "client": 0.0, "server": 0.0, "n": 0} for s in names}
            for r in range(args.rounds):
                order = names if r % 2 == 0 else names[::-1]
                for s in order:
                    lat, ccpu, scpu = sides[s].run(args.requests, mode, msg, clients)
                    a = acc[s]
                    a["lat"].extend(lat)
                    a["client"] += ccpu
                    a["server"] += scpu
                    a["n"] += len(lat)
            row: dict[str, Any] = {"mode": mode, "msg": msg, "clients": clients}
            for s in names:
                a = acc[s]
                lat = sorted(a["lat"])
                row[s] = {
                    "p50_us": percentile(lat, 50) * 1e6,
                    "p90_us": percentile(lat, 90) * 1e6,
                    "mean_us": statistics.fmean(lat) * 1e6,
                    "client_cpu_us": a["client"] / a["n"] * 1e6,
                    "server_cpu_us": a["server"] / a["n"] * 1e6,
                    "requests": a["n"],
                }
            for tool in [t for t in ("perf", "strace") if getattr(args, t)]:
                if clients != 1:
                    continue
                tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"net_roundtrip.{os.getpid()}"
                tmp.mkdir(exist_ok=True)
                for s in names:
                    key = "instructions" if tool == "perf" else "syscalls"
                    row[s][key] = traced(sides[s], args.requests, mode, msg, tool, tmp)
            results.append(row)
            _print_row(row, names)
    finally:
        for s in sides.values():
            s.stop()
        shutil.rmtree(certs, ignore_errors=True)
    _write(args, names, tls_of, load0, results)
    return 0


def _count(
    args: argparse.Namespace,
    modes: Sequence[str],
    msgs: Sequence[str],
    names: Sequence[str],
    srcs: dict[str, Path | None],
    tls_of: dict[str, Path | None],
    certs: Path,
    load0: Any,
) -> int:
    """``--callgrind``: instructions per request, per configuration and side."""
    out = Path(tempfile.mkdtemp(prefix="net_roundtrip-callgrind-"))
    sides = {s: Side(s, srcs[s], 1, tls_of[s], _callgrind_wrap(out)) for s in names}
    results: list[dict[str, Any]] = []
    try:
        for mode in modes:
            for msg in msgs:
                row: dict[str, Any] = {"mode": mode, "msg": msg, "clients": 1}
                for s in names:
                    sides[s].run(200, mode, msg, 1)  # warm-up, not instrumented
                    row[s] = {"instructions": counted(sides[s], args.requests, mode, msg, out)}
                    i = row[s]["instructions"]
                    print(
                        f"{mode:8} {msg:4} {s}: instructions per request: server "
                        f"{i['server']:,.0f}, client {i['client']:,.0f}",
                        flush=True,
                    )
                results.append(row)
    finally:
        for side in sides.values():
            side.stop()
        shutil.rmtree(certs, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    _write(args, names, tls_of, load0, results)
    return 0


def _write(
    args: argparse.Namespace,
    names: Sequence[str],
    tls_of: dict[str, Path | None],
    load0: Any,
    results: list[dict[str, Any]],
) -> None:
    """The run's JSON (command, sides, load before and after, rows) to ``args.out``."""
    doc = {
        "bench": "net_roundtrip",
        "command": " ".join(["python -m bench.diagnostics.net_roundtrip", *args.argv]),
        "sides": {s: ("TLS" if tls_of[s] else "plain") for s in names},
        "load_before": load0,
        "load_after": load_average(),
        "rows": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"load {load0} -> {doc['load_after']}; written to {args.out}")


def _print_row(row: dict[str, Any], names: Sequence[str]) -> None:
    head = f"{row['mode']:5} {row['msg']:4} x{row['clients']}"
    for s in names:
        r = row[s]
        extra = ""
        if "instructions" in r:
            i = r["instructions"]
            extra += f" instr/req srv {i['server'] / 1e3:.0f}k cli {i['client'] / 1e3:.0f}k"
        if "syscalls" in r:
            sc = r["syscalls"]
            extra += (
                f" syscalls/req srv {sc['server']['total']:.1f} cli {sc['client']['total']:.1f}"
            )
        print(
            f"{head} {s}: p50 {r['p50_us']:7.1f} p90 {r['p90_us']:7.1f} us  "
            f"cpu/req client {r['client_cpu_us']:6.1f} server {r['server_cpu_us']:6.1f} us{extra}"
        )
    if len(names) == 2:
        a, b = row["A"], row["B"]
        print(
            f"{head} B/A: p50 {b['p50_us'] / a['p50_us']:.2f}  client cpu "
            f"{b['client_cpu_us'] / a['client_cpu_us']:.2f}  server cpu "
            f"{b['server_cpu_us'] / a['server_cpu_us']:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
