"""A Spark standalone cluster from the pyspark package: the master and worker commands.

``shardex spark start-master`` and ``shardex spark start-worker`` run Spark's own
``Master``/``Worker`` classes through the ``bin/spark-class`` script shipped in the installed
pyspark package (the pip package has the jars and ``spark-class``, not ``sbin/start-*.sh``).
``spark-class`` adds the Java 17 module options Spark needs and honours Spark's usual
variables (``SPARK_DAEMON_MEMORY``, ``SPARK_MASTER_OPTS``, ``SPARK_WORKER_OPTS``), so these
commands only choose the addresses, the directories and the secret, then ``exec`` it: the
process keeps its pid and SIGTERM reaches the JVM. Its output goes to a log file.

Why the variables: ``SPARK_HOME`` is the pyspark package (a worker launches its executors
from it); ``SPARK_LOCAL_IP`` is the address bound (``--host``, default ``$SPARK_LOCAL_IP`` or
loopback); with a secret, Spark's RPC authentication and encryption are on
(``session.auth_conf``, the same pair the driver sets) and the secret travels in
``_SPARK_AUTH_SECRET``, the variable Spark itself uses to hand it to executors, so it never
appears on a command line. See ``docs/deploy.md``, "The index pipeline".
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shardex.errors import ConfigError

__all__ = [
    "MIN_JAVA",
    "DaemonSpec",
    "check_java",
    "daemon_command",
    "daemon_environment",
    "exec_daemon",
    "probe_master",
    "spark_home",
]

MIN_JAVA = 17  # Spark 4 runs on Java 17 or newer
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DEFAULT_DAEMON_MEMORY = "512m"  # the master/worker JVMs themselves (Spark's default: 1g)
AUTH_SECRET_ENV = "_SPARK_AUTH_SECRET"  # Spark's SecurityManager.ENV_AUTH_SECRET
_MASTER_URL = re.compile(r"spark://[^\s/:]+:\d+(,[^\s/:]+:\d+)*")
_MEMORY = re.compile(r"\d+[kmgt]?", re.IGNORECASE)


@dataclass(frozen=True)
class DaemonSpec:
    """One master or worker. ``master_url`` set: a worker of that master."""

    host: str
    port: int
    webui_port: int
    work_dir: Path
    master_url: str | None = None
    cores: int | None = None
    memory: str | None = None  # what the worker's executors may use in all, e.g. "1g"

    @property
    def role(self) -> str:
        return "master" if self.master_url is None else "worker"

    @property
    def log_file(self) -> Path:
        return self.work_dir / f"spark-{self.role}.log"


def spark_home() -> Path:
    """The installed pyspark package, which holds Spark's jars and ``bin/spark-class``."""
    found = importlib.util.find_spec("pyspark")
    if found is None or found.origin is None:
        raise ConfigError(
            "pyspark is not installed in this environment",
            details={"hint": "install shardex with its dependencies (pyspark)"},
        )
    home = Path(found.origin).parent
    if not (home / "bin" / "spark-class").exists() or not (home / "jars").is_dir():
        raise ConfigError(
            f"{home} has no bin/spark-class or jars/: not a complete pyspark package",
            details={"path": str(home), "hint": "reinstall pyspark from PyPI"},
        )
    return home


def check_java(env: Mapping[str, str] | None = None) -> str:
    """The java executable Spark will run (``$JAVA_HOME/bin/java``, else ``java`` on the
    path), checked to be Java ``MIN_JAVA`` or newer; a ConfigError otherwise."""
    env = os.environ if env is None else env
    home = env.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java", path=env.get("PATH"))
    hint = f"Spark needs Java {MIN_JAVA} or newer: install e.g. openjdk-{MIN_JAVA}-jre-headless"
    if java is None or not Path(java).exists():
        where = f"JAVA_HOME={home}" if home else "PATH"
        raise ConfigError(
            f"no Java runtime found (looked in {where})",
            details={"hint": hint + ", or set JAVA_HOME"},
        )
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        ).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run {java}: {exc}", details={"hint": hint}) from None
    major = java_major(out)
    if major is None or major < MIN_JAVA:
        found = out.strip().splitlines()[0] if out.strip() else "no version output"
        raise ConfigError(
            f"{java} is not Java {MIN_JAVA} or newer ({found})",
            details={"java": java, "hint": hint + ", and point JAVA_HOME at it"},
        )
    return java


def java_major(version_output: str) -> int | None:
    """17 from ``openjdk version "17.0.15"``, 8 from ``java version "1.8.0_392"``."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if m is None:
        return None
    first = int(m.group(1))
    return int(m.group(2) or 0) if first == 1 else first


def check_spec(spec: DaemonSpec) -> None:
    for name, port in (("port", spec.port), ("webui-port", spec.webui_port)):
        if not 0 <= port <= 65535:
            raise ConfigError(
                f"--{name} {port} is not a TCP port",
                details={"value": port, "hint": "0-65535 (0: any free port)"},
            )
    if spec.master_url is not None and not _MASTER_URL.fullmatch(spec.master_url):
        raise ConfigError(
            f"{spec.master_url!r} is not a Spark master URL",
            details={"value": spec.master_url, "hint": "spark://HOST:7077"},
        )
    if spec.cores is not None and spec.cores < 1:
        raise ConfigError(f"--cores {spec.cores} must be at least 1", details={"value": spec.cores})
    if spec.memory is not None and not _MEMORY.fullmatch(spec.memory):
        raise ConfigError(
            f"--memory {spec.memory!r} is not a memory size",
            details={"value": spec.memory, "hint": "e.g. 1g or 512m"},
        )


def probe_master(url: str, timeout: float = 5.0) -> None:
    """A TCP connection to one of the master's addresses, before Spark tries: a master that
    is down or behind a wrong address is a clear error in seconds, not a Java stack trace
    after Spark's minute of registration retries. (A wrong secret still takes that minute:
    the master drops unauthenticated connections without a word.)"""
    import socket

    if not _MASTER_URL.fullmatch(url):
        raise ConfigError(
            f"{url!r} is not a Spark master URL",
            details={"value": url, "hint": "spark://HOST:7077 (or local[N] for no cluster)"},
        )
    errors = []
    for hostport in url.removeprefix("spark://").split(","):
        host, _, port = hostport.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
            return
        except OSError as exc:
            errors.append(f"{hostport}: {exc.strerror or exc}")
    raise ConfigError(
        f"cannot reach the Spark master {url} ({'; '.join(errors)})",
        details={
            "value": url,
            "hint": "start it (shardex spark start-master) or fix the address; "
            "check the firewall between this host and the master",
        },
    )


def daemon_command(spec: DaemonSpec, home: Path) -> list[str]:
    check_spec(spec)
    cls = MASTER_CLASS if spec.master_url is None else WORKER_CLASS
    cmd = [str(home / "bin" / "spark-class"), cls, "--host", spec.host, "--port", str(spec.port)]
    cmd += ["--webui-port", str(spec.webui_port)]
    if spec.master_url is not None:
        cmd += ["--work-dir", str(spec.work_dir)]
        if spec.cores is not None:
            cmd += ["--cores", str(spec.cores)]
        if spec.memory is not None:
            cmd += ["--memory", spec.memory]
        cmd.append(spec.master_url)
    return cmd


def daemon_environment(
    spec: DaemonSpec, home: Path, secret: str | None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The JVM's environment: ``base`` (default this process's) plus Spark's variables."""
    from shardex.pipeline.session import auth_conf

    env = dict(os.environ if base is None else base)
    env["SPARK_HOME"] = str(home)
    env["SPARK_LOCAL_IP"] = spec.host
    env.setdefault("SPARK_DAEMON_MEMORY", DEFAULT_DAEMON_MEMORY)
    # Executors run the driver's PYSPARK_PYTHON; this one is the worker's own interpreter,
    # for what Spark starts from the worker itself.
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.pop(AUTH_SECRET_ENV, None)
    # The master's REST submission server takes jobs without Spark's authentication: off.
    props = {"spark.master.rest.enabled": "false"} if spec.master_url is None else {}
    if secret is not None:
        props.update(auth_conf())
        env[AUTH_SECRET_ENV] = secret
    if props:
        opts_key = "SPARK_MASTER_OPTS" if spec.master_url is None else "SPARK_WORKER_OPTS"
        flags = " ".join(f"-D{k}={v}" for k, v in props.items())
        env[opts_key] = f"{env.get(opts_key, '')} {flags}".strip()
    return env


def exec_daemon(spec: DaemonSpec, secret: str | None) -> None:
    """Replace this process by the master or worker JVM, its output appended to
    ``spec.log_file``. Returns only by raising (a ConfigError before the exec)."""
    home = spark_home()
    cmd = daemon_command(spec, home)
    env = daemon_environment(spec, home, secret)
    check_java(env)
    spec.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(spec.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.chdir(spec.work_dir)
    os.execve(cmd[0], cmd, env)
