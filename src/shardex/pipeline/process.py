"""The ``shardex pipeline`` process: files, logging, signals around ``PipelineDriver``.

A cluster directory has at most one pipeline driver: it holds an exclusive flock on
``<cluster>/pipeline/node.lock`` while it runs (the kernel drops it at ``kill -9``) and
writes its pid once serving. Spark checkpoints live in ``<cluster>/pipeline/checkpoints``,
the log in ``<cluster>/pipeline/pipeline.log``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardex.meta import cluster_dir as cdir
from shardex.runtime.pidfile import (
    InstanceLock,
    is_locked,
    pid_alive,
    read_pid,
    remove_pid,
    write_pid,
)

__all__ = ["PIPELINE_DIR", "PipelineSettings", "pipeline_dir", "pipeline_pid", "run_pipeline"]

PIPELINE_DIR = "pipeline"
LOG_FILE = "pipeline.log"
STDOUT_FILE = "stdout.log"

log = logging.getLogger("shardex.pipeline")


@dataclass(frozen=True)
class PipelineSettings:
    cluster_dir: Path
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


def pipeline_dir(cluster_dir: Path) -> Path:
    return cluster_dir / PIPELINE_DIR


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
    from shardex.pipeline.session import build_spark_session

    cluster_dir = settings.cluster_dir
    spec = cdir.load(cluster_dir)
    secret = cdir.read_secret(cluster_dir, spec)
    home = pipeline_dir(cluster_dir)
    home.mkdir(parents=True, exist_ok=True)
    lock = InstanceLock(home, what="pipeline driver")
    lock.acquire()
    try:
        _setup_logging(home / LOG_FILE, settings.log_level)
        log.info("starting the pipeline driver (pid %d), master %s", os.getpid(), settings.master)
        conf: dict[str, Any] = {"spark.local.dir": str(home / "spark-tmp")}
        conf.update(dict(settings.spark_conf))
        from shardex.pipeline.session import read_secret_file

        spark_secret = None
        if settings.spark_secret_file is not None:
            spark_secret = read_secret_file(settings.spark_secret_file)
        spark = build_spark_session(
            settings.master,
            "shardex-pipeline",
            conf,
            ip=settings.driver_host,
            auth_secret=spark_secret,
        )
        client = connect(
            [n.address for n in spec.nodes],
            secret=secret,
            name="shardex-pipeline",
            tls_ca=cdir.tls_ca(cluster_dir, spec),
        )
        driver = PipelineDriver(
            spark,
            client,
            {"cluster_dir": str(cluster_dir)},
            settings.checkpoint_dir or home / "checkpoints",
            poll=settings.poll,
            trigger_interval=settings.trigger_interval,
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
