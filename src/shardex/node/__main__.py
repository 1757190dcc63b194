"""``python -m shardex.node ...`` == ``shardex node ...``.

The local cluster CLI starts nodes this way, with the same interpreter as itself, so it never
depends on where (or whether) the ``shardex`` script is on PATH."""

import typer

from shardex.cli.node import node

# One command: typer runs it without a subcommand name. No locals in tracebacks (secret).
app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
app.command(help=node.__doc__)(node)

if __name__ == "__main__":
    app()
