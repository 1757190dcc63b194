"""Instructions a node runs per get, in clear and over TLS:
``python -m bench.diagnostics.node_callgrind [--tls off|on|ab] [--gets N]``.

CPU time per operation moves with the machine's other work (up to 3x between runs on a
shared VM without hardware counters); instructions do not. Per cluster: a 2-node local
cluster (``shardex cluster start``, with ``--tls`` for TLS), keyspace ``cg`` of 16
partitions and one replica holding 2,000 small documents; node1 is stopped and started
again under ``valgrind --tool=callgrind --instr-atstart=no`` (same command, same config),
and counted (``callgrind_control -i on``) only over ``--gets`` gets, from this process's
client (the calling thread's socket, as users' gets go), of keys it owns. ``ab`` runs a
plaintext cluster, then a TLS one: read the TLS/plain ratio. The node's code is the one on
``PYTHONPATH`` (a copy of ``src/`` first for the code before a change).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common.local_cluster import shardex_cluster

KEYSPACE = "cg"
DOCS = 2000


def stop_node(pid_file: Path) -> None:
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise RuntimeError(f"node {pid} did not stop")


def _owned(client: Any, address: str) -> list[str]:
    """Document ids of the keyspace whose owner is the node at ``address``."""
    ks = client.keyspace(KEYSPACE)
    ks.get("d0")  # the client learns the topology
    router = client.rpc.router
    return [
        d for d in (f"d{i}" for i in range(DOCS)) if router.owner_address(KEYSPACE, d) == address
    ]


def count(base: Path, tls: bool, gets: int) -> float:
    """Instructions per get of node1 of a fresh cluster."""
    from shardex.client import connect_local

    with shardex_cluster(base, 2, ["--tls"] if tls else []) as cdir:
        with connect_local(cdir, name="node-callgrind") as client:
            client.create_keyspace(KEYSPACE, num_partitions=16, num_replicas=1)
            doc = {"name": "n" * 40, "age": 30, "city": "x"}
            client.keyspace(KEYSPACE).upsert_many((f"d{i}", doc) for i in range(DOCS))
        node = cdir / "node1"
        config = (node / "node.toml").read_text()
        port = next(ln.split("=")[1].strip() for ln in config.splitlines() if ln.startswith("port"))
        stop_node(node / "node.pid")
        out = Path(tempfile.mkdtemp(prefix="node-callgrind-"))
        vg = start_under_callgrind(node, out)
        try:
            with connect_local(cdir, name="node-callgrind") as client:
                ks = client.keyspace(KEYSPACE)
                deadline = time.monotonic() + 300  # a node under valgrind starts slowly
                while True:
                    try:
                        mine = _owned(client, f"127.0.0.1:{port}")
                        for d in mine[:50]:
                            ks.get(d)
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(1)
                for i in range(300):  # warm, not counted
                    ks.get(mine[i % len(mine)])
                with counting(vg.pid):
                    for i in range(gets):
                        ks.get(mine[i % len(mine)])
        finally:
            os.killpg(vg.pid, signal.SIGTERM)
            vg.wait(120)
        return counted(out) / gets


def start_under_callgrind(node: Path, out: Path) -> subprocess.Popen[bytes]:
    """The node of directory ``node`` (stopped) started again under callgrind with its own
    config, counting nothing until ``counting``; its counts go to files in ``out``."""
    env = dict(os.environ)
    env.pop("SHARDEX_SECRET", None)
    cmd = ["valgrind", "-q", "--tool=callgrind", "--instr-atstart=no"]
    cmd += [f"--callgrind-out-file={out}/cg.%p", sys.executable, "-m", "shardex.cli.node"]
    return subprocess.Popen(
        [*cmd, "--config", str(node / "node.toml")],
        cwd=node,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@contextlib.contextmanager
def counting(pid: int) -> Iterator[None]:
    """Callgrind counts the process ``pid`` while the block runs, dumped at its end."""
    control = ["callgrind_control"]
    subprocess.run([*control, "-i", "on", str(pid)], check=True, capture_output=True)
    yield
    subprocess.run([*control, "-i", "off", str(pid)], check=True, capture_output=True)
    subprocess.run([*control, "--dump", str(pid)], check=True, capture_output=True)


def counted(out: Path) -> int:
    """Instructions counted in the callgrind files of ``out`` (removed)."""
    total = sum(
        int(line.split()[1])
        for path in out.glob("cg.*")
        for line in path.read_text().splitlines()
        if line.startswith("totals:")
    )
    shutil.rmtree(out, ignore_errors=True)
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diagnostics.node_callgrind")
    ap.add_argument("--tls", choices=["off", "on", "ab"], default="ab")
    ap.add_argument("--gets", type=int, default=2000)
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        ap.error("needs valgrind and callgrind_control on the PATH")
    if args.gets < 1:
        ap.error(f"--gets must be >= 1, got {args.gets}")
    modes = {"off": [False], "on": [True], "ab": [False, True]}[args.tls]
    found: dict[bool, float] = {}
    with tempfile.TemporaryDirectory(prefix="node-callgrind-") as base:
        for tls in modes:
            found[tls] = count(Path(base), tls, args.gets)
            name = "TLS" if tls else "plain"
            print(f"{name}: node1 runs {found[tls]:,.0f} instructions per get", flush=True)
    if len(found) == 2:
        print(f"TLS / plain: {found[True] / found[False]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
