"""Prepared statements: ``PREPARE name FROM statement`` keeps the statement's text under a
name, ``EXECUTE name [USING values]`` runs it. An engine (``LocalEngine``, a node's
``SqlService``) holds its own names; the statement is parsed and bound once per text by the
caches every statement goes through, so EXECUTE costs what the text would.

As N1QL: preparing a name again with another text needs FORCE; USING gives the parameters
(an array for ``$1, $2, ...``, an object for ``$name``), which a request may not also give.
At most ``LIMIT`` names are kept; past it the least recently used one is forgotten.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from shardex.core.expr import evaluate
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.syntax.ast import ExecuteStmt, PrepareStmt

__all__ = ["LIMIT", "PreparedStatements"]

LIMIT: Final = 1024


def _bad(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=details)


class PreparedStatements:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._texts: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def prepare(self, stmt: PrepareStmt) -> dict[str, Any]:
        """Keep ``stmt``'s text under its name; the row PREPARE returns."""
        with self._lock:
            known = self._texts.get(stmt.name)
            if known is not None and known != stmt.text and not stmt.force:
                raise _bad(
                    f"a statement is prepared as {stmt.name!r} already, with another text",
                    name=stmt.name,
                    hint=f"PREPARE FORCE {stmt.name} FROM ... replaces it",
                )
            self._texts[stmt.name] = stmt.text
            self._texts.move_to_end(stmt.name)
            while len(self._texts) > self.limit:
                self._texts.popitem(last=False)
        return {"name": stmt.name, "text": stmt.text}

    def text(self, name: str) -> str:
        with self._lock:
            text = self._texts.get(name)
            if text is not None:
                self._texts.move_to_end(name)
        if text is None:
            raise _bad(
                f"no statement is prepared as {name!r} here",
                name=name,
                hint=f"PREPARE {name} FROM <statement> first (on the node that runs EXECUTE)",
            )
        return text

    def execution(self, stmt: ExecuteStmt, params: Any) -> tuple[str, Any]:
        """The text EXECUTE runs and its parameters (USING's, or the request's)."""
        text = self.text(stmt.name)
        if stmt.using is None:
            return text, params
        if params:
            raise _bad(
                f"EXECUTE {stmt.name} gives parameters with USING and with the request both",
                name=stmt.name,
                hint="give them one way",
            )
        values = evaluate(stmt.using, {})
        if not isinstance(values, list | Mapping):
            raise _bad(
                f"EXECUTE ... USING takes an array or an object, got {values!r:.80}",
                value=repr(values)[:80],
                hint="USING [1, 'a'] for $1, $2 or USING {'name': 1} for $name",
            )
        return text, values
