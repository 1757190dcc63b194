"""Shared CLI plumbing: consoles and turning ``ShardexError`` into a message and exit code."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

from shardex.errors import ConfigError, ShardexError

# Results go to stdout (machine-readable with --json); progress and errors to stderr, so
# `shardex cluster status --json | jq` never sees a spinner frame.
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

EXIT_FAILED = 1
EXIT_USAGE = 2  # configuration / usage problems, like click's own usage errors


def fail(e: ShardexError) -> NoReturn:
    """Print an error with its hint and exit: 2 for configuration errors, 1 otherwise."""
    err.print(f"[bold red]error:[/] {e.message}", markup=True, soft_wrap=True)
    hint = e.details.get("hint")
    if hint and str(hint) not in e.message:
        err.print(f"[yellow]hint:[/] {hint}", markup=True, soft_wrap=True)
    raise typer.Exit(EXIT_USAGE if isinstance(e, ConfigError) else EXIT_FAILED)
