"""MERGE's rules, shared by the reference engine and the initiator: which target document a
source row names, and what happens to it (``syntax/merge.py`` has the grammar).

* ``ON KEY`` must give a non-empty string for every source row (else BAD_REQUEST naming the
  value), and two rows may not name the same document (N1QL refuses a document merged twice
  by one statement: which row wins would depend on their order).
* A matched document is updated when ``WHEN MATCHED THEN UPDATE`` is given and its WHERE
  holds, else deleted when ``WHEN MATCHED THEN DELETE`` is given and its WHERE holds, else
  left alone. An unmatched one is inserted with the ``INSERT`` value when its WHERE holds; a
  MISSING value is a BAD_REQUEST.
* ``LIMIT n`` takes the first n source rows (in the source's order).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from shardex.core.expr import MISSING, Expr, evaluate, truth
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.operators.mutate import apply_edits, compile_edits
from shardex.sql.syntax.bind import META_KEY, resolve
from shardex.sql.syntax.merge import MergeStmt

__all__ = ["DELETED", "UPDATED", "MergeRules", "SourceRow"]

UPDATED: Final = "update"
DELETED: Final = "delete"

# A source row: (its value, its META(): {"id": ...} for a keyspace's document, else {})
SourceRow = tuple[Any, dict[str, Any]]


class MergeRules:
    """One MERGE statement's expressions bound to its two aliases, with its parameters."""

    def __init__(self, stmt: MergeStmt, params: Any) -> None:
        self.stmt, self.params = stmt, params
        target, source = stmt.alias, stmt.source_alias
        both = frozenset({target, source})

        def on_source(e: Expr | None) -> Expr | None:
            return None if e is None else resolve(e, source, frozenset({source}))

        def on_target(e: Expr | None) -> Expr | None:
            return None if e is None else resolve(e, target, both)

        self.on_key = on_source(stmt.on_key)
        u, d, i = stmt.update, stmt.delete, stmt.insert
        self.update_where = on_target(u.where) if u else None
        self.edits = compile_edits(u.set, u.unset, target, on_target) if u else None  # type: ignore[arg-type]
        self.delete_where = on_target(d.where) if d else None
        self.insert_value = on_source(i.value) if i else None
        self.insert_where = on_source(i.where) if i else None

    def _source_scope(self, row: SourceRow) -> dict[str, Any]:
        return {self.stmt.source_alias: row[0], META_KEY: row[1]}

    def _holds(self, cond: Expr | None, scope: dict[str, Any]) -> bool:
        return cond is None or bool(truth(evaluate(cond, scope, params=self.params)))

    def keyed(self, rows: Iterable[SourceRow]) -> dict[str, SourceRow]:
        """Source rows by the target key each names, in source order (module doc's rules)."""
        out: dict[str, SourceRow] = {}
        for row in rows:
            key = evaluate(self.on_key, self._source_scope(row), params=self.params)
            if not isinstance(key, str) or not key:
                raise ShardexError(
                    f"MERGE ... ON KEY gave {'MISSING' if key is MISSING else repr(key)[:80]}, "
                    "not a document key",
                    code=ErrorCode.BAD_REQUEST,
                    details={"value": repr(key)[:200], "hint": "ON KEY must give a string"},
                )
            if key in out:
                raise ShardexError(
                    f"MERGE names document {key!r} of {self.stmt.keyspace!r} more than once",
                    code=ErrorCode.BAD_REQUEST,
                    details={
                        "key": key,
                        "hint": "make the source give each key once (GROUP BY or DISTINCT)",
                    },
                )
            out[key] = row
        return out

    def matched(self, key: str, doc: Any, row: SourceRow) -> tuple[str, Any] | None:
        """``(UPDATED, new document)``, ``(DELETED, doc)`` or None (left alone)."""
        scope = {self.stmt.alias: doc, self.stmt.source_alias: row[0], META_KEY: {"id": key}}
        if self.edits is not None and self._holds(self.update_where, scope):
            return UPDATED, apply_edits(self.edits, doc, scope, self.params)
        if self.stmt.delete is not None and self._holds(self.delete_where, scope):
            return DELETED, doc
        return None

    def inserted(self, key: str, row: SourceRow) -> Any | None:
        """The value to insert under ``key``, or None when nothing is inserted."""
        if self.insert_value is None:
            return None
        scope = self._source_scope(row)
        if not self._holds(self.insert_where, scope):
            return None
        value = evaluate(self.insert_value, scope, params=self.params)
        if value is MISSING:
            raise ShardexError(
                f"MERGE would insert document {key!r} with no value (MISSING)",
                code=ErrorCode.BAD_REQUEST,
                details={"key": key, "hint": "the INSERT value must be a JSON value"},
            )
        return value

    def exprs(self) -> list[Expr]:
        """Every expression of the statement (for its parameter check)."""
        s = self.stmt
        out: list[Expr | None] = [s.on_key, s.limit]
        if s.update:
            out += [e for pair in s.update.set for e in pair] + [*s.update.unset, s.update.where]
        if s.delete:
            out.append(s.delete.where)
        if s.insert:
            out += [s.insert.value, s.insert.where]
        if isinstance(s.source, Expr):
            out.append(s.source)
        return [e for e in out if e is not None]
