"""Hosts made of Linux network namespaces on one bridge, for multi-host tests on one machine.

Each host is a namespace with one veth link to a bridge in the root namespace; hosts get
addresses in a private /24 that exists only on that bridge and in those namespaces, and the
bridge itself holds ``.1`` of it so the test process (root namespace) dials hosts directly.
``spawn`` runs any command in a host (``ip netns exec``); ``delay`` puts ``tc netem`` on a
host's link; ``cut``/``heal`` take its link down and up.

Every name starts with ``PREFIX`` plus the creating process's pid: ``Hosts.create`` first
removes what a crashed run left behind (names whose pid is no longer alive), and ``destroy``
(a fixture finalizer) kills every process in the namespaces, then removes them and the bridge.
Needs root and ``ip``; ``netns_problem`` says why not, ``require_netns`` skips a test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from shardex.runtime.pidfile import pid_alive

PREFIX = "sxh"  # + pid + role: bridge "sxh<pid>b", links "sxh<pid>v<i>", namespaces "sxh<pid>n<i>"
_OWNED = re.compile(rf"{PREFIX}(\d+)[bvn]\d*")
SUBNET_BASE = "10.213"  # 10.213.<k>.0/24, k picked free per run (see ``_free_octet``)


class NetemUnavailable(RuntimeError):
    """The kernel has no netem qdisc (``sch_netem`` not built or not loadable)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def netns_problem() -> str | None:
    """Why this process cannot make namespaces, bridges and veths, or None when it can."""
    if os.geteuid() != 0:
        return "multi-host runs need root (network namespaces); run them as root"
    probe = f"{PREFIX}{os.getpid()}n99"
    try:
        made = _ip("netns", "add", probe, check=False)
    except FileNotFoundError:
        return "multi-host runs need the 'ip' command (iproute2)"
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def require_netns() -> None:
    """Skip the calling test (with the reason) unless namespaces can be made."""
    problem = netns_problem()
    if problem is not None:
        import pytest

        pytest.skip(problem)


def remove_leftovers() -> None:
    """Remove namespaces and links of runs whose process is gone (a crashed or killed run)."""
    names = _ip("netns", "list", check=False).stdout.split()
    names += re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", "show", check=False).stdout, re.M)
    for name in names:
        m = _OWNED.fullmatch(name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        if name.startswith(f"{PREFIX}{m.group(1)}n"):
            _kill_all_in(name)
            _ip("netns", "del", name, check=False)
        else:
            _ip("link", "del", name, check=False)


def _kill_all_in(ns: str) -> None:
    for pid in _ip("netns", "pids", ns, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _free_octet() -> int:
    """A third octet no local route uses, so two runs (or a leftover) never share a subnet."""
    routes = _ip("-4", "route", "show", check=False).stdout
    for k in range(1, 255):
        if f"{SUBNET_BASE}.{k}." not in routes:
            return k
    raise RuntimeError(f"no free {SUBNET_BASE}.k.0/24 subnet")


@dataclasses.dataclass
class Host:
    index: int  # 1-based
    ns: str  # namespace name
    link: str  # the veth end on the bridge (root namespace)
    ip: str


class Hosts:
    """``n`` hosts on one bridge. Use ``with Hosts(n) as hosts:`` or call ``destroy``."""

    def __init__(self, n: int) -> None:
        tag = f"{PREFIX}{os.getpid()}"
        self.bridge = f"{tag}b"
        self.octet = 0
        self.hosts: list[Host] = []
        self._tag = tag
        self._n = n
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def gateway(self) -> str:
        """The bridge's address in the root namespace (the test process's side)."""
        return f"{SUBNET_BASE}.{self.octet}.1"

    def __enter__(self) -> Hosts:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def create(self) -> None:
        remove_leftovers()
        self.octet = _free_octet()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(1, self._n + 1):
                self.hosts.append(self._make_host(i))
        except BaseException:
            self.destroy()
            raise

    def _make_host(self, i: int) -> Host:
        ip = f"{SUBNET_BASE}.{self.octet}.{10 + i}"
        host = Host(i, f"{self._tag}n{i}", f"{self._tag}v{i}", ip)
        peer = f"{self._tag}p{i}"
        _ip("netns", "add", host.ns)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", host.ns)
        _ip("link", "set", host.link, "master", self.bridge)
        _ip("link", "set", host.link, "up")
        ns = ("-n", host.ns)
        _ip(*ns, "link", "set", "lo", "up")
        _ip(*ns, "link", "set", peer, "name", "eth0")
        _ip(*ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip(*ns, "link", "set", "eth0", "up")
        return host

    def destroy(self) -> None:
        """Kill every process in the hosts, then remove the namespaces, links and bridge.
        Safe to call twice and after a partial ``create``."""
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for host in self.hosts:
            _kill_all_in(host.ns)
            _ip("link", "del", host.link, check=False)  # removes its peer too
            _ip("netns", "del", host.ns, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.hosts = []

    def host(self, i: int) -> Host:
        return self.hosts[i - 1]

    def spawn(
        self,
        i: int,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Run ``argv`` in host ``i`` (its own session; output to ``log`` or discarded).
        ``ip netns exec`` execs the command, so the returned pid is the command's own."""
        out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.host(i).ns, *argv],
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if log is not None:
                out.close()  # type: ignore[union-attr]
        self._procs.append(proc)
        return proc

    def run(self, i: int, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run a short command in host ``i`` and wait for it (``ping``, ``ss``...)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.host(i).ns, *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def delay(self, i: int, ms: float) -> None:
        """``tc netem`` delay on host ``i``'s link, both directions (each egress), so a round
        trip between two hosts costs about ``4 * ms``."""
        netem = ["root", "netem", "delay", f"{ms}ms"]
        in_ns = ["ip", "netns", "exec", self.host(i).ns]
        for cmd in (
            ["tc", "qdisc", "replace", "dev", self.host(i).link, *netem],
            [*in_ns, "tc", "qdisc", "replace", "dev", "eth0", *netem],
        ):
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                if "unknown" in proc.stderr.lower():
                    raise NetemUnavailable(proc.stderr.strip())
                raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")

    def cut(self, i: int) -> None:
        """Take host ``i``'s link down: it hears no one, no one hears it; its processes run on."""
        _ip("link", "set", self.host(i).link, "down")

    def heal(self, i: int) -> None:
        _ip("link", "set", self.host(i).link, "up")
