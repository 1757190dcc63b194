"""The local cluster directory made by ``shardex cluster start``.

Layout of ``DIR``::

    cluster.json        the nodes (name, address, ports, services, data dir) and settings
    secret              the cluster secret (the nodes' credential), mode 0600
    admin-password      the password of the cluster's first user, ``admin``, mode 0600
    admin.json          that user's SCRAM keys, the founding nodes' bootstrap admin, mode 0600
    certs/              with --tls: the cluster CA and the nodes' certificates and keys
                        (``shardex.net.certs``'s layout: ca.pem, ca.key, nodes/NAME.pem|key)
    node1/              node1's data dir: node.toml, node.json, members.json, node.pid,
    node2/ ...          node.lock, node.log, stdout.log

Paths inside ``cluster.json`` and the ``node.toml`` files are relative to DIR so the whole
directory can be moved. Read by the CLI and by ``shardex.client.connect_local``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import socket
from pathlib import Path
from typing import Any

import msgspec

from shardex.errors import ConfigError
from shardex.meta.node_defaults import (
    ALL_SERVICES,
    BIND_HOST,
    DEFAULT_FAILURE_TIMEOUT,
    DEFAULT_HEARTBEAT_INTERVAL,
    HTTP_PORT_OFFSET,
)
from shardex.meta.users import ADMIN_ROLES, ADMIN_USER, new_record, write_admin_file
from shardex.net.certs import CA_CERT, LOOPBACK, make_ca, make_node_cert
from shardex.net.tls import TlsConfig
from shardex.runtime.files import atomic_write_bytes, atomic_write_json, make_private_dir

CLUSTER_FILE = "cluster.json"
SECRET_FILE = "secret"
ADMIN_PASSWORD_FILE = "admin-password"
ADMIN_FILE = "admin.json"
NODE_CONFIG_FILE = "node.toml"
STDOUT_FILE = "stdout.log"
CERTS_DIR = "certs"
FORMAT = 1
DEFAULT_BASE_PORT = 7100
MAX_NODES = 64
_HTTP_PORT_LINE = re.compile(r"^http_port\s*=.*$", re.MULTILINE)


class NodeSpec(msgspec.Struct, kw_only=True):
    name: str
    address: str
    port: int
    http_port: int
    services: list[str]
    data_dir: str  # relative to the cluster dir
    seeds: list[str] = []

    def path(self, cluster_dir: Path) -> Path:
        return (cluster_dir / self.data_dir).absolute()


class ClusterSpec(msgspec.Struct, kw_only=True):
    format: int = FORMAT
    created_at: str
    base_port: int
    secret_file: str = SECRET_FILE
    # None in a directory made before users existed: clients then connect with the secret
    admin_password_file: str | None = None
    admin_file: str | None = None
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    failure_timeout: float = DEFAULT_FAILURE_TIMEOUT
    # seconds a data node may be silent before it is failed over automatically (None: the
    # node's default)
    auto_failover_timeout: float | None = None
    # the certificate directory, relative to the cluster dir, of a cluster run with TLS
    tls_dir: str | None = None
    nodes: list[NodeSpec]


def cluster_file(cluster_dir: Path) -> Path:
    return cluster_dir / CLUSTER_FILE


def exists(cluster_dir: Path) -> bool:
    return cluster_file(cluster_dir).is_file()


def load(cluster_dir: Path) -> ClusterSpec:
    path = cluster_file(cluster_dir)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"{cluster_dir} is not a shardex cluster directory (no {CLUSTER_FILE})",
            details={
                "key": "dir",
                "value": str(cluster_dir),
                "hint": f"create one with: shardex cluster start --dir {cluster_dir}",
            },
        ) from None
    try:
        return msgspec.json.decode(raw, type=ClusterSpec)
    except msgspec.DecodeError as e:
        raise ConfigError(
            f"{path} is not a valid cluster description: {e}",
            details={"key": "dir", "value": str(cluster_dir), "hint": "fix or recreate it"},
        ) from None


def _read_text(path: Path, what: str, key: str) -> str:
    """A one-line file of the cluster dir (the secret, the admin's password), stripped."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(
            f"cannot read the {what} {path}: {e.strerror}",
            details={"key": key, "value": str(path), "hint": "check the file"},
        ) from None


def read_secret(cluster_dir: Path, spec: ClusterSpec | None = None) -> str:
    spec = spec or load(cluster_dir)
    return _read_text(cluster_dir / spec.secret_file, "cluster secret", "secret_file")


def read_admin_password(cluster_dir: Path, spec: ClusterSpec | None = None) -> str | None:
    """The admin's password, or None for a cluster dir made before users existed."""
    spec = spec or load(cluster_dir)
    if spec.admin_password_file is None:
        return None
    path = cluster_dir / spec.admin_password_file
    return _read_text(path, "admin password", "admin_password_file")


def _make_admin(cluster_dir: Path) -> None:
    """The admin's password and its keys (the bootstrap admin), once, both 0600."""
    password_path = cluster_dir / ADMIN_PASSWORD_FILE
    if not password_path.exists():
        atomic_write_bytes(password_path, (secrets.token_urlsafe(24) + "\n").encode(), mode=0o600)
    os.chmod(password_path, 0o600)
    admin_path = cluster_dir / ADMIN_FILE
    if not admin_path.exists():
        password = password_path.read_text(encoding="utf-8").strip()
        write_admin_file(admin_path, new_record(ADMIN_USER, password, ADMIN_ROLES))


def tls_ca(cluster_dir: Path, spec: ClusterSpec | None = None) -> Path | None:
    """The CA certificate clients of the cluster verify its nodes with (None: no TLS)."""
    spec = spec or load(cluster_dir)
    if spec.tls_dir is None:
        return None
    return (cluster_dir / spec.tls_dir / CA_CERT).absolute()


def tls_config(cluster_dir: Path, spec: ClusterSpec | None = None) -> TlsConfig | None:
    """A client's TLS settings for the cluster (None: it runs without TLS)."""
    ca = tls_ca(cluster_dir, spec)
    return None if ca is None else TlsConfig(ca=ca)


def _node_cert(cluster_dir: Path, spec: ClusterSpec, node: NodeSpec) -> None:
    """Node ``node``'s certificate, for the loopback addresses and the one it listens on."""
    assert spec.tls_dir is not None
    host = node.address.rpartition(":")[0]
    make_node_cert(cluster_dir / spec.tls_dir, node.name, [*LOOPBACK, host])


def _node_toml(spec: ClusterSpec, node: NodeSpec) -> str:
    # Written with plain formatting (tomllib reads, does not write); every value we emit is
    # a simple string, int, float or list of strings.
    def q(s: str) -> str:
        return json.dumps(s)  # a JSON string literal is a valid TOML basic string

    lines = [
        "# Generated by `shardex cluster start`; flags given to `shardex node` override it.",
        f"name = {q(node.name)}",
        'data_dir = "."',
        f"port = {node.port}",
        f"http_port = {node.http_port}",
        f"services = [{', '.join(q(s) for s in node.services)}]",
        f"seed = [{', '.join(q(s) for s in node.seeds)}]",
        f"secret_file = {q(os.path.relpath(spec.secret_file, node.data_dir))}",
        f"heartbeat_interval = {spec.heartbeat_interval!r}",
        f"failure_timeout = {spec.failure_timeout!r}",
        'log_level = "INFO"',
    ]
    if spec.admin_file is not None:
        lines.append(f"admin_file = {q(os.path.relpath(spec.admin_file, node.data_dir))}")
    if spec.auto_failover_timeout is not None:
        lines.append(f"auto_failover_timeout = {spec.auto_failover_timeout!r}")
    if spec.tls_dir is not None:
        lines.append('tls = "on"')
        lines.append(f"tls_dir = {q(os.path.relpath(spec.tls_dir, node.data_dir))}")
    return "\n".join(lines) + "\n"


def create(
    cluster_dir: Path,
    *,
    nodes: int,
    base_port: int = DEFAULT_BASE_PORT,
    services: list[str] | None = None,
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
    failure_timeout: float = DEFAULT_FAILURE_TIMEOUT,
    auto_failover_timeout: float | None = None,
    tls: bool = False,
) -> ClusterSpec:
    """Lay out a new cluster dir: secret, per-node dirs and configs (``tls``: the CA and
    every node's certificate too), then cluster.json last (its presence is what marks the
    dir as created, so a crash midway can simply be rerun)."""
    if not 1 <= nodes <= MAX_NODES:
        raise ConfigError(
            f"--nodes {nodes} is out of range [1, {MAX_NODES}]",
            details={"key": "nodes", "value": nodes, "hint": f"use 1 to {MAX_NODES} nodes"},
        )
    top = base_port + nodes - 1 + HTTP_PORT_OFFSET
    if not base_port >= 1024 or top > 65535:
        raise ConfigError(
            f"--base-port {base_port} leaves no room for {nodes} nodes",
            details={
                "key": "base_port",
                "value": base_port,
                "hint": f"ports P..P+N-1 and P+{HTTP_PORT_OFFSET}.. must lie in 1024-65535",
            },
        )
    services = list(services or ALL_SERVICES)
    make_private_dir(cluster_dir)  # it holds the secret and every node's data
    secret_path = cluster_dir / SECRET_FILE
    if not secret_path.exists():
        atomic_write_bytes(secret_path, (secrets.token_hex(32) + "\n").encode(), mode=0o600)
    os.chmod(secret_path, 0o600)  # in case umask or a pre-existing file said otherwise
    _make_admin(cluster_dir)

    specs: list[NodeSpec] = []
    first = f"{BIND_HOST}:{base_port}"
    for i in range(nodes):
        port = base_port + i
        specs.append(
            NodeSpec(
                name=f"node{i + 1}",
                address=f"{BIND_HOST}:{port}",
                port=port,
                http_port=port + HTTP_PORT_OFFSET,
                services=services,
                data_dir=f"node{i + 1}",
                # node1 founds the cluster; the others join through it (and, on restart,
                # through any member they remember).
                seeds=[] if i == 0 else [first],
            )
        )
    spec = ClusterSpec(
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        base_port=base_port,
        admin_password_file=ADMIN_PASSWORD_FILE,
        admin_file=ADMIN_FILE,
        heartbeat_interval=heartbeat_interval,
        failure_timeout=failure_timeout,
        auto_failover_timeout=auto_failover_timeout,
        tls_dir=CERTS_DIR if tls else None,
        nodes=specs,
    )
    if tls:
        make_ca(cluster_dir / CERTS_DIR)
    for node in specs:
        node_dir = node.path(cluster_dir)
        make_private_dir(node_dir)
        if tls:
            _node_cert(cluster_dir, spec, node)
        atomic_write_bytes(node_dir / NODE_CONFIG_FILE, _node_toml(spec, node).encode())
    atomic_write_json(cluster_file(cluster_dir), to_dict(spec))
    return spec


def to_dict(spec: ClusterSpec) -> dict[str, Any]:
    return msgspec.to_builtins(spec)  # type: ignore[no-any-return]


def port_free(port: int, host: str = BIND_HOST) -> bool:
    """Whether a node could listen on ``port`` now. With SO_REUSEADDR, as the node's listener
    binds: connections of a node stopped a moment ago linger in TIME_WAIT for a minute and do
    not stop a new listener, so they must not make the port look taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def reassign_http_ports(
    cluster_dir: Path, spec: ClusterSpec, names: list[str]
) -> tuple[ClusterSpec, dict[str, tuple[int, int]]]:
    """Each of the nodes ``names`` (about to start) with a free HTTP port: one whose port is
    taken by another process gets the next free port above every port of the cluster, in
    its node.toml and in cluster.json (what ``cluster status`` and clients read). Returns
    the spec and the moves, node -> (old port, new port)."""
    moved: dict[str, tuple[int, int]] = {}
    used = {p for n in spec.nodes for p in (n.port, n.http_port)}
    nodes = list(spec.nodes)
    for i, node in enumerate(nodes):
        if node.name not in names or port_free(node.http_port):
            continue
        candidate = max(used) + 1
        while candidate <= 65535 and not port_free(candidate):
            candidate += 1
        if candidate > 65535:
            raise ConfigError(
                f"{node.name}'s HTTP port {node.http_port} is taken and no port above is free",
                details={
                    "key": "http_port",
                    "value": node.http_port,
                    "hint": "free the port (another process listens on it) and retry",
                },
            )
        moved[node.name] = (node.http_port, candidate)
        used.add(candidate)
        nodes[i] = msgspec.structs.replace(node, http_port=candidate)
    if not moved:
        return spec, moved
    new = msgspec.structs.replace(spec, nodes=nodes)
    for node in nodes:
        if node.name in moved:
            # Only its http_port line changes: an operator's edits (a group label) stay.
            path = node.path(cluster_dir) / NODE_CONFIG_FILE
            text = path.read_text(encoding="utf-8")
            line = f"http_port = {node.http_port}"
            text, n = _HTTP_PORT_LINE.subn(line, text)
            atomic_write_bytes(path, (text if n else text + line + "\n").encode())
    atomic_write_json(cluster_file(cluster_dir), to_dict(new))
    return new, moved


def add_node(
    cluster_dir: Path, spec: ClusterSpec, *, services: list[str] | None = None
) -> tuple[ClusterSpec, NodeSpec]:
    """Add one node to the cluster dir: the next port after the highest in use (its HTTP
    port at the usual offset), the next free ``nodeN`` name, seeded with every existing
    node's address (any live one lets it join), the services of node1 unless given. Writes
    its directory and config, then cluster.json last. Nothing is started here."""
    if len(spec.nodes) >= MAX_NODES:
        raise ConfigError(
            f"the cluster already has {MAX_NODES} nodes",
            details={"key": "nodes", "value": len(spec.nodes), "hint": "that is the limit"},
        )
    port = max(n.port for n in spec.nodes) + 1
    if port + HTTP_PORT_OFFSET > 65535 or not port_free(port):
        raise ConfigError(
            f"the next port {port} is not available",
            details={
                "key": "port",
                "value": port,
                "hint": "free the port (another process listens on it) and retry",
            },
        )
    names = {n.name for n in spec.nodes}
    k = len(spec.nodes) + 1
    while f"node{k}" in names or (cluster_dir / f"node{k}").exists():
        k += 1
    node = NodeSpec(
        name=f"node{k}",
        address=f"{BIND_HOST}:{port}",
        port=port,
        http_port=port + HTTP_PORT_OFFSET,
        services=list(services or spec.nodes[0].services),
        data_dir=f"node{k}",
        seeds=[n.address for n in spec.nodes],
    )
    new = msgspec.structs.replace(spec, nodes=[*spec.nodes, node])
    node_dir = node.path(cluster_dir)
    make_private_dir(node_dir)
    if new.tls_dir is not None:
        _node_cert(cluster_dir, new, node)
    atomic_write_bytes(node_dir / NODE_CONFIG_FILE, _node_toml(new, node).encode())
    atomic_write_json(cluster_file(cluster_dir), to_dict(new))
    return new, node
