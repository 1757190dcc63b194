"""Demo step: kill -9 a data node under majority-durable writers; automatic failover promotes
its replicas, writes and request_plus reads go on, the node comes back, is recovered and
rebalanced in, and every acknowledged write is there.

Writers upsert their own documents at durability ``majority`` (each acknowledged only once a
replica copy holds it) and record every acknowledgement; the node holding the most active
copies of ``users`` (the founding node aside) is killed with SIGKILL. The step prints how long
the failover took, the writes acknowledged during the outage, a request_plus read by key of
acknowledged writes during it, then restarts the node (``shardex cluster start``), recovers
it (delta), rebalances, and reads every acknowledged write back.

    python -m shardex.demo.failover DIR [--seconds 4]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Final

from shardex.client import Client, connect_local
from shardex.errors import ErrorCode, ShardexError
from shardex.runtime.pidfile import pid_alive, read_pid

KEYSPACE: Final = "users"
WRITERS: Final = 3
WAIT: Final = 120.0  # seconds for each phase on a loaded 2-core machine


class Writers:
    """Threads upserting ``failover-<t>-<i>`` at durability majority, counting outcomes."""

    def __init__(self, client: Client) -> None:
        self.users = client.keyspace(KEYSPACE)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[str, int] = {}
        self.errors: Counter[str] = Counter()
        self.threads = [
            threading.Thread(target=self._run, args=(t,), name=f"demo-failover-{t}", daemon=True)
            for t in range(WRITERS)
        ]

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def _run(self, t: int) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            docid = f"failover-{t}-{i}"
            try:
                self.users.upsert(docid, {"writer": t, "n": i}, durability="majority")
            except ShardexError as exc:
                with self.lock:
                    self.errors[exc.code.value] += 1
                if exc.code is ErrorCode.DURABILITY_IMPOSSIBLE:
                    time.sleep(0.05)
                continue
            with self.lock:
                self.acked[docid] = i


def wait_until(check: object, what: str, timeout: float = WAIT) -> float:
    """Seconds until ``check()`` holds; raises with ``what`` after ``timeout``."""
    t0 = time.monotonic()
    while not check():  # type: ignore[operator]
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting until {what}")
        time.sleep(0.05)
    return time.monotonic() - t0


def victim_of(client: Client) -> str:
    desc = next(k for k in client.list_keyspaces() if k.name == KEYSPACE)
    if desc.num_replicas < 1:
        raise SystemExit(f"keyspace {KEYSPACE} has no replicas: nothing to fail over to")
    counts = Counter(n for n in desc.assignment.values() if n != "node1")
    return counts.most_common(1)[0][0]


def chains_full(client: Client) -> bool:
    desc = next(k for k in client.list_keyspaces() if k.name == KEYSPACE)
    return desc.min_replicas == desc.num_replicas


def read_back(client: Client, acked: dict[str, int]) -> list[str]:
    """The acknowledged writes not readable with their value (must be none)."""
    users = client.keyspace(KEYSPACE)
    return [d for d, n in acked.items() if users.get(d).get("n") != n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--seconds", type=float, default=4.0, help="writing before the kill")
    args = ap.parse_args(argv)
    with connect_local(args.dir, name="demo-failover", request_timeout=30) as client:
        victim = victim_of(client)
        pid = read_pid(args.dir / victim)
        if pid is None or not pid_alive(pid):
            raise SystemExit(f"{victim} is not running")
        with Writers(client) as writers:
            time.sleep(args.seconds)
            before = writers.count()
            print(f"{before:,} majority-durable writes acknowledged; kill -9 {victim} (pid {pid})")
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            took = wait_until(lambda: victim in client.failed_over(), f"{victim} failed over")
            print(f"{victim} failed over automatically {took:.1f} s after the kill")
            at = writers.count()
            wait_until(lambda: writers.count() > at + 200, "writes after the failover")
            with writers.lock:
                sample = list(writers.acked)[-20:]
            keys = ", ".join(f'"{d}"' for d in sample)
            rows = list(client.query(f"SELECT META().id AS id FROM users USE KEYS [{keys}]"))
            print(
                f"request_plus read by key of the last {len(sample)} acknowledged writes "
                f"during the outage: {len(rows)} found"
            )
            if len(rows) != len(sample):
                raise SystemExit("an acknowledged write is missing during the outage")
            print(
                f"writes go on: {writers.count() - before:,} acknowledged since the kill "
                f"({time.monotonic() - killed:.1f} s); refusals by code: "
                f"{dict(writers.errors) or 'none'}"
            )
            shardex = Path(sys.executable).with_name("shardex")
            cmd = [str(shardex), "cluster", "start", "--dir", str(args.dir)]
            subprocess.run(cmd, check=True, capture_output=True)
            print(f"{victim} restarted: it serves nothing until recovered")
            client.recover(victim, "delta")
            client.rebalance()
            wait_until(lambda: chains_full(client), "replica chains restored")
            print("recovered (delta) and rebalanced: every partition has its replicas again")
        acked = dict(writers.acked)
        missing = read_back(client, acked)
        print(f"{len(acked):,} acknowledged writes read back: {len(missing)} missing")
        if missing:
            raise SystemExit(f"acknowledged writes lost: {missing[:10]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
