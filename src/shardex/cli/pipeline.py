"""``shardex pipeline``: run the index pipeline's Spark driver in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardex.cli.common import err, fail
from shardex.errors import ConfigError, ShardexError


def pipeline(
    cluster_dir: Annotated[
        Path | None,
        typer.Option("--dir", "-d", help="A local cluster's directory.", file_okay=False),
    ] = None,
    addresses: Annotated[
        str | None,
        typer.Option("--addresses", help="Nodes' addresses HOST:PORT,... (instead of --dir)."),
    ] = None,
    secret_file: Annotated[
        Path | None,
        typer.Option("--secret-file", help="The node secret (mode 0600), with --addresses."),
    ] = None,
    tls_ca: Annotated[
        Path | None,
        typer.Option("--tls-ca", help="The cluster CA certificate, when the nodes run TLS."),
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option(
            "--home",
            help="The driver's directory: lock, log, checkpoints (default <dir>/pipeline).",
            file_okay=False,
        ),
    ] = None,
    master: Annotated[
        str, typer.Option(help="Spark master URL (local[N], spark://..., ...).")
    ] = "local[2]",
    poll: Annotated[float, typer.Option(help="Seconds between reads of the index states.")] = 1.0,
    trigger: Annotated[
        str, typer.Option(help="Micro-batch trigger interval (Spark syntax).")
    ] = "0 seconds",
    log_level: Annotated[str, typer.Option("--log-level", help="shardex log level.")] = "INFO",
    checkpoint_dir: Annotated[
        Path | None,
        typer.Option(
            "--checkpoint-dir",
            help="Spark checkpoints (default <dir>/pipeline/checkpoints); a local path.",
            file_okay=False,
        ),
    ] = None,
    driver_host: Annotated[
        str | None,
        typer.Option("--driver-host", help="Address executors reach the driver at."),
    ] = None,
    spark_secret_file: Annotated[
        Path | None,
        typer.Option("--spark-secret-file", help="spark.authenticate secret (mode 0600)."),
    ] = None,
    conf: Annotated[
        list[str] | None,
        typer.Option("--conf", help="Extra Spark setting KEY=VALUE (repeatable)."),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="Address the driver's /metrics binds.")
    ] = "127.0.0.1",
    metrics_port: Annotated[
        int,
        typer.Option(
            "--metrics-port",
            help="Port of the driver's /metrics (0: any free port, see <home>/metrics.url; "
            "-1: none).",
            min=-1,
            max=65535,
        ),
    ] = 0,
) -> None:
    """Run the index pipeline (initial builds and continuous maintenance) until SIGTERM or
    Ctrl-C, for a local cluster (--dir) or for nodes on other hosts (--addresses,
    --secret-file, --home, --tls-ca). Logs go to <home>/pipeline.log."""
    from shardex.meta import cluster_dir as cdir
    from shardex.pipeline.process import PipelineSettings, run_pipeline

    try:
        if cluster_dir is not None and not cdir.exists(cluster_dir):
            raise ConfigError(
                f"{cluster_dir} is not a cluster directory",
                details={"hint": "create one with: shardex cluster start --dir DIR"},
            )
        pairs = []
        for item in conf or []:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(
                    f"--conf {item!r} is not KEY=VALUE",
                    details={"value": item, "hint": "e.g. --conf spark.driver.memory=2g"},
                )
            pairs.append((key.strip(), value.strip()))
        nodes = tuple(a.strip() for a in (addresses or "").split(",") if a.strip())
        settings = PipelineSettings(
            cluster_dir=cluster_dir,
            addresses=tuple(_checked(a) for a in nodes),
            secret_file=secret_file,
            tls_ca=tls_ca,
            home=None if home is None else home.absolute(),
            master=master,
            poll=poll,
            trigger_interval=trigger,
            log_level=log_level,
            spark_conf=tuple(pairs),
            checkpoint_dir=None if checkpoint_dir is None else checkpoint_dir.absolute(),
            driver_host=driver_host,
            spark_secret_file=spark_secret_file,
            metrics_host=metrics_host,
            metrics_port=None if metrics_port < 0 else metrics_port,
        )
        where = cluster_dir if cluster_dir is not None else ",".join(nodes)
        err.print(f"pipeline driver for {where} (master {master}); Ctrl-C stops it")
        raise typer.Exit(run_pipeline(settings))
    except ShardexError as e:
        fail(e)


def _checked(address: str) -> str:
    """``--addresses`` entries are checked here, before Spark starts for a typo."""
    from shardex.net.transport import split_address

    host, port = split_address(address)
    return f"{host}:{port}"
