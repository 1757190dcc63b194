"""``shardex index create|build|drop|list|wait`` and ``shardex ddl "statement"``."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from shardex.cli.common import out
from shardex.cli.keyspace import DirOption, local_client

app = typer.Typer(
    help="Create, build, drop and list secondary indexes (index DDL).", no_args_is_help=True
)

JsonOption = Annotated[bool, typer.Option("--json", help="JSON on stdout.")]


def _print_json(value: Any) -> None:
    print(json.dumps(value, sort_keys=True, default=str))


def _summary(ix: dict[str, Any]) -> str:
    where = f" WHERE {ix['where']}" if ix.get("where") else ""
    nodes = ", ".join(ix["nodes"])
    return (
        f"index [bold]{ix['name']}[/] on {ix['keyspace']}({', '.join(ix['keys'])}){where}: "
        f"{ix['state']}, {ix['num_partition']} partition(s) on {nodes}"
    )


@app.command()
def create(
    keyspace: Annotated[str, typer.Argument(help="Keyspace to index.")],
    name: Annotated[
        str, typer.Argument(help='Index name (with --primary, "-" gives the default #primary).')
    ],
    cluster_dir: DirOption,
    key: Annotated[
        list[str] | None,
        typer.Option("--key", "-k", help='Key expression, e.g. "age" or "age DESC" (repeat).'),
    ] = None,
    where: Annotated[str | None, typer.Option("--where", help="Filter expression.")] = None,
    partition_by: Annotated[
        list[str] | None,
        typer.Option("--partition-by", help="PARTITION BY HASH expression (repeat)."),
    ] = None,
    num_partition: Annotated[
        int | None, typer.Option("--num-partition", "-n", help="Index partitions.")
    ] = None,
    defer_build: Annotated[
        bool, typer.Option("--defer-build", help="Stop at READY; start with `index build`.")
    ] = False,
    node: Annotated[
        list[str] | None, typer.Option("--node", help="Place on this indexer (repeat).")
    ] = None,
    primary: Annotated[bool, typer.Option("--primary", help="A primary index.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Create an index; returns once every slice is allocated on its indexer."""
    with local_client(cluster_dir) as client:
        ix = client.create_index(
            keyspace,
            None if primary and name in ("", "-") else name,
            key or [],
            where=where,
            partition_by=partition_by or None,
            num_partition=num_partition,
            defer_build=defer_build,
            nodes=node or None,
            primary=primary,
        )
    if as_json:
        _print_json(ix)
    else:
        out.print("created " + _summary(ix))


@app.command()
def build(
    keyspace: Annotated[str, typer.Argument(help="Keyspace.")],
    names: Annotated[list[str], typer.Argument(help="Indexes to build.")],
    cluster_dir: DirOption,
) -> None:
    """Start building deferred (READY) or failed (ERROR) indexes."""
    with local_client(cluster_dir) as client:
        built = client.build_index(keyspace, *names)
    for ix in built:
        out.print(_summary(ix))


@app.command()
def drop(
    keyspace: Annotated[str, typer.Argument(help="Keyspace.")],
    cluster_dir: DirOption,
    name: Annotated[str | None, typer.Argument(help="Index name.")] = None,
    primary: Annotated[bool, typer.Option("--primary", help="The primary index.")] = False,
) -> None:
    """Drop an index and its slices."""
    with local_client(cluster_dir) as client:
        res = client.drop_index(keyspace, name, primary=primary)
    pending = res["pending_nodes"]
    later = f" ({', '.join(pending)} drop their slices when they return)" if pending else ""
    out.print(f"dropped index [bold]{res['name']}[/] on {res['keyspace']}{later}")


@app.command("list")
def list_(
    cluster_dir: DirOption,
    keyspace: Annotated[str | None, typer.Argument(help="Only this keyspace.")] = None,
    as_json: JsonOption = False,
) -> None:
    """List indexes with their state, partitions and nodes."""
    with local_client(cluster_dir) as client:
        rows = client.list_indexes(keyspace)
    if as_json:
        _print_json(rows)
        return
    table = Table(title=f"indexes (cas {rows[0]['cas']})" if rows else "indexes")
    for col in ("keyspace", "name", "state", "keys", "where", "partitions", "nodes", "progress"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["keyspace"],
            r["name"],
            r["state"] + (f" ({r['error']})" if r["error"] else ""),
            ", ".join(r["keys"]),
            r["where"] or "",
            str(r["num_partition"]),
            ", ".join(r["nodes"]),
            f"{r['progress']:.0%}",
        )
    out.print(table)


@app.command()
def wait(
    keyspace: Annotated[str, typer.Argument(help="Keyspace.")],
    name: Annotated[str, typer.Argument(help="Index name.")],
    cluster_dir: DirOption,
    state: Annotated[str, typer.Option("--state", help="State to wait for.")] = "ACTIVE",
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds.")] = 60.0,
) -> None:
    """Wait until an index reaches a state (or a later one)."""
    with local_client(cluster_dir) as client:
        ix = client.wait_for_index(keyspace, name, state=state, timeout=timeout)
    out.print(_summary(ix))


def ddl(
    statement: Annotated[str, typer.Argument(help='e.g. "CREATE INDEX i ON users(age)".')],
    cluster_dir: DirOption,
    as_json: JsonOption = False,
) -> None:
    """Run one index DDL statement: CREATE [PRIMARY] INDEX, BUILD INDEX, DROP INDEX."""
    with local_client(cluster_dir) as client:
        result = client.execute_ddl(statement)
    if as_json:
        _print_json(result)
        return
    for item in result if isinstance(result, list) else [result]:
        if "state" in item:
            out.print(_summary(item))
        else:
            out.print(f"dropped index [bold]{item['name']}[/] on {item['keyspace']}")
