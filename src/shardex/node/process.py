"""The ``shardex node`` process: data dir, logging, pid file, signals around a ``Node``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from shardex.manager.auto_failover import AutoFailoverSettings
from shardex.meta.state import FileStateStore
from shardex.meta.users import read_admin_file
from shardex.net.loops import loop_kind, new_event_loop
from shardex.net.tcp import TcpTransport
from shardex.node.config import NodeConfig
from shardex.node.debug_dump import install_debug_dump
from shardex.node.server import Node
from shardex.node.state import LOG_FILE, FileMemberStore, load_or_create_identity
from shardex.runtime.files import make_private_dir, require_private
from shardex.runtime.pidfile import InstanceLock, remove_pid, write_pid

log = logging.getLogger("shardex.node")

# How long a clean stop may take before we give up waiting for tasks and exit anyway.
STOP_TIMEOUT = 10.0


def setup_logging(config: NodeConfig) -> None:
    """stderr and ``<data-dir>/node.log``, each line with a timestamp and the node name."""
    fmt = logging.Formatter(
        f"%(asctime)s.%(msecs)03d %(levelname)-7s {config.name} %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
    )
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    stderr = logging.StreamHandler(sys.stderr)
    file = logging.FileHandler(config.data_dir / LOG_FILE, encoding="utf-8")
    for h in (stderr, file):
        h.setFormatter(fmt)
        root.addHandler(h)
    root.setLevel(config.log_level)


def run_node(config: NodeConfig) -> int:
    """Run a node until SIGTERM/SIGINT. Returns the process exit code.

    Raises ``ShardexError`` (e.g. ``ConfigError``) for problems found before serving."""
    data_dir: Path = config.data_dir
    make_private_dir(data_dir)
    require_private(data_dir, "data_dir")
    lock = InstanceLock(data_dir)
    lock.acquire()  # before touching anything else in the dir: one process per data dir
    try:
        setup_logging(config)
        identity, new = load_or_create_identity(data_dir, config.name)
        log.info(
            "starting node %s (pid %d, %s identity %s), data dir %s, heartbeat %.3gs, "
            "failure timeout %.3gs, event loop %s, %s",
            config.name,
            os.getpid(),
            "new" if new else "persisted",
            identity.member_id,
            data_dir,
            config.heartbeat_interval,
            config.failure_timeout,
            loop_kind(),
            f"TLS with {config.tls.cert}" if config.tls else "no TLS",
        )
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(_serve(config, identity.member_id))
    finally:
        remove_pid(data_dir)
        logging.shutdown()  # flush node.log before the lock says "not running"
        lock.release()


async def _serve(config: NodeConfig, member_id: str) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    uninstall_dump = install_debug_dump(loop, config.data_dir)  # kill -USR1: threads, tasks

    node = Node(
        transport=TcpTransport(tls=config.tls),
        secret=config.secret,
        name=config.name,
        member_id=member_id,
        address=config.address,
        advertise=config.advertise,
        services=config.services,
        store=FileMemberStore(config.data_dir),
        seeds=config.seeds,
        heartbeat_interval=config.heartbeat_interval,
        failure_timeout=config.failure_timeout,
        http_port=config.http_port,
        data_dir=config.data_dir,
        state_store=FileStateStore(config.data_dir),
        auto_failover=AutoFailoverSettings(
            enabled=config.auto_failover,
            timeout=config.auto_failover_timeout,
            max_count=config.auto_failover_max_count,
        ),
        group=config.group,
        sql_max_running=config.sql_max_running,
        sql_max_queued=config.sql_max_queued,
        sql_max_fragments=config.sql_max_fragments,
        sql_query_memory=config.sql_query_memory,
        sql_node_memory=config.sql_node_memory,
        sql_spill=config.sql_spill,
        expiry_pager=(config.expiry_pager_interval, config.expiry_pager_batch),
        max_connections=config.max_connections,
        bootstrap_admin=read_admin_file(config.admin_file) if config.admin_file else None,
        tls=config.tls,
    )
    try:
        await node.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await node.stop()
        raise
    # The pid file says "serving": written only once the listener is bound and the services
    # are up, so a waiter that sees it can connect at once (the flock says "running").
    write_pid(config.data_dir)
    log.info(
        "node %s ready on %s, query service on %s://%s:%s",
        config.name,
        node.address,
        "https" if config.tls else "http",
        config.host,
        node.http_port,
    )
    await stop.wait()
    try:
        await asyncio.wait_for(node.stop(), STOP_TIMEOUT)
    except TimeoutError:
        log.error("clean stop took longer than %.0fs; exiting anyway", STOP_TIMEOUT)
        return 1
    finally:
        uninstall_dump()
    return 0
