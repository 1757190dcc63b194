"""``shardex user create|list|drop|grant|revoke``: the cluster's users and their roles, as the
local cluster's admin."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from shardex.cli.common import out
from shardex.cli.keyspace import DirOption, local_client

app = typer.Typer(
    help="Create, list, drop users and grant or revoke their roles.", no_args_is_help=True
)

RolesArg = Annotated[
    list[str],
    typer.Argument(
        help="Roles: admin, cluster_admin, keyspace_admin(KS), data_reader(KS), "
        "data_writer(KS), query_select(KS), query_update(KS); KS a keyspace or *."
    ),
]


def _password(password_file: Path | None) -> str:
    """From the file (``-``: stdin), else prompted twice; never from a flag (``ps`` shows
    flags)."""
    if password_file is not None:
        text = sys.stdin.read() if str(password_file) == "-" else password_file.read_text()
        return text.strip()
    return typer.prompt("password", hide_input=True, confirmation_prompt=True)


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="User name.")],
    cluster_dir: DirOption,
    roles: RolesArg = None,  # type: ignore[assignment]
    password_file: Annotated[
        Path | None,
        typer.Option("--password-file", help="File holding the password ('-': stdin)."),
    ] = None,
) -> None:
    """Create a user (the password is asked for unless --password-file is given)."""
    password = _password(password_file)
    with local_client(cluster_dir) as client:
        info = client.create_user(name, password, list(roles or []))
    out.print(f"created user [bold]{info.name}[/]: {', '.join(info.roles) or 'no roles'}")


@app.command("list")
def list_(
    cluster_dir: DirOption,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The users and their roles."""
    with local_client(cluster_dir) as client:
        users = client.list_users()
    if as_json:
        out.print_json(json.dumps([{"name": u.name, "roles": u.roles} for u in users]))
        return
    for u in users:
        out.print(f"{u.name}\t{', '.join(u.roles)}")


@app.command()
def drop(name: Annotated[str, typer.Argument(help="User name.")], cluster_dir: DirOption) -> None:
    """Drop a user (its open connections keep their roles until they close)."""
    with local_client(cluster_dir) as client:
        client.drop_user(name)
    out.print(f"dropped user [bold]{name}[/]")


@app.command()
def grant(
    name: Annotated[str, typer.Argument(help="User name.")],
    roles: RolesArg,
    cluster_dir: DirOption,
) -> None:
    """Add roles to a user."""
    with local_client(cluster_dir) as client:
        info = client.grant_roles(name, list(roles))
    out.print(f"user [bold]{info.name}[/]: {', '.join(info.roles)}")


@app.command()
def revoke(
    name: Annotated[str, typer.Argument(help="User name.")],
    roles: RolesArg,
    cluster_dir: DirOption,
) -> None:
    """Remove roles from a user."""
    with local_client(cluster_dir) as client:
        info = client.revoke_roles(name, list(roles))
    out.print(f"user [bold]{info.name}[/]: {', '.join(info.roles) or 'no roles'}")


@app.command("admin-file")
def admin_file(
    path: Annotated[Path, typer.Argument(help="Where to write the admin's keys (JSON, 0600).")],
    name: Annotated[str, typer.Option("--name", help="The admin's user name.")] = "admin",
    password_file: Annotated[
        Path | None,
        typer.Option("--password-file", help="File holding the password ('-': stdin)."),
    ] = None,
) -> None:
    """Write a bootstrap admin file for `shardex node --admin-file` (a cluster installed by
    hand): the first master commits that user when the cluster has none. Only keys derived
    from the password are written."""
    from shardex.api.users import check_user_name
    from shardex.meta.users import ADMIN_ROLES, new_record, write_admin_file

    password = _password(password_file)
    write_admin_file(path, new_record(check_user_name(name), password, ADMIN_ROLES))
    out.print(f"wrote the bootstrap admin [bold]{name}[/] to {path}")
