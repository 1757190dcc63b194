"""``shardex index create|build|drop|list|wait`` and ``shardex ddl "statement"``."""

from __future__ import annotations

import json
import threading
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from shardex.cli.common import err, out
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
    copies = f" x{1 + ix['num_replica']} copies" if ix.get("num_replica") else ""
    return (
        f"index [bold]{ix['name']}[/] on {ix['keyspace']}({', '.join(ix['keys'])}){where}: "
        f"{ix['state']}, {ix['num_partition']} partition(s){copies} on {nodes}"
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
    num_replica: Annotated[
        int, typer.Option("--num-replica", help="Copies of each partition on other indexers.")
    ] = 0,
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
            num_replica=num_replica,
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
    cols = ("keyspace", "name", "state", "keys", "where", "partitions", "replicas", "nodes")
    cols = (*cols, "progress")
    for col in (*cols, "items", "stable at"):
        table.add_column(col)
    for r in rows:
        stable = r.get("stability_ts")
        table.add_row(
            r["keyspace"],
            r["name"],
            r["state"] + (f" ({r['error']})" if r["error"] else ""),
            ", ".join(r["keys"]),
            r["where"] or "",
            str(r["num_partition"]),
            str(r.get("num_replica", 0)),
            ", ".join(r["nodes"]),
            f"{r['progress']:.0%}",
            f"{r.get('items_count', 0):,}",
            "-" if stable is None else f"{sum(stable.values()):,} mutations",
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
    """Wait until an index reaches a state (or a later one), with a progress bar while it
    builds (documents loaded of the snapshot, rate, time left)."""
    with local_client(cluster_dir) as client:
        waiter = _Waiter(client, keyspace, name, state, timeout)
        waiter.thread.start()
        with Progress(
            TextColumn(f"[bold]{name}[/]" + " {task.fields[state]}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[items]:,} entries"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err,
        ) as bar:
            task = bar.add_task("build", total=1.0, state="", items=0)
            while waiter.thread.is_alive():
                waiter.thread.join(0.5)
                ix = next((i for i in client.list_indexes(keyspace) if i["name"] == name), None)
                if ix is not None:
                    bar.update(
                        task, completed=ix["progress"], state=ix["state"], items=ix["items_count"]
                    )
    if waiter.error is not None:
        raise waiter.error
    assert waiter.result is not None
    out.print(_summary(waiter.result))


class _Waiter:
    """``client.wait_for_index`` on a thread, so the CLI can draw the bar meanwhile."""

    def __init__(self, client: Any, keyspace: str, name: str, state: str, timeout: float) -> None:
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = client.wait_for_index(keyspace, name, state=state, timeout=timeout)
            except BaseException as exc:  # re-raised on the main thread
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)


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
