"""``shardex scan``: scan an index of a local cluster and print its rows as JSON lines."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from shardex.cli.common import err
from shardex.cli.keyspace import DirOption, local_client
from shardex.errors import ErrorCode, ShardexError


def _bound(option: str, text: str | None) -> list[Any] | None:
    """A bound from the command line: a JSON list of key parts, or one JSON value."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        raise ShardexError(
            f"{option} {text!r} is not JSON",
            code=ErrorCode.BAD_REQUEST,
            details={"hint": f"""e.g. {option} '[30, "bob"]' or {option} 30"""},
        ) from None
    return value if isinstance(value, list) else [value]


def scan(
    keyspace: Annotated[str, typer.Argument(help="Keyspace of the index.")],
    index: Annotated[str, typer.Argument(help='Index name ("#primary" for the primary).')],
    cluster_dir: DirOption,
    low: Annotated[
        str | None, typer.Option("--low", help="Low bound: JSON list of leading key parts.")
    ] = None,
    high: Annotated[
        str | None, typer.Option("--high", help="High bound: JSON list of leading key parts.")
    ] = None,
    inclusion: Annotated[
        str, typer.Option("--inclusion", help="both | low | high | neither.")
    ] = "both",
    consistency: Annotated[
        str, typer.Option("--consistency", "-c", help="not_bounded | request_plus.")
    ] = "not_bounded",
    limit: Annotated[int | None, typer.Option("--limit", "-n", help="At most N rows.")] = None,
    offset: Annotated[int | None, typer.Option("--offset", help="Skip N rows first.")] = None,
    unordered: Annotated[
        bool, typer.Option("--unordered", help="Rows in any order (faster over many slices).")
    ] = False,
    docids: Annotated[bool, typer.Option("--docids", help="Only the document ids.")] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds the index may take to catch up.")
    ] = 30.0,
) -> None:
    """Scan an index; one JSON object per row ({"docid", "key"}) on stdout."""
    with local_client(cluster_dir, timeout=timeout + 30) as client:
        spans = None
        if low is not None or high is not None:
            lo, hi = _bound("--low", low), _bound("--high", high)
            spans = [{"low": lo, "high": hi, "inclusion": inclusion}]
        elif inclusion != "both":
            err.print("[red]error:[/] --inclusion needs --low or --high")
            raise typer.Exit(2)
        rows = client.scan(
            keyspace,
            index,
            spans,
            consistency=consistency,
            limit=limit,
            offset=offset,
            ordered=not unordered,
            covering=not docids,
            timeout=timeout,
        )
        with rows:
            for row in rows:
                print(json.dumps(row, sort_keys=True, default=str))
