"""The ``shardex`` command (entry point ``shardex.cli.main:app``)."""

from __future__ import annotations

import typer

import shardex.cli.backup as backup
import shardex.cli.cluster as cluster
import shardex.cli.failover as failover
import shardex.cli.index as index
import shardex.cli.keyspace as keyspace
import shardex.cli.spark as spark
import shardex.cli.user as user
from shardex import __version__
from shardex.cli.load import load
from shardex.cli.node import node
from shardex.cli.pipeline import pipeline
from shardex.cli.rebalance import rebalance
from shardex.cli.scan import scan
from shardex.cli.sql import sql

app = typer.Typer(
    name="shardex",
    help="shardex: a distributed JSON document store with global secondary indexes and SQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals could include the cluster secret
)
app.command("node", help=node.__doc__)(node)
app.add_typer(cluster.app, name="cluster")
app.add_typer(keyspace.app, name="keyspace")
app.add_typer(index.app, name="index")
app.add_typer(user.app, name="user")
app.add_typer(spark.app, name="spark")
app.add_typer(backup.app, name="backup")
app.command("ddl", help=index.ddl.__doc__)(index.ddl)
app.command("load", help=load.__doc__)(load)
app.command("rebalance", help=rebalance.__doc__)(rebalance)
app.command("failover", help=failover.failover.__doc__)(failover.failover)
app.command("recovery", help=failover.recovery.__doc__)(failover.recovery)
app.command("pipeline", help=pipeline.__doc__)(pipeline)
app.command("scan", help=scan.__doc__)(scan)
app.command("sql", help=sql.__doc__)(sql)


@app.command()
def version() -> None:
    """Print the shardex version."""
    print(__version__)


if __name__ == "__main__":
    app()
