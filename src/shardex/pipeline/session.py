"""One way to build the SparkSession: for tests, the ``shardex pipeline`` driver and benchmarks.

Everything here was measured on the 2-core development machine (see
``docs/decisions/0035-spark-session-settings.md``). The settings and why:

* One address: ``SPARK_LOCAL_IP`` and ``spark.driver.host``/``bindAddress`` = ``local_ip``,
  by default ``$SPARK_LOCAL_IP`` or else 127.0.0.1 (loopback unless told otherwise: nothing
  may listen on or resolve another interface, and without them Spark spends seconds on a
  reverse lookup of the host name). With executors on other hosts (a ``spark://`` master)
  it is the address they dial the driver at.
* ``PYSPARK_PYTHON`` = this interpreter behind a small wrapper (``python_worker_wrapper``),
  so workers import pyarrow and shardex from the same virtual environment (the system Python
  has neither). The wrapper drops Spark's ``pyspark.zip``/``py4j-*.zip`` from ``PYTHONPATH``
  when the installed pyspark is the same version: imports from a zip are compiled on every
  start (no ``.pyc`` cache), which made each Python worker start cost 2.7 CPU-s instead of
  1.1 (measured); the first Spark job of a session starts several of them. The wrapper is a
  file of this host, so with any other master the executors run ``$PYSPARK_PYTHON`` if set,
  else this interpreter's path: the project's environment must sit at that path on every
  worker host (``docs/deploy.md``, "The index pipeline").
* ``auth_secret`` (a Spark standalone cluster that authenticates): ``spark.authenticate``
  and ``spark.network.crypto.enabled`` on; the secret reaches the JVM in a private
  properties file removed once the session runs, never on the ``spark-submit`` command
  line that PySpark builds from the session's settings (which ``ps`` shows every user).
* The driver JVM gets ``-XX:+UseSerialGC -XX:TieredStopAtLevel=1``: C1 only and the serial
  collector start faster on two cores; the pipeline's JVM work is small (Arrow batches are
  made and consumed in Python).
* Checkpoints on the raw local file system, renamed without forking a shell, 20 batches
  retained (see ``DEFAULT_CONF``).
* UI off, console progress bar off, 2 shuffle partitions: a micro-batch of a few hundred rows
  must not pay for 200 shuffle tasks or a web server.
* Python workers are reused across tasks (the default, stated explicitly): the change source
  caches its data-service client per worker process, which only pays off when they live on.

The session builder's JVM options only take effect when this call starts the JVM: if a
session already runs in the process, ``getOrCreate`` returns it (with the SQL options of
``conf_overrides`` applied, the launch options ignored).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOOPBACK = "127.0.0.1"
DRIVER_JAVA_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"

DEFAULT_CONF: dict[str, str] = {
    "spark.driver.extraJavaOptions": DRIVER_JAVA_OPTIONS,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # A Python worker must connect back within this; the default 15 s is exceeded when a
    # loaded 2-core machine starts one (imports of pyspark, pyarrow and pandas), which kills
    # the streaming query ("Python worker failed to connect back").
    "spark.python.authenticate.socketTimeout": "120s",
    # Nothing of ours uses Hive; the in-memory catalog avoids Derby files in the cwd.
    "spark.sql.catalogImplementation": "in-memory",
    # Checkpoint writes (the offset log before a micro-batch, the commit log after it) are
    # most of an empty batch's time. The raw local file system writes no .crc side file
    # (one file and one rename less per log entry): walCommit + commitOffsets went from
    # 455-580 ms to 225-240 ms per batch in the same run (load 15-20). Neither variant
    # fsyncs, so nothing is lost that the checksummed one kept.
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
    # The default checkpoint file manager renames through Hadoop's FileContext, whose
    # RawLocalFs rename asks for each path's link status, and without the native Hadoop
    # library that forks a `readlink` shell from the (3 GB) driver JVM: two forks per log
    # entry. The FileSystem-based manager renames with java.io.File.renameTo (after its own
    # exists check; there is one writer per checkpoint). Measured on an idle machine with a
    # JVM-only source: walCommit 41 -> 10 ms, commitOffsets 38 -> 9 ms; under load the fork
    # cost grows with the run queue.
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
    # Old offset/commit log entries are purged after every batch by listing the directory;
    # the pipeline reads only the current and previous entries.
    "spark.sql.streaming.minBatchesToRetain": "20",
}


# The worker wrapper: keep every PYTHONPATH entry but Spark's own zips, then run the venv's
# interpreter. Only used when the installed pyspark is importable without the zips.
_WRAPPER = """#!/bin/sh
# Written by shardex.pipeline.session: runs PySpark workers without Spark's zips on
# PYTHONPATH (the installed pyspark and py4j are the same code, with cached bytecode).
PYTHONPATH=$(printf '%s' "$PYTHONPATH" | tr ':' '\\n' | grep -v -e '/pyspark\\.zip$' \\
    -e '/py4j-[^/]*\\.zip$' | paste -sd: -)
export PYTHONPATH
exec {python} "$@"
"""


def python_worker_wrapper(python: str = sys.executable) -> str:
    """The path of an executable that runs ``python`` for Spark's Python workers with the
    zips dropped from ``PYTHONPATH`` (written once per interpreter into the temp dir; the
    name carries a hash of its text, so a stale one is never reused). Falls back to
    ``python`` itself when the file cannot be written."""
    text = _WRAPPER.format(python=python)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"shardex-pyspark-python-{os.getuid()}-{digest}"
    try:
        if not path.exists():
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.chmod(0o755)
            tmp.replace(path)
    except OSError:
        return python
    return str(path)


def local_ip(given: str | None = None) -> str:
    """The address Spark binds and advertises: ``given``, else ``$SPARK_LOCAL_IP``, else
    loopback."""
    return given or os.environ.get("SPARK_LOCAL_IP") or LOOPBACK


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def spark_environment(master: str = "local[2]", ip: str | None = None) -> dict[str, str]:
    """The environment variables Spark must see before its JVM starts (set by
    ``build_spark_session``; exposed for ``spark-submit`` wrappers). The worker wrapper is a
    local file, so only ``local`` masters (workers on this host) get it; executors elsewhere
    run ``$PYSPARK_PYTHON`` when it is set, else this interpreter's path."""
    if is_local_master(master):
        python = python_worker_wrapper()
    else:
        python = os.environ.get("PYSPARK_PYTHON") or sys.executable
    return {
        "SPARK_LOCAL_IP": local_ip(ip),
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def auth_conf(enabled: bool = True) -> dict[str, str]:
    """Spark's RPC authentication (a shared secret, a challenge on every connection) and
    the AES encryption that comes with it. Master, workers and driver must agree on both:
    ``shardex spark start-master/start-worker`` set the same pair."""
    value = "true" if enabled else "false"
    return {"spark.authenticate": value, "spark.network.crypto.enabled": value}


def build_spark_session(
    master: str = "local[2]",
    app_name: str = "shardex",
    conf_overrides: Mapping[str, Any] | None = None,
    *,
    register_source: bool = True,
    ip: str | None = None,
    auth_secret: str | None = None,
) -> SparkSession:
    """Start (or return the running) SparkSession with shardex's settings.

    ``conf_overrides`` win over the defaults (values are stringified). With
    ``register_source`` the change-stream data source is registered as ``"shardex"``, so
    ``spark.read.format("shardex")`` and ``spark.readStream.format("shardex")`` work.
    ``ip``: the driver's address (default ``local_ip()``); ``auth_secret``: Spark's RPC
    secret (``spark.authenticate``), shared with the standalone master and workers."""
    env = spark_environment(master, ip)
    os.environ.update(env)
    from pyspark.sql import SparkSession

    conf = dict(DEFAULT_CONF)
    conf["spark.driver.host"] = conf["spark.driver.bindAddress"] = env["SPARK_LOCAL_IP"]
    if auth_secret is not None:
        conf.update(auth_conf())
    for key, value in (conf_overrides or {}).items():
        conf[key] = _conf_value(value)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    with _secret_properties(auth_secret):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if register_source:
        from shardex.pipeline.source.datasource import ShardexChangeSource

        spark.dataSource.register(ShardexChangeSource)
    return spark


@contextlib.contextmanager
def _secret_properties(secret: str | None) -> Iterator[None]:
    """While the session starts: ``spark.authenticate.secret`` in a properties file only
    this user can read, handed to ``spark-submit`` through ``PYSPARK_SUBMIT_ARGS``. Spark
    reads secrets from files only on Kubernetes, and PySpark passes every session setting
    as a ``--conf`` argument (visible in ``ps``); the file is gone once the JVM read it."""
    if secret is None:
        yield
        return
    if "PYSPARK_SUBMIT_ARGS" in os.environ:
        from shardex.errors import ConfigError

        raise ConfigError(
            "PYSPARK_SUBMIT_ARGS is set: the Spark secret cannot be passed beside it",
            details={"hint": "unset PYSPARK_SUBMIT_ARGS (pass Spark settings with --conf)"},
        )
    with tempfile.TemporaryDirectory(prefix="shardex-spark-") as tmp:  # mode 0700
        path = Path(tmp) / "secret.properties"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            # Java properties: a backslash escapes; the secret is printable ASCII.
            f.write("spark.authenticate.secret=" + secret.replace("\\", "\\\\") + "\n")
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {path} pyspark-shell"
        try:
            yield
        finally:
            del os.environ["PYSPARK_SUBMIT_ARGS"]


def _conf_value(value: Any) -> str:
    """Spark reads booleans as ``true``/``false``; Python's ``str(True)`` is ``True``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
