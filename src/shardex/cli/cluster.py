"""``shardex cluster start|status|stop``: a local cluster of node processes on loopback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

import shardex.cli.localcluster as lc
from shardex.cli.certs import certs
from shardex.cli.common import EXIT_FAILED, err, fail, out
from shardex.cli.failover import failed_over_nodes
from shardex.errors import ConfigError, ShardexError
from shardex.meta import cluster_dir as cdir

app = typer.Typer(
    help="Run a local cluster: N node processes on 127.0.0.1, state in one directory.",
    no_args_is_help=True,
)

app.command("certs", help=certs.__doc__)(certs)

DirOption = Annotated[Path, typer.Option("--dir", "-d", help="Cluster directory.", file_okay=False)]


def _load(cluster_dir: Path) -> tuple[cdir.ClusterSpec, str]:
    try:
        spec = cdir.load(cluster_dir)
        return spec, cdir.read_secret(cluster_dir, spec)
    except ShardexError as e:
        fail(e)


@app.command()
def start(
    cluster_dir: DirOption,
    nodes: Annotated[
        int | None, typer.Option("--nodes", "-n", help="Number of nodes (new cluster: 3).")
    ] = None,
    base_port: Annotated[
        int | None,
        typer.Option(
            "--base-port",
            help=f"First cluster port (new cluster: {cdir.DEFAULT_BASE_PORT}); nodes use P, "
            f"P+1, ...; HTTP ports are reserved at +{cdir.HTTP_PORT_OFFSET}.",
        ),
    ] = None,
    services: Annotated[
        str | None, typer.Option(help="Services of every node (new cluster: all).")
    ] = None,
    heartbeat_interval: Annotated[
        float | None, typer.Option("--heartbeat-interval", help="New cluster: 0.5 s.")
    ] = None,
    failure_timeout: Annotated[
        float | None, typer.Option("--failure-timeout", help="New cluster: 3 s.")
    ] = None,
    auto_failover_timeout: Annotated[
        float | None,
        typer.Option(
            "--auto-failover-timeout",
            help="New cluster: seconds a silent data node waits before automatic failover "
            "(default 5; at least 2, and above --failure-timeout).",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for all nodes to be up.")] = 30.0,
    no_pipeline: Annotated[
        bool,
        typer.Option("--no-pipeline", help="Do not start the index pipeline's Spark driver."),
    ] = False,
    groups: Annotated[
        str | None,
        typer.Option(
            "--groups",
            help="New cluster: server group labels of the nodes, comma-separated, repeated "
            "round-robin (a,b over 4 nodes: a,b,a,b); replicas go to distinct groups.",
        ),
    ] = None,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="New cluster: TLS on every connection; the CA and the nodes' certificates "
            "are made in DIR/certs, and clients of the directory use them.",
        ),
    ] = False,
) -> None:
    """Create the cluster on first use, start every node that is not running, and wait until
    each answers and sees all members up; then start the index pipeline (Spark driver) unless
    it runs already or --no-pipeline. Safe to run again (e.g. after kill -9)."""
    try:
        if cdir.exists(cluster_dir):
            spec = cdir.load(cluster_dir)
            _check_same(spec, nodes, base_port)
            if tls and spec.tls_dir is None:
                raise ConfigError(
                    "--tls applies to a new cluster; this one was created without TLS",
                    details={
                        "key": "tls",
                        "value": True,
                        "hint": "create a new cluster directory with --tls",
                    },
                )
            if groups is not None:
                raise ConfigError(
                    "--groups labels the nodes of a new cluster only",
                    details={
                        "key": "groups",
                        "value": groups,
                        "hint": "set `group = ...` in a node's node.toml and restart it",
                    },
                )
        else:
            from shardex.node.config import load_config

            # Validate the settings the way a node will, before writing anything.
            probe_cfg: dict[str, Any] = {
                "name": "node1",
                "data_dir": str(cluster_dir / "node1"),
                "secret": "x" * 32,
                "services": services,
                "heartbeat_interval": heartbeat_interval,
                "failure_timeout": failure_timeout,
                "auto_failover_timeout": auto_failover_timeout,
            }
            cfg = load_config(None, probe_cfg)
            labels = [] if groups is None else _group_labels(groups)
            spec = cdir.create(
                cluster_dir,
                nodes=3 if nodes is None else nodes,
                base_port=cdir.DEFAULT_BASE_PORT if base_port is None else base_port,
                services=list(cfg.services),
                heartbeat_interval=cfg.heartbeat_interval,
                failure_timeout=cfg.failure_timeout,
                auto_failover_timeout=(
                    None if auto_failover_timeout is None else cfg.auto_failover_timeout
                ),
                tls=tls,
            )
            if labels:
                _label_groups(cluster_dir, spec, labels)
            with_tls = f", TLS: certificates in {cluster_dir / cdir.CERTS_DIR}" if tls else ""
            err.print(
                f"created cluster directory {cluster_dir} ({len(spec.nodes)} nodes{with_tls})"
            )
        secret = cdir.read_secret(cluster_dir, spec)
    except ShardexError as e:
        fail(e)

    try:
        with err.status("starting nodes...", spinner="dots") as spinner:
            outcome = lc.start(
                cluster_dir,
                spec,
                secret,
                timeout=timeout,
                progress=lambda msg: spinner.update(msg),
            )
    except ShardexError as e:  # no free HTTP port for a node
        fail(e)

    for name, (old, new) in sorted(outcome.http_moved.items()):
        err.print(f"{name}: HTTP port {old} is taken by another process; it serves on {new}")
    table = Table(title=f"cluster {cluster_dir}")
    for col in ("node", "address", "pid", "state", "action"):
        table.add_column(col)
    procs = lc.node_procs(cluster_dir, spec)
    for p, r in zip(procs, outcome.results, strict=True):
        name = p.spec.name
        action = "started" if name in outcome.started else "already running"
        if name in outcome.failed:
            action = f"[red]FAILED[/]: {outcome.failed[name]}"
        state = "[green]up[/]" if r.up else "[red]down[/]"
        table.add_row(name, p.spec.address, str(p.pid or "-"), state, action)
    out.print(table)

    if outcome.failed:
        for name in sorted(outcome.failed):
            node = next(n for n in spec.nodes if n.name == name)
            err.print(f"[bold red]{name} failed:[/] {outcome.failed[name]}")
            err.rule(f"last lines of {node.path(cluster_dir) / cdir.STDOUT_FILE}")
            err.print(lc.log_tail(node.path(cluster_dir)), markup=False, highlight=False)
            err.rule()
        raise typer.Exit(EXIT_FAILED)
    err.print(f"[green]cluster up:[/] {len(spec.nodes)} nodes, all members up")
    if not no_pipeline:
        _start_pipeline(cluster_dir)


def _start_pipeline(cluster_dir: Path) -> None:
    from shardex.pipeline.process import LOG_FILE, pipeline_dir, pipeline_pid

    pid = pipeline_pid(cluster_dir)
    if pid is not None:
        err.print(f"pipeline driver already running (pid {pid})")
        return
    child = lc.spawn_pipeline(cluster_dir)
    err.print(
        f"[green]pipeline driver starting[/] (pid {child.pid}); Spark takes ~20 s to come up; "
        f"log: {pipeline_dir(cluster_dir) / LOG_FILE}"
    )


def _group_labels(groups: str) -> list[str]:
    """The ``--groups`` labels, each checked the way a node checks its ``group``."""
    from shardex.node.config import load_config

    labels = [g.strip() for g in groups.split(",") if g.strip()]
    if not labels:
        raise ConfigError(
            "--groups gives no label",
            details={"key": "groups", "value": groups, "hint": "e.g. --groups rack1,rack2"},
        )
    probe = {"name": "probe", "data_dir": "probe", "secret": "x" * 32}
    for label in labels:
        load_config(None, {**probe, "group": label})
    return labels


def _label_groups(cluster_dir: Path, spec: cdir.ClusterSpec, labels: list[str]) -> None:
    """Add ``group = ...`` to each new node's config, the labels repeated round-robin."""
    from shardex.runtime.files import atomic_write_bytes

    for i, node in enumerate(spec.nodes):
        path = node.path(cluster_dir) / cdir.NODE_CONFIG_FILE
        text = path.read_text(encoding="utf-8").rstrip("\n")
        atomic_write_bytes(path, f'{text}\ngroup = "{labels[i % len(labels)]}"\n'.encode())


def _check_same(spec: cdir.ClusterSpec, nodes: int | None, base_port: int | None) -> None:
    if nodes is not None and nodes != len(spec.nodes):
        raise ConfigError(
            f"the cluster has {len(spec.nodes)} nodes, not {nodes}",
            details={
                "key": "nodes",
                "value": nodes,
                "hint": "omit --nodes to restart it (add nodes with `shardex cluster add-node`)",
            },
        )
    if base_port is not None and base_port != spec.base_port:
        raise ConfigError(
            f"the cluster uses base port {spec.base_port}, not {base_port}",
            details={"key": "base_port", "value": base_port, "hint": "omit --base-port"},
        )


@app.command("add-node")
def add_node(
    cluster_dir: DirOption,
    services: Annotated[
        str | None, typer.Option(help="Services of the new node (default: node1's).")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for it to be up.")] = 30.0,
) -> None:
    """Start one more node on the next port and join it to the cluster. It holds no
    partitions until `shardex rebalance` moves some to it. Updates cluster.json."""
    spec, secret = _load(cluster_dir)
    try:
        wanted = None
        if services is not None:
            from shardex.node.config import load_config

            probe = {"name": "probe", "data_dir": str(cluster_dir), "secret": "x" * 32}
            wanted = list(load_config(None, {**probe, "services": services}).services)
        spec, node = cdir.add_node(cluster_dir, spec, services=wanted)
    except ShardexError as e:
        fail(e)
    err.print(f"added {node.name} ({node.address}) to {cluster_dir}")
    with err.status(f"starting {node.name}...", spinner="dots") as spinner:
        outcome = lc.start(
            cluster_dir, spec, secret, timeout=timeout, progress=lambda m: spinner.update(m)
        )
    if outcome.failed:
        for name in sorted(outcome.failed):
            err.print(f"[bold red]{name} failed:[/] {outcome.failed[name]}")
        if node.name in outcome.failed:
            err.rule(f"last lines of {node.path(cluster_dir) / cdir.STDOUT_FILE}")
            err.print(lc.log_tail(node.path(cluster_dir)), markup=False, highlight=False)
            err.print("it stays in cluster.json: `shardex cluster start` retries it")
        raise typer.Exit(EXIT_FAILED)
    out.print(
        f"[green]{node.name} is up[/] at {node.address} ({','.join(node.services)}); "
        f"{len(spec.nodes)} nodes. It holds no partitions yet: run "
        f"`shardex rebalance --dir {cluster_dir}`"
    )


@app.command()
def status(
    cluster_dir: DirOption,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each node.")] = 2.0,
) -> None:
    """Which nodes run and answer an authenticated ping, the membership view (with each
    node's server group), the coordinator's voters and the keyspaces' replica counts."""
    spec, secret = _load(cluster_dir)
    procs = lc.node_procs(cluster_dir, spec)
    tls = cdir.tls_config(cluster_dir, spec)
    results = lc.probe_nodes(spec, secret, timeout=timeout, tls=tls)
    doc = lc.status_dict(cluster_dir, spec, procs, results)
    if doc["up"]:  # failed-over nodes serve nothing until recovered
        doc["failed_over"] = failed_over_nodes(cluster_dir, timeout)
        doc["voters"] = lc.coordinator_voters(spec, secret, timeout, tls=tls)
    doc["keyspaces"] = _keyspaces(cluster_dir, timeout) if doc["up"] else None
    if as_json:
        # Plain print: rich would wrap long lines and break the JSON.
        print(json.dumps(doc, sort_keys=True))
        return

    table = Table(title=f"cluster {cluster_dir}: {doc['up']}/{doc['total']} up")
    for col in ("node", "address", "pid", "state", "services", "member id", "sees up"):
        table.add_column(col)
    for n in doc["nodes"]:
        table.add_row(
            n["name"],
            n["address"],
            str(n["pid"] or "-"),
            "[green]up[/]" if n["state"] == "up" else "[red]down[/]",
            ",".join(n["services"]),
            (n["member_id"] or "-")[:8],
            "-" if n["members_up"] is None else f"{n['members_up']}/{doc['total']}",
        )
    out.print(table)
    view = doc["membership"]
    if view is None:
        out.print("[red]no live node: no membership view[/]")
        return
    vt = Table(title=f"membership as seen by {view['observer']} (version {view['version']})")
    for col in ("member", "address", "group", "state", "last heartbeat", "member id"):
        vt.add_column(col)
    for m in view["members"]:
        age = m["last_heartbeat_age"]
        colour = {"up": "green", "down": "red"}.get(m["state"], "yellow")
        vt.add_row(
            m["name"],
            m["address"],
            m.get("group") or "-",
            f"[{colour}]{m['state']}[/]",
            "never" if age is None else f"{age:.1f}s ago",
            m["member_id"][:8],
        )
    out.print(vt)
    if doc.get("voters"):
        voters = doc["voters"]
        out.print(
            f"coordinator voters: {', '.join(voters)} (a commit needs "
            f"{len(voters) // 2 + 1} of {len(voters)})"
        )
    if doc.get("failed_over"):
        names = ", ".join(sorted(doc["failed_over"]))
        out.print(f"[red]failed over[/] (serving nothing until `shardex recovery`): {names}")
    if doc["keyspaces"]:
        kt = Table(title="keyspaces")
        for col in ("keyspace", "partitions", "replicas", "shortest chain"):
            kt.add_column(col)
        for k in doc["keyspaces"]:
            short = k["min_replicas"] < k["num_replicas"]
            kt.add_row(
                k["name"],
                str(k["num_partitions"]),
                str(k["num_replicas"]),
                f"[yellow]{k['min_replicas']}[/]" if short else str(k["min_replicas"]),
            )
        out.print(kt)


def _keyspaces(cluster_dir: Path, timeout: float) -> list[dict[str, Any]] | None:
    """Per keyspace: partitions, configured replicas and the shortest chain's replicas
    (lower after a failover until a rebalance); None if no manager answers."""
    from shardex.client import connect_local

    try:
        with connect_local(
            cluster_dir, name="shardex-cli", connect_timeout=timeout, request_timeout=timeout
        ) as client:
            rows = client.list_keyspaces()
    except ShardexError:
        return None
    return [
        {
            "name": r.name,
            "num_partitions": r.num_partitions,
            "num_replicas": r.num_replicas,
            "min_replicas": r.min_replicas,
        }
        for r in rows
    ]


@app.command()
def stop(
    cluster_dir: DirOption,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait after SIGTERM before SIGKILL.")
    ] = 10.0,
) -> None:
    """SIGTERM every node, wait, then SIGKILL stragglers."""
    spec, _secret = _load(cluster_dir)
    from shardex.pipeline.process import pipeline_dir

    # The pipeline first: it stops its queries cleanly while the nodes still answer. (No row
    # for it when this cluster never ran one, e.g. started with --no-pipeline.)
    outcomes = []
    if pipeline_dir(cluster_dir).exists():
        outcomes.append(lc.stop_pipeline(cluster_dir, timeout=timeout))
    outcomes += lc.stop(cluster_dir, spec, timeout=timeout)
    table = Table(title=f"stop {cluster_dir}")
    for col in ("node", "pid", "result"):
        table.add_column(col)
    colours = {"stopped": "green", "killed": "yellow", "not running": "dim"}
    for o in outcomes:
        colour = colours.get(o.result, "red")
        table.add_row(o.node, str(o.pid or "-"), f"[{colour}]{o.result}[/]")
    out.print(table)
    if any(o.result == "still running" for o in outcomes):
        raise typer.Exit(EXIT_FAILED)
