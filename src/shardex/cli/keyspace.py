"""``shardex keyspace create|list|drop|stats``: keyspace DDL and per-partition counts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from shardex.cli.common import err, fail, out
from shardex.client import Client, KeyspaceDescription, KeyspaceStatsResult
from shardex.errors import ShardexError

app = typer.Typer(
    help="Create, list, drop keyspaces and show their partitions.", no_args_is_help=True
)

DirOption = Annotated[Path, typer.Option("--dir", "-d", help="Cluster directory.", file_okay=False)]
STATS_COLUMNS = 4  # partition tables are printed this many partitions wide


@contextmanager
def local_client(cluster_dir: Path, *, timeout: float = 60.0) -> Iterator[Client]:
    """A client of the local cluster in ``cluster_dir``; errors become a message + exit 1."""
    from shardex.client import connect_local

    try:
        client = connect_local(cluster_dir, name="shardex-cli", request_timeout=timeout)
    except ShardexError as e:
        fail(e)
    with client:
        try:
            yield client
        except ShardexError as e:
            fail(e)


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="Keyspace name.")],
    cluster_dir: DirOption,
    partitions: Annotated[
        int, typer.Option("--partitions", "-p", help="Number of partitions (1-1024).")
    ] = 64,
    replicas: Annotated[
        int | None,
        typer.Option(
            "--replicas",
            "-r",
            help="Replica copies of each partition, on other nodes (0-3; default: 1 with two "
            "or more data nodes, else 0).",
        ),
    ] = None,
    max_ttl: Annotated[
        int,
        typer.Option(
            "--max-ttl",
            help="Seconds: the expiry of a document written without one, and the longest "
            "any may ask (0: none).",
        ),
    ] = 0,
) -> None:
    """Create a keyspace; its partitions are placed evenly over the data nodes, their
    replica copies on other nodes (and other server groups, where nodes have one)."""
    with local_client(cluster_dir) as client:
        ks = client.create_keyspace(name, partitions, num_replicas=replicas, max_ttl=max_ttl)
    out.print(describe_created(ks))
    for warning in ks.warnings:
        err.print(f"[yellow]warning:[/] {warning}")


def describe_created(ks: KeyspaceDescription) -> str:
    """One line: partitions per node, and the replicas if any."""
    nodes = sorted(set(ks.assignment.values()))
    per = ", ".join(f"{n}: {len(ks.partitions_of(n))}" for n in nodes)
    line = f"created keyspace [bold]{ks.name}[/]: {ks.num_partitions} partitions ({per})"
    if ks.num_replicas:
        line += f", {replicas_cell(ks)} replica(s) per partition"
    if ks.max_ttl:
        line += f", max_ttl {ks.max_ttl} s"
    return line


def replicas_cell(ks: KeyspaceDescription) -> str:
    """The configured replica count, with the shortest chain's when it is lower."""
    if ks.min_replicas < ks.num_replicas:
        return f"{ks.num_replicas} (shortest chain: {ks.min_replicas})"
    return str(ks.num_replicas)


@app.command("set")
def set_(
    name: Annotated[str, typer.Argument(help="Keyspace name.")],
    cluster_dir: DirOption,
    replicas: Annotated[
        int,
        typer.Option(
            "--replicas",
            "-r",
            help="Replica copies of each partition, on other nodes (0-3).",
        ),
    ],
) -> None:
    """Change a keyspace's replica count: chains are widened or narrowed at once (no
    active moves); new copies are built from the existing data in the background."""
    with local_client(cluster_dir) as client:
        ks = client.set_keyspace_replicas(name, replicas)
    out.print(
        f"keyspace [bold]{ks.name}[/]: {replicas_cell(ks)} replica(s) per partition, "
        f"topology {ks.topology_seq}; new copies build in the background"
    )
    for warning in ks.warnings:
        err.print(f"[yellow]warning:[/] {warning}")


@app.command("list")
def list_(
    cluster_dir: DirOption,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
) -> None:
    """List keyspaces with their partition and replica counts and placement."""
    with local_client(cluster_dir) as client:
        rows = client.list_keyspaces()
    if as_json:
        print(json.dumps([r.to_dict() for r in rows], sort_keys=True))
        return
    table = Table(title="keyspaces")
    for col in ("name", "partitions", "replicas", "topology", "nodes", "uuid"):
        table.add_column(col)
    for r in rows:
        nodes = sorted({*r.assignment.values(), *(n for ns in r.replicas.values() for n in ns)})
        table.add_row(
            r.name,
            str(r.num_partitions),
            replicas_cell(r),
            str(r.topology_seq),
            ", ".join(nodes),
            r.uuid[:12],
        )
    out.print(table)


@app.command()
def drop(
    name: Annotated[str, typer.Argument(help="Keyspace name.")],
    cluster_dir: DirOption,
) -> None:
    """Drop a keyspace and all its documents."""
    with local_client(cluster_dir) as client:
        client.drop_keyspace(name)
    out.print(f"dropped keyspace [bold]{name}[/]")


@app.command()
def stats(
    name: Annotated[str, typer.Argument(help="Keyspace name.")],
    cluster_dir: DirOption,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
) -> None:
    """Documents per node and per partition (gathered from every owner)."""
    with local_client(cluster_dir) as client:
        st = client.keyspace_stats(name)
    if as_json:
        print(
            json.dumps(
                {
                    "keyspace": st.keyspace,
                    "total_docs": st.total_docs,
                    "nodes": {
                        n: {"partitions": p, "docs": d} for n, (p, d) in st.by_node().items()
                    },
                    "partitions": [vars(p) for p in st.partitions],
                },
                sort_keys=True,
            )
        )
        return
    render_stats(st)


def render_stats(st: KeyspaceStatsResult) -> None:
    """Per-node table, then the partitions ``STATS_COLUMNS`` wide."""
    nodes = Table(title=f"{st.keyspace}: {st.total_docs:,} documents by node")
    nodes.add_column("node")
    nodes.add_column("partitions", justify="right")
    nodes.add_column("documents", justify="right")
    for node, (parts, docs) in st.by_node().items():
        nodes.add_row(node, str(parts), f"{docs:,}")
    out.print(nodes)
    parts = list(st.partitions)
    width = max((len(p.node) for p in parts), default=4)
    groups = max(1, min(STATS_COLUMNS, (out.width - 4) // (width + 18)))
    table = Table(title=f"{st.keyspace}: documents by partition", box=box.SIMPLE_HEAD)
    for _ in range(groups):
        table.add_column("p", justify="right", style="dim", no_wrap=True)
        table.add_column("node", no_wrap=True)
        table.add_column("docs", justify="right", no_wrap=True)
    rows = (len(parts) + groups - 1) // groups
    for r in range(rows):
        cells: list[str] = []
        for c in range(groups):
            i = c * rows + r
            if i < len(parts):
                p = parts[i]
                cells += [str(p.partition), p.node, f"{p.doc_count:,}"]
            else:
                cells += ["", "", ""]
        table.add_row(*cells)
    out.print(table)
