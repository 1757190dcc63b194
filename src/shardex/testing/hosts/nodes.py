"""shardex nodes on ``Hosts``: one node process per network namespace, each bound to its
host's address (``host`` = ``advertise``), joined into one cluster over TLS (a cluster CA and
one certificate per node for its host's address), and clients dialling them from the test's
(root) namespace as the cluster's admin user."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from shardex.client import Client, connect
from shardex.errors import ShardexError
from shardex.meta.users import ADMIN_ROLES, ADMIN_USER, new_record, write_admin_file
from shardex.net.certs import make_ca, make_node_cert
from shardex.runtime.files import atomic_write_bytes, make_private_dir
from shardex.testing.hosts.netns import Hosts
from shardex.testing.procs import proc_env, wait_for

PORT = 7100
# Failure detection fast enough for a test, as tests/cluster's FAST_FAILOVER.
FAST = {"heartbeat_interval": 0.25, "failure_timeout": 1.0, "auto_failover_timeout": 2.0}


def _toml(values: Mapping[str, Any]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, list | tuple):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "".join(f"{k} = {fmt(v)}\n" for k, v in values.items())


class NodesOnHosts:
    """Node ``i`` (1-based, named ``host<i>``) runs on host ``i``; node 1 founds the
    cluster (bound to 0.0.0.0, advertising its host's address) and node ``i > 1`` joins
    through node ``i - 1`` (any member's address admits a
    joiner, not only the founder's)."""

    def __init__(
        self,
        hosts: Hosts,
        root: Path,
        extra: Mapping[str, Any] | None = None,
        *,
        tls: bool = True,
        count: int | None = None,
    ) -> None:
        """Nodes on hosts 1..``count`` (default every host; the rest run other things)."""
        self.hosts = hosts
        self.node_hosts = hosts.hosts[: len(hosts.hosts) if count is None else count]
        self.root = root
        self.extra = dict(FAST, **(extra or {}))
        self.secret = secrets.token_hex(32)
        make_private_dir(root)
        self.secret_file = root / "secret"
        atomic_write_bytes(self.secret_file, (self.secret + "\n").encode(), mode=0o600)
        self.names = [f"host{h.index}" for h in self.node_hosts]
        # The first admin, committed by the founder's first master (its SCRAM keys only).
        self.admin_password = secrets.token_urlsafe(24)
        self.admin_file = root / "admin.json"
        write_admin_file(self.admin_file, new_record(ADMIN_USER, self.admin_password, ADMIN_ROLES))
        self.cert_dir: Path | None = None
        if tls:
            self.cert_dir = root / "certs"
            make_ca(self.cert_dir)
            for h in self.node_hosts:
                make_node_cert(self.cert_dir, f"host{h.index}", [h.ip])

    @property
    def tls_ca(self) -> Path | None:
        return None if self.cert_dir is None else self.cert_dir / "ca.pem"

    def address(self, i: int) -> str:
        return f"{self.hosts.host(i).ip}:{PORT}"

    @property
    def addresses(self) -> list[str]:
        return [self.address(h.index) for h in self.node_hosts]

    def data_dir(self, i: int) -> Path:
        return self.root / f"host{i}"

    def write_config(self, i: int, **extra: Any) -> Path:
        """``host<i>/node.toml``: ``extra`` keys (e.g. TLS settings) over the defaults."""
        ip = self.hosts.host(i).ip
        values: dict[str, Any] = {
            "name": f"host{i}",
            "data_dir": str(self.data_dir(i)),
            # Node 1 binds every interface of its host and announces the one the others
            # dial; the rest bind that address alone (advertise defaults to it).
            "host": "0.0.0.0" if i == 1 else ip,
            **({"advertise": ip} if i == 1 else {}),
            "port": PORT,
            "secret_file": str(self.secret_file),
            "admin_file": str(self.admin_file),
            # TLS is on by default off loopback: with no certificates the node must say off.
            **({"tls": "on", "tls_dir": str(self.cert_dir)} if self.cert_dir else {"tls": "off"}),
            **({"seed": [self.address(i - 1)]} if i > 1 else {}),
            **self.extra,
            **extra,
        }
        make_private_dir(self.data_dir(i))
        path = self.root / f"host{i}.toml"
        path.write_text(_toml(values), encoding="utf-8")
        return path

    def start(self, i: int, **extra: Any) -> None:
        """Start node ``i`` in host ``i`` (``python -m shardex.cli.node --config``)."""
        config = self.write_config(i, **extra)
        argv = [sys.executable, "-m", "shardex.cli.node", "--config", str(config)]
        self.hosts.spawn(i, argv, env=proc_env(), log=self.data_dir(i) / "stdout.log")

    def start_all(self, **extra: Any) -> None:
        for h in self.node_hosts:
            self.start(h.index, **extra)

    def connect(self, name: str = "test", **kw: Any) -> Client:
        kw.setdefault("request_timeout", 30)
        return connect(
            self.addresses,
            username=ADMIN_USER,
            password=self.admin_password,
            tls_ca=self.tls_ca,
            name=name,
            **kw,
        )

    def wait_formed(self, timeout: float = 120.0) -> None:
        """Until every node is a member, up, at its advertised address."""
        want = dict(zip(self.names, self.addresses, strict=True))

        def formed() -> dict[str, str] | None:
            try:
                with self.connect(name="probe", connect_timeout=2) as c:
                    status = c.cluster_status()
            except ShardexError:
                return None
            got = {m.name: m.address for m in status.members if m.state == "up"}
            return got if got == want else None

        wait_for(formed, timeout, interval=0.5, what=f"cluster of {want}")

    def log_tail(self, i: int, lines: int = 40) -> str:
        path = self.data_dir(i) / "stdout.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def logs(self) -> Iterator[str]:
        for h in self.node_hosts:
            yield f"--- host{h.index}\n{self.log_tail(h.index)}"
