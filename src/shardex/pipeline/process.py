"""The ``shardex pipeline`` process: files, logging, signals around ``PipelineDriver``.

The driver reaches the cluster one of two ways: a local cluster directory (addresses, node
secret and CA from its files; its home is ``<cluster>/pipeline``), or, on a host of a
multi-host installation, the nodes' addresses, a node secret file and the CA certificate,
with a home directory of its own. A home has at most one pipeline driver: it holds an
exclusive flock on ``<home>/node.lock`` while it runs (the kernel drops it at ``kill -9``)
and writes its pid once serving. Spark checkpoints live in ``<home>/checkpoints`` unless
told otherwise, the log in ``<home>/pipeline.log``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardex.errors import ConfigError
from shardex.meta import cluster_dir as cdir
from shardex.runtime.files import make_private_dir, read_private_text
from shardex.runtime.pidfile import (
    InstanceLock,
    is_locked,
    pid_alive,
    read_pid,
    remove_pid,
    write_pid,
)

__all__ = [
    "PIPELINE_DIR",
    "PipelineSettings",
    "pipeline_dir",
    "pipeline_metrics_url",
    "pipeline_pid",
    "run_pipeline",
]

PIPELINE_DIR = "pipeline"
LOG_FILE = "pipeline.log"
STDOUT_FILE = "stdout.log"
METRICS_URL_FILE = "metrics.url"  # where the running driver serves /metrics

log = logging.getLogger("shardex.pipeline")


@dataclass(frozen=True)
class PipelineSettings:
    """``cluster_dir`` (a local cluster), or ``addresses`` + ``secret_file`` + ``home`` (and
    ``tls_ca`` when the nodes run TLS)."""

    cluster_dir: Path | None = None
    addresses: tuple[str, ...] = ()
    secret_file: Path | None = None  # the node secret: the driver acts as a cluster process
    tls_ca: Path | None = None
    home: Path | None = None
    master: str = "local[2]"
    poll: float = 1.0
    trigger_interval: str = "0 seconds"
    log_level: str = "INFO"
    spark_conf: tuple[tuple[str, str], ...] = ()
    # None: <cluster>/pipeline/checkpoints. Read and written by the driver only (the offset
    # and commit logs), so a local path; on shared storage when the driver may move hosts.
    checkpoint_dir: Path | None = None
    driver_host: str | None = None  # the address executors dial (default $SPARK_LOCAL_IP)
    spark_secret_file: Path | None = None  # spark.authenticate's shared secret
    # The driver's own /metrics (``pipeline/metrics.py``); port 0: any free port, the URL
    # written to <home>/metrics.url either way; None: not served.
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = 0


@dataclass(frozen=True)
class _Target:
    """The cluster as the driver reaches it: resolved from the settings, checked."""

    addresses: tuple[str, ...]
    secret: str = field(repr=False)
    tls_ca: Path | None
    home: Path
    source_options: dict[str, str]  # the change source's options (read on this host)


def _target(settings: PipelineSettings) -> _Target:
    if settings.cluster_dir is not None:
        if settings.addresses or settings.secret_file is not None:
            raise ConfigError(
                "give a cluster directory or the nodes' addresses and secret file, not both",
                details={"hint": "--dir DIR for a local cluster; --addresses for other hosts"},
            )
        path = settings.cluster_dir
        spec = cdir.load(path)
        return _Target(
            tuple(n.address for n in spec.nodes),
            cdir.read_secret(path, spec),
            cdir.tls_ca(path, spec),
            settings.home or pipeline_dir(path),
            {"cluster_dir": str(path)},
        )
    missing = [
        flag
        for flag, value in (
            ("--addresses", settings.addresses),
            ("--secret-file", settings.secret_file),
            ("--home", settings.home),
        )
        if not value
    ]
    if missing:
        raise ConfigError(
            f"without a cluster directory the pipeline needs {', '.join(missing)}",
            details={
                "missing": missing,
                "hint": "--dir DIR for a local cluster, or --addresses HOST:PORT,... "
                "--secret-file FILE --home DIR [--tls-ca ca.pem]",
            },
        )
    assert settings.secret_file is not None and settings.home is not None
    secret_file = settings.secret_file.absolute()
    secret = read_private_text(secret_file, "secret_file", "node secret")
    options = {"addresses": ",".join(settings.addresses), "secret_file": str(secret_file)}
    if settings.tls_ca is not None:
        options["tls_ca"] = str(settings.tls_ca.absolute())
    return _Target(settings.addresses, secret, settings.tls_ca, settings.home, options)


def check_spark_auth(settings: PipelineSettings, cluster_tls: bool) -> None:
    """Executors elsewhere get the node secret inside every task, over Spark's RPC: with a
    cluster that runs TLS, that RPC must be authenticated and encrypted too."""
    from shardex.pipeline.session import is_local_master

    if cluster_tls and settings.spark_secret_file is None and not is_local_master(settings.master):
        raise ConfigError(
            f"the cluster runs TLS but Spark's RPC to {settings.master} would not be "
            "authenticated: read tasks carry the node credential to the executors",
            details={
                "value": settings.master,
                "hint": "give --spark-secret-file (the secret the Spark master and workers "
                "were started with: shardex spark start-master --secret-file)",
            },
        )


def _start_spark(settings: PipelineSettings, conf: dict[str, Any], secret: str | None) -> Any:
    """The driver's SparkSession. A standalone master that is down, unreachable or refuses
    the secret surfaces from Spark as a Java stack trace after its retries: say which."""
    from shardex.pipeline.session import build_spark_session, is_local_master
    from shardex.pipeline.standalone import probe_master

    if settings.master.startswith("spark://"):
        probe_master(settings.master)
    try:
        return build_spark_session(
            settings.master,
            "shardex-pipeline",
            conf,
            ip=settings.driver_host,
            auth_secret=secret,
        )
    except Exception as exc:
        if is_local_master(settings.master):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"cannot start the pipeline's Spark application on {settings.master}: {first}",
            details={
                "value": settings.master,
                "hint": "check that the master runs at that address, that this host "
                "(--driver-host) is reachable from the workers, and that --spark-secret-file "
                "holds the master's secret (see the Spark master's log)",
            },
        ) from None


def pipeline_dir(cluster_dir: Path) -> Path:
    return cluster_dir / PIPELINE_DIR


def pipeline_metrics_url(cluster_dir: Path) -> str | None:
    """The URL of the running driver's /metrics for this local cluster, or None."""
    if pipeline_pid(cluster_dir) is None:
        return None
    path = pipeline_dir(cluster_dir) / METRICS_URL_FILE
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def pipeline_pid(cluster_dir: Path) -> int | None:
    """The pid of the running driver of this cluster, or None."""
    d = pipeline_dir(cluster_dir)
    pid = read_pid(d) if is_locked(d) else None
    return pid if pid is not None and pid_alive(pid) else None


def _setup_logging(path: Path, level: str) -> None:
    handler = logging.FileHandler(path)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s")
    )
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("shardex").setLevel(level.upper())
    # py4j logs every command at DEBUG/INFO: keep it quiet whatever the level.
    logging.getLogger("py4j").setLevel(logging.WARNING)


def run_pipeline(settings: PipelineSettings) -> int:
    """Run the driver in the foreground until SIGTERM/SIGINT. Returns the exit code."""
    from shardex.client import connect
    from shardex.pipeline.driver import PipelineDriver
    from shardex.pipeline.metrics import PipelineMetrics

    target = _target(settings)
    check_spark_auth(settings, target.tls_ca is not None)
    home = target.home
    make_private_dir(home)
    lock = InstanceLock(home, what="pipeline driver")
    lock.acquire()
    try:
        _setup_logging(home / LOG_FILE, settings.log_level)
        log.info("starting the pipeline driver (pid %d), master %s", os.getpid(), settings.master)
        conf: dict[str, Any] = {"spark.local.dir": str(home / "spark-tmp")}
        conf.update(dict(settings.spark_conf))
        spark_secret = None
        if settings.spark_secret_file is not None:
            spark_secret = read_private_text(
                settings.spark_secret_file, "spark_secret_file", "Spark secret"
            )
        # The nodes first: a wrong secret or address fails here, before a JVM starts.
        client = connect(
            list(target.addresses),
            secret=target.secret,
            name="shardex-pipeline",
            tls_ca=target.tls_ca,
        )
        try:
            spark = _start_spark(settings, conf, spark_secret)
        except BaseException:
            client.close()
            raise
        metrics = PipelineMetrics()
        url_file = home / METRICS_URL_FILE
        url_file.unlink(missing_ok=True)
        if settings.metrics_port is not None:
            host, port = metrics.serve(settings.metrics_host, settings.metrics_port)
            url_file.write_text(f"http://{host}:{port}/metrics\n")
            log.info("pipeline metrics at http://%s:%d/metrics", host, port)
        driver = PipelineDriver(
            spark,
            client,
            target.source_options,
            settings.checkpoint_dir or home / "checkpoints",
            poll=settings.poll,
            trigger_interval=settings.trigger_interval,
            metrics=metrics,
        )

        def on_signal(signum: int, _frame: Any) -> None:
            log.info("received %s, stopping", signal.Signals(signum).name)
            driver.stop()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        write_pid(home)
        log.info("pipeline driver ready")
        try:
            driver.run()
        finally:
            client.close()
            spark.stop()
        log.info("pipeline driver stopped")
        return 0
    finally:
        remove_pid(home)
        logging.shutdown()
        lock.release()
