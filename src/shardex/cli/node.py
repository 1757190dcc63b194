"""``shardex node``: run one server process in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardex.cli.common import fail
from shardex.errors import ShardexError

_HELP = """Run one shardex node (foreground; stop with SIGTERM or Ctrl-C).

Configuration comes from --config FILE (TOML) and these flags, which override the file.
Without --seed the node founds a new cluster (or resumes the one in its data dir)."""


def node(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML config file.", dir_okay=False)
    ] = None,
    name: Annotated[str | None, typer.Option(help="Node name, unique in the cluster.")] = None,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="Data directory (created if absent).")
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(help="Interface to listen on (default 127.0.0.1; 0.0.0.0 for all)."),
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(help="Host other nodes and clients dial (default: --host; never 0.0.0.0)."),
    ] = None,
    port: Annotated[int | None, typer.Option(help="Cluster protocol port (default 7100).")] = None,
    http_port: Annotated[
        str | None,
        typer.Option(
            "--http-port",
            help="N1QL query service port (default: port + 1000; 0: a free one; off: none).",
        ),
    ] = None,
    services: Annotated[
        str | None,
        typer.Option(help="Comma-separated services: data,index,query,manager (default all)."),
    ] = None,
    seed: Annotated[
        list[str] | None,
        typer.Option(help="host:port of a node to join through; repeatable. None: found."),
    ] = None,
    secret: Annotated[
        str | None,
        typer.Option(
            envvar="SHARDEX_SECRET",
            help="Cluster secret (visible in ps: prefer --secret-file or $SHARDEX_SECRET).",
            show_envvar=True,
        ),
    ] = None,
    secret_file: Annotated[
        Path | None, typer.Option("--secret-file", help="File holding the cluster secret.")
    ] = None,
    log_level: Annotated[
        str | None, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR.")
    ] = None,
    heartbeat_interval: Annotated[
        float | None, typer.Option("--heartbeat-interval", help="Seconds (default 0.5).")
    ] = None,
    failure_timeout: Annotated[
        float | None,
        typer.Option("--failure-timeout", help="Seconds without heartbeat => down (default 3)."),
    ] = None,
    tls: Annotated[
        str | None,
        typer.Option(
            help="TLS on every connection: auto (on when the node binds a non-loopback "
            "host), on, off."
        ),
    ] = None,
    tls_dir: Annotated[
        Path | None,
        typer.Option(
            "--tls-dir",
            help="Certificate directory made by `shardex cluster certs` (ca.pem, "
            "nodes/NAME.pem, nodes/NAME.key).",
        ),
    ] = None,
    tls_ca: Annotated[
        Path | None, typer.Option("--tls-ca", help="The cluster CA's certificate (PEM).")
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", help="This node's certificate (PEM).")
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", help="This node's private key (PEM, 0600).")
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            help="Server group label (rack, zone): a partition's replicas go to distinct groups."
        ),
    ] = None,
    sql_node_memory: Annotated[
        str | None,
        typer.Option(
            "--sql-node-memory",
            help="Bytes all running SQL statements may hold together on this node, e.g. "
            "4GiB (default: a quarter of RAM).",
        ),
    ] = None,
    admin_file: Annotated[
        Path | None,
        typer.Option(
            "--admin-file",
            help="The first admin user's keys (JSON, as `shardex cluster start` writes "
            "admin.json): committed when the cluster has no user yet.",
        ),
    ] = None,
) -> None:
    # Imported here so `shardex --help` and other commands stay fast.
    from shardex.node.config import load_config
    from shardex.node.process import run_node

    overrides = {
        "name": name,
        "data_dir": str(data_dir) if data_dir is not None else None,
        "host": host,
        "advertise": advertise,
        "port": port,
        "http_port": http_port,
        "services": services,
        "seed": seed or None,
        "secret": secret,
        "secret_file": str(secret_file) if secret_file is not None else None,
        "log_level": log_level,
        "heartbeat_interval": heartbeat_interval,
        "failure_timeout": failure_timeout,
        "group": group,
        "admin_file": str(admin_file) if admin_file is not None else None,
        "sql_node_memory": sql_node_memory,
        "tls": tls,
        "tls_dir": str(tls_dir) if tls_dir is not None else None,
        "tls_ca": str(tls_ca) if tls_ca is not None else None,
        "tls_cert": str(tls_cert) if tls_cert is not None else None,
        "tls_key": str(tls_key) if tls_key is not None else None,
    }
    if secret is not None and secret_file is not None:
        # An environment secret plus an explicit file: the explicit flag wins.
        overrides["secret"] = None
    try:
        cfg = load_config(config, overrides)
        code = run_node(cfg)
    except ShardexError as e:
        fail(e)
    raise typer.Exit(code)


node.__doc__ = _HELP


# ``python -m shardex.cli.node ...`` == ``shardex node ...``: the local cluster CLI starts nodes
# this way, with the same interpreter as itself, so it never depends on where (or whether) the
# ``shardex`` script is on PATH. One command: typer runs it without a subcommand name; no
# locals in tracebacks (the secret).
if __name__ == "__main__":
    _app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
    _app.command(help=node.__doc__)(node)
    _app()
