"""``shardex failover NODE`` and ``shardex recovery NODE``: take a data node out of service
(its replicas take over its partitions) and bring it back afterwards.

Exit code 0 on success, 1 when the cluster refuses (e.g. the failover would lose partitions
without ``--allow-data-loss``: the error lists them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shardex.api.failover import FailedOver
from shardex.cli.common import err, out
from shardex.cli.keyspace import DirOption, local_client
from shardex.errors import ShardexError

NodeArg = Annotated[str, typer.Argument(help="Name of the data node.")]


def failover(
    node: NodeArg,
    cluster_dir: DirOption,
    allow_data_loss: Annotated[
        bool,
        typer.Option(
            "--allow-data-loss",
            help="Fail over even if some partitions have no reachable replica (they stay "
            "on the failed node, unavailable).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The result as one JSON object.")] = False,
) -> None:
    """Fail a data node over: its replicas with the highest seqnos become active."""
    with local_client(cluster_dir, timeout=30.0) as client:
        reply = client.failover(node, allow_data_loss=allow_data_loss)
    if as_json:
        doc = {
            "node": reply.node,
            "cas": reply.cas,
            "promoted": {
                ks: {str(p): n for p, n in ps.items()} for ks, ps in reply.promoted.items()
            },
            "lost": reply.lost,
            "pending": reply.pending,
        }
        print(json.dumps(doc, sort_keys=True))
        return
    _summary(reply)


def _summary(reply: FailedOver) -> None:
    promoted = sum(len(ps) for ps in reply.promoted.values())
    lost = sum(len(ps) for ps in reply.lost.values())
    out.print(
        f"[bold]{reply.node}[/] is failed over (cas {reply.cas}): {promoted} partition(s) "
        f"promoted, {lost} lost"
    )
    if promoted:
        table = Table(title="promoted replicas")
        for col in ("keyspace", "partitions", "new active"):
            table.add_column(col)
        for ks in sorted(reply.promoted):
            by_node: dict[str, list[int]] = {}
            for p, n in sorted(reply.promoted[ks].items()):
                by_node.setdefault(n, []).append(p)
            for n, parts in sorted(by_node.items()):
                table.add_row(ks, ", ".join(map(str, parts)), n)
        out.print(table)
    for ks, parts in sorted(reply.lost.items()):
        err.print(f"[bold red]lost[/] {ks}: partitions {parts} stay on {reply.node}, unavailable")
    for n, why in sorted(reply.pending.items()):
        err.print(f"[yellow]{n} not told yet[/] ({why}): it promotes its copies when it reconciles")
    out.print(
        f"next: bring {reply.node} back and run `shardex recovery {reply.node}`, then "
        "`shardex rebalance` to restore the replica copies"
    )


def recovery(
    node: NodeArg,
    cluster_dir: DirOption,
    full: Annotated[
        bool,
        typer.Option("--full", help="Drop the node's copies instead of rolling them back."),
    ] = False,
) -> None:
    """Recover a failed-over data node (delta by default); then run `shardex rebalance`."""
    kind = "full" if full else "delta"
    with local_client(cluster_dir, timeout=30.0) as client:
        reply = client.recover(node, kind)
    out.print(
        f"[bold]{reply.node}[/] recovered ({reply.kind} recovery, cas {reply.cas}); run "
        "`shardex rebalance` to place partitions and replicas on it again"
    )


def failed_over_nodes(cluster_dir: Path, timeout: float) -> dict[str, int] | None:
    """Failed-over nodes -> the cas that failed each over; None if no node answered."""
    from shardex.client import connect_local

    try:
        with connect_local(cluster_dir, name="shardex-cli", request_timeout=timeout) as client:
            return client.failed_over()
    except ShardexError:
        return None
