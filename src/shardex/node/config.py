"""Typed, validated configuration of one ``shardex node`` process.

Sources, lowest precedence first: built-in defaults, a TOML file (``--config``), then command
line flags. Every key is declared once in ``NodeConfig``; an unknown key, a wrong type or an
out-of-range value raises ``ConfigError`` naming the key, the value and a hint, so an operator
never has to guess which line of which file was wrong. (No string-keyed config map is passed
around after loading: services receive the frozen dataclass.)
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardex.errors import ConfigError
from shardex.manager.auto_failover import DEFAULT_MAX_COUNT, DEFAULT_TIMEOUT, MIN_TIMEOUT
from shardex.meta.node_defaults import (
    ALL_SERVICES,
    BIND_HOST,
    DEFAULT_EXPIRY_PAGER_BATCH,
    DEFAULT_EXPIRY_PAGER_INTERVAL,
    DEFAULT_FAILURE_TIMEOUT,
    DEFAULT_HEARTBEAT_INTERVAL,
    HTTP_PORT_OFFSET,
)
from shardex.net.tls import TlsConfig
from shardex.node.config_values import (
    as_bool,
    as_bytes,
    as_float,
    as_host,
    as_int,
    as_str_list,
    config_error,
    resolve_path,
    validate_address,
)
from shardex.runtime.admission import DEFAULT_QUEUED, FRAGMENT_SLOTS_PER_CPU, SLOTS_PER_CPU
from shardex.runtime.files import read_private_text, require_private
from shardex.sql.exec.memory import DEFAULT_QUERY_MEMORY, MIN_QUERY_MEMORY, NODE_MEMORY_SHARE

LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_PORT = 7100
MIN_SECRET_LENGTH = 16
# Users' connections a node keeps open at once (nodes' own are never counted): a client opens
# one per node and per calling thread, so this serves hundreds of clients.
DEFAULT_MAX_CONNECTIONS = 1000

# Used with ``fullmatch``: ``$`` also matches before a trailing newline, so "n1\n" would pass.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# A server group label (a rack, a zone): replicas of a partition go to distinct groups.
_GROUP_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
# A host name or an IPv4/IPv6 literal, without brackets or a port.
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "0:0:0:0:0:0:0:0"})
_SECRET_HINT = (
    "give the cluster secret with --secret-file FILE (or secret_file = ... in the config file); "
    "generate one with: python -c 'import secrets; print(secrets.token_hex(32))'"
)

# Keys accepted in the TOML file and as overrides. ``secret`` and ``secret_file`` are two
# spellings of one setting and are resolved together (see ``load_config``).
CONFIG_KEYS: frozenset[str] = frozenset(
    {
        "name",
        "data_dir",
        "host",
        "advertise",
        "port",
        "http_port",
        "services",
        "seed",
        "secret",
        "secret_file",
        "log_level",
        "heartbeat_interval",
        "failure_timeout",
        "auto_failover",
        "auto_failover_timeout",
        "auto_failover_max_count",
        "group",
        "admin_file",
        "tls",
        "tls_dir",
        "tls_ca",
        "tls_cert",
        "tls_key",
        "sql_max_running",
        "sql_max_queued",
        "sql_max_fragments",
        "max_connections",
        "sql_query_memory",
        "sql_node_memory",
        "sql_spill",
        "expiry_pager_interval",
        "expiry_pager_batch",
    }
)
TLS_MODES: tuple[str, ...] = ("auto", "on", "off")
_TLS_HINT = (
    "give tls_dir = DIR (made by `shardex cluster certs`: DIR/ca.pem, DIR/nodes/NAME.pem and "
    '.key), or tls_ca, tls_cert and tls_key; or tls = "off" to run without TLS'
)


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """Everything a node process needs to start; immutable once validated."""

    name: str
    data_dir: Path
    secret: str = dataclasses.field(repr=False)  # never printed in logs or tracebacks
    port: int = DEFAULT_PORT
    # The HTTP query service's port (``node/http``): by default ``port`` + HTTP_PORT_OFFSET
    # (0 with port 0: a free one); "off" (None) serves no HTTP.
    http_port: int | None = DEFAULT_PORT + HTTP_PORT_OFFSET
    services: tuple[str, ...] = ALL_SERVICES
    seeds: tuple[str, ...] = ()  # empty: this node founds the cluster
    log_level: str = "INFO"
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    failure_timeout: float = DEFAULT_FAILURE_TIMEOUT
    host: str = BIND_HOST  # the interface the listener binds (0.0.0.0: every interface)
    # The host other nodes and clients dial: what this node announces in membership, and so
    # what the topology, joins and client routing carry. Defaults to ``host``; never a
    # wildcard (nobody can dial 0.0.0.0).
    advertise: str = BIND_HOST
    # automatic failover of a data node that a majority of managers see down (the master
    # runs it: ``manager/auto_failover.py``)
    auto_failover: bool = True
    auto_failover_timeout: float = DEFAULT_TIMEOUT
    auto_failover_max_count: int = DEFAULT_MAX_COUNT
    # Server group label (rack, zone); "" = none. Replica placement spreads each partition's
    # chain over distinct groups when nodes carry labels.
    group: str = ""
    # The bootstrap admin (``meta/users.py``): committed by a master whose state has no user.
    admin_file: Path | None = None
    # TLS on every connection (None: plaintext); "auto" turns it on for a non-loopback host
    tls: TlsConfig | None = None
    # Admission (``runtime/admission.py``): SQL statements running at once with this node as
    # their initiator (None: ``SLOTS_PER_CPU`` per CPU) and waiting for a slot past those.
    sql_max_running: int | None = None
    sql_max_queued: int = DEFAULT_QUEUED
    # Executions of other nodes' queries (their fragments) run here at once; past it a query
    # fails with QUERY_OVERLOADED without waiting (None: ``FRAGMENT_SLOTS_PER_CPU`` per CPU).
    sql_max_fragments: int | None = None
    # Users' connections open at once; one more is told TOO_MANY_CONNECTIONS and closed.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # SQL memory (decision 0106), bytes: what one statement's operators may hold here (the
    # default and the most a client may ask for), what all running statements may hold
    # together (None: ``NODE_MEMORY_SHARE`` of RAM), and whether they spill past it.
    sql_query_memory: int = DEFAULT_QUERY_MEMORY
    sql_node_memory: int | None = None
    sql_spill: bool = True
    # The expiry pager (``data/expiry_pager.py``): seconds between its walk's ticks, and the
    # document records one tick reads at most.
    expiry_pager_interval: float = DEFAULT_EXPIRY_PAGER_INTERVAL
    expiry_pager_batch: int = DEFAULT_EXPIRY_PAGER_BATCH

    @property
    def address(self) -> str:
        """The bind address, ``host:port``."""
        return f"{self.host}:{self.port}"

    @property
    def advertise_address(self) -> str:
        """The announced address, ``advertise:port`` (port 0 is replaced once bound)."""
        return f"{self.advertise}:{self.port}"

    @property
    def runs_manager(self) -> bool:
        return "manager" in self.services


def load_toml(path: Path) -> dict[str, Any]:
    """Read a config file; syntax errors become ``ConfigError`` with the file and position."""
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(
            f"config file {str(path)!r} does not exist",
            details={"key": "config", "value": str(path), "hint": "check the --config path"},
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"config file {str(path)!r} is not valid TOML: {exc}",
            details={"key": "config", "value": str(path), "hint": "fix the TOML syntax"},
        ) from None
    # Accept either top-level keys or a [node] table (room for other sections later).
    if "node" in data and isinstance(data["node"], dict):
        data = {**{k: v for k, v in data.items() if k != "node"}, **data["node"]}
    return data


def load_config(
    file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> NodeConfig:
    """Build a validated ``NodeConfig`` from an optional TOML file plus flag overrides.

    ``overrides`` uses the config-file key names; ``None`` values mean "not given". The
    secret is one setting with two spellings: whichever layer (file, then flags) last
    gives ``secret`` or ``secret_file`` decides, and giving both in one layer is an error.
    """
    file_values: dict[str, Any] = {}
    file_base: Path | None = None
    if file is not None:
        file_values = load_toml(file)
        file_base = file.absolute().parent
    flag_values = {k: v for k, v in (overrides or {}).items() if v is not None}

    for layer, source in ((file_values, "config file"), (flag_values, "command line")):
        unknown = sorted(set(layer) - CONFIG_KEYS)
        if unknown:
            raise config_error(
                unknown[0],
                layer[unknown[0]],
                f"unknown key in the {source}",
                f"valid keys: {', '.join(sorted(CONFIG_KEYS))}",
            )
        if "secret" in layer and "secret_file" in layer:
            raise config_error(
                "secret", None, f"both secret and secret_file given in the {source}", _SECRET_HINT
            )

    merged: dict[str, Any] = dict(file_values)
    if "secret" in flag_values or "secret_file" in flag_values:
        merged.pop("secret", None)
        merged.pop("secret_file", None)
    merged.update(flag_values)
    # Paths from the command line are relative to the working directory, from the file to it.
    bases = {k: (None if k in flag_values else file_base) for k in merged}
    return _build(merged, bases)


def _build(values: dict[str, Any], bases: dict[str, Path | None]) -> NodeConfig:
    name = values.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise config_error(
            "name",
            name,
            "missing or not a valid node name",
            "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )

    if "data_dir" not in values:
        raise config_error("data_dir", None, "missing", "give --data-dir DIR (created if absent)")
    data_dir = resolve_path(values["data_dir"], "data_dir", bases.get("data_dir"))
    if data_dir.exists() and not data_dir.is_dir():
        raise config_error(
            "data_dir", str(data_dir), "exists and is not a directory", "pick a directory"
        )

    port_hint = "a TCP port 1-65535 (0 picks a free one)"
    port = as_int("port", values.get("port", DEFAULT_PORT), 0, 65535, port_hint)

    http_port = _http_port(values, port)

    host, advertise = _hosts(values)

    svc_hint = f"a comma-separated subset of {','.join(ALL_SERVICES)}"
    services = as_str_list("services", values.get("services", list(ALL_SERVICES)), svc_hint)
    services = [s.lower() for s in services]
    bad = [s for s in services if s not in ALL_SERVICES]
    if bad:
        raise config_error("services", bad[0], "unknown service", svc_hint)
    if not services:
        raise config_error("services", values.get("services"), "no service given", svc_hint)
    # Canonical order, no duplicates: two configs naming the same set compare equal.
    service_tuple = tuple(s for s in ALL_SERVICES if s in services)

    seed_hint = "host:port of a running node to join through, e.g. 127.0.0.1:7100"
    seeds = tuple(
        validate_address("seed", s, seed_hint)
        for s in as_str_list("seed", values.get("seed", []), seed_hint)
    )

    if "secret_file" in values:
        secret_path = resolve_path(values["secret_file"], "secret_file", bases.get("secret_file"))
        secret = read_private_text(secret_path, "secret_file", "cluster secret")
        secret_key = "secret_file"
    elif "secret" in values:
        secret, secret_key = values["secret"], "secret"
        if not isinstance(secret, str):
            raise config_error("secret", secret, "not a string", _SECRET_HINT)
        secret = secret.strip()
    else:
        raise ConfigError(
            "no cluster secret configured: a node refuses to start without one",
            details={"key": "secret", "value": None, "hint": _SECRET_HINT},
        )
    if len(secret) < MIN_SECRET_LENGTH:
        raise ConfigError(
            f"config key {secret_key!r}: the cluster secret is shorter than "
            f"{MIN_SECRET_LENGTH} characters; {_SECRET_HINT}",
            details={"key": secret_key, "value": None, "hint": _SECRET_HINT},
        )

    level = values.get("log_level", "INFO")
    level_hint = f"one of {', '.join(LOG_LEVELS)}"
    if not isinstance(level, str) or level.upper() not in LOG_LEVELS:
        raise config_error("log_level", level, "unknown log level", level_hint)

    hb_hint = "seconds between heartbeats, e.g. 0.5"
    interval = as_float(
        "heartbeat_interval", values.get("heartbeat_interval", DEFAULT_HEARTBEAT_INTERVAL), hb_hint
    )
    ft_hint = "seconds of silence before a member is marked down, e.g. 3"
    timeout = as_float(
        "failure_timeout", values.get("failure_timeout", DEFAULT_FAILURE_TIMEOUT), ft_hint
    )
    # With fewer than two heartbeat periods in the window, one late packet flaps a member.
    if timeout < 2 * interval:
        raise config_error(
            "failure_timeout",
            timeout,
            f"must be at least twice heartbeat_interval ({interval})",
            f"use failure_timeout >= {2 * interval:g} or a shorter heartbeat_interval",
        )

    auto = _auto_failover(values, timeout)
    group = values.get("group", "")
    if not isinstance(group, str) or (group and not _GROUP_RE.fullmatch(group)):
        raise config_error(
            "group",
            group,
            "not a valid server group label",
            "use 1-32 letters, digits, '.', '_' or '-', starting with a letter or digit "
            "(or leave it out: no group)",
        )

    admin_file = (
        resolve_path(values["admin_file"], "admin_file", bases.get("admin_file"))
        if values.get("admin_file")
        else None
    )

    tls = _tls(values, bases, name, host)
    running: int | None = None
    if "sql_max_running" in values:
        running = as_int(
            "sql_max_running",
            values["sql_max_running"],
            1,
            100_000,
            f"SQL statements this node runs at once, >= 1 (default {SLOTS_PER_CPU} per CPU)",
        )
    queued = as_int(
        "sql_max_queued",
        values.get("sql_max_queued", DEFAULT_QUEUED),
        0,
        1_000_000,
        "SQL statements that may wait for a running one to finish, >= 0 "
        f"(default {DEFAULT_QUEUED}; 0: refuse at once when all run)",
    )
    fragments: int | None = None
    if "sql_max_fragments" in values:
        fragments = as_int(
            "sql_max_fragments",
            values["sql_max_fragments"],
            1,
            1_000_000,
            "executions of other nodes' SQL statements this node runs at once, >= 1 "
            f"(default {FRAGMENT_SLOTS_PER_CPU} per CPU)",
        )
    max_connections = as_int(
        "max_connections",
        values.get("max_connections", DEFAULT_MAX_CONNECTIONS),
        1,
        1_000_000,
        f"users' connections this node keeps open at once, >= 1 (default "
        f"{DEFAULT_MAX_CONNECTIONS}; nodes' connections are not counted)",
    )
    query_memory, node_memory = _sql_memory(values)
    spill = as_bool(
        "sql_spill",
        values.get("sql_spill", True),
        "true or false: SQL sorts and aggregations past their memory budget spill to disk "
        "(false: the statement fails with QUERY_MEMORY_LIMIT)",
    )
    pager_interval = as_float(
        "expiry_pager_interval",
        values.get("expiry_pager_interval", DEFAULT_EXPIRY_PAGER_INTERVAL),
        f"seconds between the expiry pager's walks (default {DEFAULT_EXPIRY_PAGER_INTERVAL:g})",
    )
    pager_batch = as_int(
        "expiry_pager_batch",
        values.get("expiry_pager_batch", DEFAULT_EXPIRY_PAGER_BATCH),
        1,
        10_000_000,
        "document records one expiry pager walk reads at most "
        f"(default {DEFAULT_EXPIRY_PAGER_BATCH})",
    )
    return NodeConfig(
        expiry_pager_interval=pager_interval,
        expiry_pager_batch=pager_batch,
        sql_query_memory=query_memory,
        sql_node_memory=node_memory,
        sql_spill=spill,
        max_connections=max_connections,
        sql_max_fragments=fragments,
        sql_max_running=running,
        sql_max_queued=queued,
        admin_file=admin_file,
        name=name,
        data_dir=data_dir,
        secret=secret,
        port=port,
        http_port=http_port,
        services=service_tuple,
        seeds=seeds,
        log_level=level.upper(),
        heartbeat_interval=interval,
        failure_timeout=timeout,
        auto_failover=auto[0],
        auto_failover_timeout=auto[1],
        auto_failover_max_count=auto[2],
        group=group,
        tls=tls,
        host=host,
        advertise=advertise,
    )


def _http_port(values: dict[str, Any], port: int) -> int | None:
    """The query service's port: given, "off", or ``port`` + ``HTTP_PORT_OFFSET`` (0, a free
    one, when ``port`` is 0 or the sum is past 65535)."""
    hint = (
        f"a TCP port 1-65535 (0 picks a free one; default port + {HTTP_PORT_OFFSET}), or "
        '"off" to serve no HTTP'
    )
    if "http_port" not in values:
        derived = port + HTTP_PORT_OFFSET
        return derived if port and derived <= 65535 else 0
    value = values["http_port"]
    if isinstance(value, str) and value.strip().lower() == "off":
        return None
    http_port = as_int("http_port", value, 0, 65535, hint)
    if http_port != 0 and http_port == port:
        raise config_error("http_port", http_port, "same as port", "use a different port for HTTP")
    return http_port


def _sql_memory(values: dict[str, Any]) -> tuple[int, int | None]:
    """(sql_query_memory, sql_node_memory): a statement's budget within the node's."""
    query = as_bytes(
        "sql_query_memory",
        values.get("sql_query_memory", DEFAULT_QUERY_MEMORY),
        MIN_QUERY_MEMORY,
        f"bytes one SQL statement may hold on this node, >= {MIN_QUERY_MEMORY} "
        f'(default {DEFAULT_QUERY_MEMORY >> 20} MiB), e.g. "512MiB"',
    )
    node: int | None = None
    if "sql_node_memory" in values:
        node = as_bytes(
            "sql_node_memory",
            values["sql_node_memory"],
            MIN_QUERY_MEMORY,
            "bytes all running SQL statements may hold together on this node "
            f'(default {NODE_MEMORY_SHARE:.0%} of RAM), e.g. "4GiB"',
        )
        if node < query:
            raise config_error(
                "sql_node_memory",
                node,
                f"less than sql_query_memory ({query})",
                "give sql_node_memory >= sql_query_memory: one statement must fit the node",
            )
    return query, node


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a DNS name: other hosts may dial it


def _tls(
    values: dict[str, Any], bases: dict[str, Path | None], name: str, host: str
) -> TlsConfig | None:
    """The node's TLS settings: ``tls`` (auto: on unless the node binds a loopback address)
    and where its certificates are (``tls_dir``, or ``tls_ca``/``tls_cert``/``tls_key``,
    which override the directory's files one by one)."""
    mode = values.get("tls", "auto")
    if isinstance(mode, bool):
        mode = "on" if mode else "off"
    if not isinstance(mode, str) or mode.strip().lower() not in TLS_MODES:
        raise config_error(
            "tls",
            mode,
            "not a TLS mode",
            "one of auto (on when the node binds a non-loopback host), on, off",
        )
    mode = mode.strip().lower()
    if mode == "off" or (mode == "auto" and _is_loopback(host)):
        return None
    paths: dict[str, Path] = {}
    if "tls_dir" in values:
        from shardex.net.certs import node_paths

        cert_dir = resolve_path(values["tls_dir"], "tls_dir", bases.get("tls_dir"))
        p = node_paths(cert_dir, name)
        paths = {"tls_ca": p.ca, "tls_cert": p.cert, "tls_key": p.key}
    for key in ("tls_ca", "tls_cert", "tls_key"):
        if key in values:
            paths[key] = resolve_path(values[key], key, bases.get(key))
    missing = [k for k in ("tls_ca", "tls_cert", "tls_key") if k not in paths]
    if missing:
        why = "TLS is on" if mode == "on" else f"TLS is on by default for host {host}"
        raise config_error(missing[0], None, f"missing: {why}", _TLS_HINT)
    for key, path in paths.items():
        if not path.is_file():
            raise config_error(key, str(path), "no such file", _TLS_HINT)
    require_private(paths["tls_key"], "tls_key")  # the node's private key: owner-only
    return TlsConfig(ca=paths["tls_ca"], cert=paths["tls_cert"], key=paths["tls_key"])


def _hosts(values: dict[str, Any]) -> tuple[str, str]:
    """(host, advertise): the bind interface and the address announced to the cluster."""
    host = as_host(
        "host",
        values.get("host", BIND_HOST),
        "the interface to listen on: an IP address of this machine, or 0.0.0.0 for all",
    )
    adv_hint = (
        "the address other nodes and clients dial to reach this node, e.g. this host's "
        "IP on the cluster network (set advertise = ... when host is a wildcard)"
    )
    advertise = as_host("advertise", values.get("advertise", host), adv_hint)
    if advertise in _WILDCARD_HOSTS:
        problem = (
            "a wildcard address cannot be advertised"
            if "advertise" in values
            else f"host {host!r} is a wildcard, so advertise must be given"
        )
        raise config_error("advertise", advertise, problem, adv_hint)
    return host, advertise


def _auto_failover(values: dict[str, Any], failure_timeout: float) -> tuple[bool, float, int]:
    """(auto_failover, auto_failover_timeout, auto_failover_max_count), validated."""
    enabled = as_bool(
        "auto_failover",
        values.get("auto_failover", True),
        "true or false: fail a data node over automatically when a majority of managers "
        "see it down",
    )
    key = "auto_failover_timeout"
    hint = f"seconds a data node must be seen down before it is failed over, >= {MIN_TIMEOUT:g}"
    seconds = as_float(key, values.get(key, DEFAULT_TIMEOUT), hint)
    if seconds < MIN_TIMEOUT:
        raise config_error(
            key, seconds, f"below the minimum {MIN_TIMEOUT:g} s", f"use {key} >= {MIN_TIMEOUT:g}"
        )
    # The age counted is the silence since the last heartbeat; a node is only marked down
    # after failure_timeout of it, so a shorter timeout would fail it over the moment it is
    # marked down, with no margin for one slow heartbeat.
    if seconds <= failure_timeout:
        raise config_error(
            key,
            seconds,
            f"must exceed failure_timeout ({failure_timeout:g} s): a node is only marked down "
            "after failure_timeout of silence, and auto-failover waits for it to stay down",
            f"use {key} > {failure_timeout:g} or a shorter failure_timeout",
        )
    count_key = "auto_failover_max_count"
    count = as_int(
        count_key,
        values.get(count_key, DEFAULT_MAX_COUNT),
        1,
        1_000,
        "nodes that may be failed over automatically before an operator recovers them, >= 1",
    )
    return enabled, seconds, count


def log_level_number(config: NodeConfig) -> int:
    return logging.getLevelName(config.log_level)  # type: ignore[no-any-return]
