"""A Spark standalone cluster on ``Hosts``: the master on one host, a worker on another, both
started with ``shardex spark start-master/start-worker`` and Spark's RPC authentication on
(one shared secret file), and the pipeline driver (``shardex pipeline --master spark://``)
on a host of its choosing."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Sequence
from pathlib import Path

from shardex.runtime.files import atomic_write_bytes, make_private_dir
from shardex.testing.hosts.netns import Hosts
from shardex.testing.procs import CLI, proc_env, wait_for

MASTER_PORT = 7077


class SparkOnHosts:
    def __init__(self, hosts: Hosts, root: Path, master_host: int, worker_host: int) -> None:
        self.hosts = hosts
        self.root = root
        self.master_host = master_host
        self.worker_host = worker_host
        make_private_dir(root)
        self.secret_file = root / "spark-secret"
        atomic_write_bytes(self.secret_file, secrets.token_hex(32).encode(), mode=0o600)
        self.master_dir = root / "master"
        self.worker_dir = root / "worker"

    @property
    def master_url(self) -> str:
        return f"spark://{self.hosts.host(self.master_host).ip}:{MASTER_PORT}"

    def start(self, timeout: float = 180.0) -> None:
        """The master, then the worker; returns once the master has registered the worker."""
        m_ip = self.hosts.host(self.master_host).ip
        w_ip = self.hosts.host(self.worker_host).ip
        common = ["--webui-port", "0", "--secret-file", str(self.secret_file)]
        master = ["spark", "start-master", "--host", m_ip, "--port", str(MASTER_PORT)]
        master += ["--work-dir", str(self.master_dir), *common]
        self._spawn(self.master_host, master, "master.out")
        worker = ["spark", "start-worker", self.master_url, "--host", w_ip, "--cores", "2"]
        worker += ["--memory", "2g", "--work-dir", str(self.worker_dir), *common]
        self._spawn(self.worker_host, worker, "worker.out")
        log = self.master_dir / "spark-master.log"
        wait_for(
            lambda: log.exists() and f"Registering worker {w_ip}:" in log.read_text(),
            timeout,
            interval=0.5,
            what=f"the Spark master to register the worker at {w_ip}\n{self.log_tails()}",
        )

    def _spawn(self, host: int, args: Sequence[str], out: str) -> subprocess.Popen[bytes]:
        return self.hosts.spawn(host, [*CLI, *args], env=proc_env(), log=self.root / out)

    def start_pipeline(
        self,
        host: int,
        addresses: Sequence[str],
        node_secret: Path,
        tls_ca: Path | None,
        *,
        master: str | None = None,
        home: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """The pipeline driver on ``host``: its executors on the worker (``master`` None),
        or wherever ``master`` says (``local[2]``: in the driver's process). Its lock, log
        and checkpoints in ``home`` (default ``<root>/pipeline``)."""
        home = home or self.root / "pipeline"
        argv = ["pipeline", "--master", master or self.master_url]
        argv += ["--addresses", ",".join(addresses)]
        argv += ["--secret-file", str(node_secret), "--home", str(home)]
        argv += ["--driver-host", self.hosts.host(host).ip]
        if master is None:
            argv += ["--spark-secret-file", str(self.secret_file)]
        if tls_ca is not None:
            argv += ["--tls-ca", str(tls_ca)]
        return self._spawn(host, argv, f"{home.name}.out")

    def executor_logs(self) -> list[Path]:
        """The stderr of every executor the worker ran (``<work-dir>/<app>/<id>/stderr``)."""
        return sorted(self.worker_dir.glob("app-*/*/stderr"))

    def log_tails(self, lines: int = 30) -> str:
        files = [self.root / n for n in ("master.out", "worker.out", "pipeline.out")]
        files += [self.master_dir / "spark-master.log", self.worker_dir / "spark-worker.log"]
        files += [self.root / "pipeline" / "pipeline.log", *self.executor_logs()]
        parts = []
        for f in files:
            if f.exists():
                tail = f.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {f}\n" + "\n".join(tail))
        return "\n".join(parts)
