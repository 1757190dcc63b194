"""The Spark standalone pieces that need no JVM: the master/worker command lines and
environments, the driver's target (a cluster directory or the nodes' addresses), and the one
picklable value read tasks connect with (values only, no path of the driver's)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from shardex.errors import ConfigError
from shardex.net.certs import make_ca
from shardex.pipeline.process import PipelineSettings, _target, check_spark_auth
from shardex.pipeline.session import auth_conf, spark_environment
from shardex.pipeline.source.options import SourceOptions
from shardex.pipeline.standalone import (
    AUTH_SECRET_ENV,
    DaemonSpec,
    check_spec,
    daemon_command,
    daemon_environment,
    java_major,
    probe_master,
)
from shardex.runtime.files import read_private_text

HOME = Path("/opt/pyspark")


def _master(tmp_path: Path, **kw: object) -> DaemonSpec:
    return DaemonSpec(host="10.0.0.4", port=7077, webui_port=0, work_dir=tmp_path, **kw)  # type: ignore[arg-type]


def test_master_and_worker_commands(tmp_path: Path) -> None:
    cmd = daemon_command(_master(tmp_path), HOME)
    assert cmd[:2] == [str(HOME / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master"]
    assert cmd[2:] == ["--host", "10.0.0.4", "--port", "7077", "--webui-port", "0"]
    worker = _master(tmp_path, master_url="spark://10.0.0.4:7077", cores=2, memory="2g")
    cmd = daemon_command(worker, HOME)
    assert cmd[1] == "org.apache.spark.deploy.worker.Worker"
    assert cmd[-1] == "spark://10.0.0.4:7077"
    assert cmd[cmd.index("--cores") : cmd.index("--cores") + 2] == ["--cores", "2"]
    assert ["--work-dir", str(tmp_path)] == cmd[
        cmd.index("--work-dir") : cmd.index("--work-dir") + 2
    ]


@pytest.mark.parametrize(
    "kw, fragment",
    [
        ({"port": 70000}, "--port 70000"),
        ({"master_url": "http://m:7077"}, "not a Spark master URL"),
        ({"master_url": "spark://m:7077", "cores": 0}, "--cores 0"),
        ({"master_url": "spark://m:7077", "memory": "lots"}, "not a memory size"),
    ],
)
def test_bad_daemon_settings_are_refused(tmp_path: Path, kw: dict, fragment: str) -> None:
    base = {"host": "h", "port": 7077, "webui_port": 0, "work_dir": tmp_path}
    with pytest.raises(ConfigError, match=fragment):
        check_spec(DaemonSpec(**{**base, **kw}))


def test_secret_reaches_the_jvm_by_environment_only(tmp_path: Path) -> None:
    """The secret is in Spark's own variable, never in an option ``ps`` shows; the flags
    are the driver's (``auth_conf``), so both sides agree."""
    env = daemon_environment(_master(tmp_path), HOME, "s3cret", base={"PATH": "/bin"})
    assert env[AUTH_SECRET_ENV] == "s3cret"
    opts = env["SPARK_MASTER_OPTS"]
    assert "s3cret" not in opts
    for key, value in auth_conf().items():
        assert f"-D{key}={value}" in opts
    assert "-Dspark.master.rest.enabled=false" in opts  # unauthenticated submissions: off
    assert env["SPARK_LOCAL_IP"] == "10.0.0.4" and env["SPARK_HOME"] == str(HOME)
    # Without a secret: no authentication flag, and a stray secret variable is dropped.
    worker = _master(tmp_path, master_url="spark://10.0.0.4:7077")
    env = daemon_environment(worker, HOME, None, base={AUTH_SECRET_ENV: "old"})
    assert AUTH_SECRET_ENV not in env and "SPARK_WORKER_OPTS" not in env


def test_java_versions() -> None:
    assert java_major('openjdk version "17.0.15" 2025-04-15') == 17
    assert java_major('java version "1.8.0_392"') == 8
    assert java_major("no java here") is None


def test_executors_elsewhere_run_this_interpreter_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local worker wrapper is a file of this host: a standalone master gets the
    interpreter's own path (or ``$PYSPARK_PYTHON``), and the driver's given address."""
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    env = spark_environment("spark://m:7077", "10.0.0.4")
    import sys

    assert env["PYSPARK_PYTHON"] == sys.executable and env["SPARK_LOCAL_IP"] == "10.0.0.4"
    monkeypatch.setenv("PYSPARK_PYTHON", "/srv/shardex/bin/python")
    assert spark_environment("spark://m:7077")["PYSPARK_PYTHON"] == "/srv/shardex/bin/python"


def _secret(tmp_path: Path, text: str = "node-secret-1", mode: int = 0o600) -> Path:
    path = tmp_path / "secret"
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_private_text_files(tmp_path: Path) -> None:
    assert read_private_text(_secret(tmp_path), "secret_file", "node secret") == "node-secret-1"
    with pytest.raises(ConfigError, match="0644"):
        read_private_text(_secret(tmp_path, mode=0o644), "secret_file", "node secret")
    with pytest.raises(ConfigError, match="is empty"):
        read_private_text(_secret(tmp_path, text="  "), "secret_file", "node secret")
    with pytest.raises(ConfigError, match="cannot read"):
        read_private_text(tmp_path / "missing", "secret_file", "node secret")


def test_driver_target_without_a_cluster_directory(tmp_path: Path) -> None:
    secret = _secret(tmp_path)
    with pytest.raises(ConfigError, match="--secret-file, --home"):
        _target(PipelineSettings(addresses=("10.0.0.1:7100",)))
    with pytest.raises(ConfigError, match="not both"):
        _target(PipelineSettings(cluster_dir=tmp_path, addresses=("a:1",), secret_file=secret))
    t = _target(
        PipelineSettings(addresses=("10.0.0.1:7100",), secret_file=secret, home=tmp_path / "h")
    )
    assert t.secret == "node-secret-1" and t.home == tmp_path / "h"
    assert t.source_options == {"addresses": "10.0.0.1:7100", "secret_file": str(secret)}
    assert "node-secret-1" not in repr(t)


def test_read_tasks_carry_values_not_the_drivers_paths(tmp_path: Path) -> None:
    """Options are parsed on the driver's host; what a task unpickles on an executor holds
    the secret and the CA's PEM text, and no path of the driver's files."""
    certs = tmp_path / "driver-only"
    make_ca(certs)
    secret = _secret(certs)
    opts = SourceOptions.parse(
        {
            "keyspace": "k",
            "addresses": "10.0.0.1:7100",
            "secret_file": str(secret),
            "tls_ca": str(certs / "ca.pem"),
        }
    )
    access = opts.endpoint.access
    assert access.secret == "node-secret-1"
    assert access.tls_ca_pem == (certs / "ca.pem").read_text()
    blob = pickle.dumps(opts)
    assert str(certs).encode() not in blob
    assert pickle.loads(blob).endpoint.access == access
    assert "node-secret-1" not in repr(opts) and "BEGIN CERTIFICATE" not in repr(opts)
    with pytest.raises(ConfigError, match="holds no PEM certificate"):
        SourceOptions.parse(
            {"keyspace": "k", "addresses": "a:1", "secret": "x", "tls_ca": str(secret)}
        )


def test_a_tls_cluster_needs_spark_authentication_off_local_masters(tmp_path: Path) -> None:
    remote = PipelineSettings(master="spark://10.0.0.4:7077")
    with pytest.raises(ConfigError, match="would not be authenticated"):
        check_spark_auth(remote, cluster_tls=True)
    check_spark_auth(remote, cluster_tls=False)  # a plaintext cluster: the same trust as its wire
    check_spark_auth(PipelineSettings(master="local[2]"), cluster_tls=True)
    with_secret = PipelineSettings(master="spark://m:7077", spark_secret_file=tmp_path / "s")
    check_spark_auth(with_secret, cluster_tls=True)


def test_an_unreachable_master_is_named_before_spark_starts() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot reach the Spark master .*127.0.0.1:{port}"):
            probe_master(f"spark://127.0.0.1:{port}")
        s.listen()
        probe_master(f"spark://127.0.0.1:{port}")  # listening: reachable
    with pytest.raises(ConfigError, match="not a Spark master URL"):
        probe_master("spark://no-port")
