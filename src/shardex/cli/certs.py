"""``shardex cluster certs``: the cluster CA and the nodes' certificates, for TLS."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardex.cli.common import fail, out
from shardex.errors import ConfigError, ShardexError

_HELP = """Make the cluster CA (unless DIR has one) and a certificate for each --node.

DIR gets ca.pem (give it to every node and client), ca.key (0600: keep it safe, only
making certificates needs it) and nodes/NAME.pem + nodes/NAME.key (0600) per node: copy a
node's two files and ca.pem to its host and point the node at them (tls_dir, or tls_ca,
tls_cert and tls_key). A certificate names the addresses the node is dialled by:
--node node1=10.0.0.1,db1.example.com; --ip/--dns add addresses to every node given,
--loopback adds 127.0.0.1, ::1 and localhost. Run again to add or renew a node."""


def certs(
    cert_dir: Annotated[
        Path, typer.Option("--dir", "-d", help="Certificate directory.", file_okay=False)
    ],
    node: Annotated[
        list[str] | None,
        typer.Option("--node", help="NAME or NAME=ADDR,ADDR...: a node certificate; repeatable."),
    ] = None,
    ip: Annotated[
        list[str] | None, typer.Option("--ip", help="An IP address of every node given.")
    ] = None,
    dns: Annotated[
        list[str] | None, typer.Option("--dns", help="A DNS name of every node given.")
    ] = None,
    loopback: Annotated[
        bool, typer.Option("--loopback", help="Add 127.0.0.1, ::1, localhost to every node.")
    ] = False,
) -> None:
    from shardex.net.certs import LOOPBACK, make_cluster_certs, node_paths

    common = [*(ip or []), *(dns or []), *(LOOPBACK if loopback else ())]
    try:
        nodes: dict[str, list[str]] = {}
        for spec in node or []:
            name, _, addrs = spec.partition("=")
            addresses = [a.strip() for a in addrs.split(",") if a.strip()] + common
            if not addresses:
                raise ConfigError(
                    f"no address for node {name!r}",
                    details={
                        "value": spec,
                        "hint": "give --node NAME=ADDR,... or --ip / --dns / --loopback",
                    },
                )
            nodes[name.strip()] = addresses
        ca = make_cluster_certs(cert_dir, nodes)
    except ShardexError as e:
        fail(e)
    out.print(f"CA certificate: {ca}")
    for name, addresses in nodes.items():
        p = node_paths(cert_dir, name)
        out.print(f"{name}: {p.cert} and {p.key}, for {', '.join(addresses)}")


certs.__doc__ = _HELP
