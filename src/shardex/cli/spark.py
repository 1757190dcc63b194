"""``shardex spark start-master|start-worker``: a Spark standalone cluster for the pipeline,
run in the foreground from the installed pyspark package (see ``pipeline/standalone.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardex.cli.common import err, fail
from shardex.errors import ShardexError

app = typer.Typer(
    help="Run a Spark standalone master or worker (the pipeline's executors on other hosts).",
    no_args_is_help=True,
)

HostOption = Annotated[
    str | None,
    typer.Option("--host", help="Address to bind and advertise (default $SPARK_LOCAL_IP)."),
]
WorkDirOption = Annotated[
    Path,
    typer.Option("--work-dir", help="Logs (and a worker's executor directories).", file_okay=False),
]
SecretOption = Annotated[
    Path | None,
    typer.Option(
        "--secret-file",
        help="Spark's shared RPC secret (mode 0600): spark.authenticate and encryption on; "
        "the pipeline driver and every worker need the same file.",
    ),
]


def _run(spec_kwargs: dict[str, object], secret_file: Path | None) -> None:
    from shardex.pipeline.session import local_ip
    from shardex.pipeline.standalone import DaemonSpec, exec_daemon
    from shardex.runtime.files import read_private_text

    try:
        host = local_ip(spec_kwargs.pop("host"))  # type: ignore[arg-type]
        spec = DaemonSpec(host=host, **spec_kwargs)  # type: ignore[arg-type]
        secret = None
        if secret_file is not None:
            secret = read_private_text(secret_file, "secret_file", "Spark secret")
        where = f"spark://{host}:{spec.port}" if spec.master_url is None else spec.master_url
        auth = "with" if secret is not None else "WITHOUT"
        err.print(f"Spark {spec.role} ({where}) {auth} spark.authenticate; log {spec.log_file}")
        exec_daemon(spec, secret)
    except ShardexError as e:
        fail(e)


@app.command("start-master")
def start_master(
    work_dir: WorkDirOption,
    host: HostOption = None,
    port: Annotated[int, typer.Option(help="The master's RPC port.")] = 7077,
    webui_port: Annotated[int, typer.Option("--webui-port", help="Web UI port (0: any).")] = 8080,
    secret_file: SecretOption = None,
) -> None:
    """Run a Spark standalone master in the foreground (this process becomes its JVM)."""
    _run(
        {"host": host, "port": port, "webui_port": webui_port, "work_dir": work_dir.absolute()},
        secret_file,
    )


@app.command("start-worker")
def start_worker(
    master: Annotated[str, typer.Argument(help="The master's URL, spark://HOST:7077.")],
    work_dir: WorkDirOption,
    host: HostOption = None,
    port: Annotated[int, typer.Option(help="The worker's RPC port (0: any).")] = 0,
    webui_port: Annotated[int, typer.Option("--webui-port", help="Web UI port (0: any).")] = 8081,
    cores: Annotated[int | None, typer.Option(help="Cores for executors (default all).")] = None,
    memory: Annotated[
        str | None, typer.Option(help="Memory for executors in all, e.g. 2g (default: host - 1g).")
    ] = None,
    secret_file: SecretOption = None,
) -> None:
    """Run a Spark standalone worker of MASTER in the foreground (this process becomes its
    JVM). The executors it starts run the pipeline driver's Python path: install shardex at
    the same path on every worker host."""
    _run(
        {
            "host": host,
            "port": port,
            "webui_port": webui_port,
            "work_dir": work_dir.absolute(),
            "master_url": master,
            "cores": cores,
            "memory": memory,
        },
        secret_file,
    )
