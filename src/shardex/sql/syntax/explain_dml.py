"""EXPLAIN of a DML statement, in both engines: the plan of the query it runs (``query``:
INSERT ... SELECT's query, the SELECT a DELETE / UPDATE derives, MERGE's source; its shape
is the query's own EXPLAIN) and then its write steps (``plan``). The engine plans the query
(the reference engine its operators, the cluster its fragments too); this module says what
happens to the rows it yields.

``cas``: the writes of the statement's documents are checked ones (the cluster: DELETE,
UPDATE and MERGE read each chosen document again at its owner with its CAS, decide again
on that version and write under that CAS, ``exec/dml.py``); the reference engine changes
its in-memory documents directly. Nothing here runs the statement: EXPLAIN never writes."""

from __future__ import annotations

from typing import Any

from .ast import DeleteStmt, InsertStmt, KeyspaceRef, ResultTerm, SelectStmt, UpdateStmt
from .merge import MergeStmt

__all__ = ["explain_dml"]

Dml = InsertStmt | DeleteStmt | UpdateStmt | MergeStmt


def _text(e: Any) -> str:
    return e.to_text().replace("\x00", "#")


def explain_dml(stmt: Dml, query: dict[str, Any] | None, *, cas: bool) -> dict[str, Any]:
    """``stmt``'s EXPLAIN: ``query`` is the plan of the query whose rows it writes (None for
    INSERT ... VALUES and a MERGE over an expression), then the write steps."""
    if isinstance(stmt, InsertStmt):
        kind = "UPSERT" if stmt.upsert else "INSERT"
        keyspace, steps = stmt.keyspace, _insert(stmt)
    elif isinstance(stmt, MergeStmt):
        kind, keyspace, steps = "MERGE", stmt.keyspace, _merge(stmt, cas)
    else:
        kind, keyspace = type(stmt).__name__.removesuffix("Stmt").upper(), stmt.target.name
        steps = _modify(stmt, cas)
    if stmt.returning:
        steps.append({"operator": "Returning", "terms": _terms(stmt.returning)})
    out: dict[str, Any] = {"statement": kind, "keyspace": keyspace}
    if query is not None:
        out["query"] = query
    out["plan"] = steps
    return out


def _insert(stmt: InsertStmt) -> list[dict[str, Any]]:
    send: dict[str, Any] = {"operator": "SendUpsert" if stmt.upsert else "SendInsert"}
    send["keyspace"] = stmt.keyspace
    if stmt.select is None:
        values = [[_text(k), _text(v)] for k, v in stmt.values]
        return [{"operator": "ValueScan", "values": values}, send]
    assert stmt.key is not None
    send["key"] = _text(stmt.key)
    send["value"] = "the row" if stmt.value is None else _text(stmt.value)
    return [send]


def _modify(stmt: DeleteStmt | UpdateStmt, cas: bool) -> list[dict[str, Any]]:
    alias = stmt.target.as_name
    steps = _checked_read(stmt.target.name, "the chosen ids", cas)
    if cas and stmt.where is not None:
        steps.append({"operator": "Filter", "condition": _text(stmt.where), "on": "each version"})
    if isinstance(stmt, UpdateStmt):
        steps.append(_set(stmt.set, stmt.unset))
    word = "SendDelete" if isinstance(stmt, DeleteStmt) else "SendUpdate"
    steps.append(_send(word, stmt.target.name, alias, cas))
    return steps


def _merge(stmt: MergeStmt, cas: bool) -> list[dict[str, Any]]:
    src = stmt.source
    steps: list[dict[str, Any]] = []
    if not isinstance(src, KeyspaceRef | SelectStmt):  # an expression: no query to plan
        steps.append({"operator": "ExpressionScan", "expr": _text(src), "as": stmt.source_alias})
    if stmt.limit is not None:
        steps.append({"operator": "Limit", "expr": _text(stmt.limit)})
    steps += _checked_read(stmt.keyspace, "the source rows' ON KEY", cas)
    merge: dict[str, Any] = {"operator": "Merge", "keyspace": stmt.keyspace, "as": stmt.alias}
    merge["on_key"] = _text(stmt.on_key)
    if stmt.update is not None:
        merge["update"] = _set(stmt.update.set, stmt.update.unset, stmt.update.where)
    if stmt.delete is not None:
        merge["delete"] = _where({}, stmt.delete.where)
    if stmt.insert is not None:
        merge["insert"] = _where({"value": _text(stmt.insert.value)}, stmt.insert.where)
    if cas:
        merge["under_cas"] = True  # the matched ones; an insert fails if one appeared
    steps.append(merge)
    return steps


def _checked_read(keyspace: str, ids: str, cas: bool) -> list[dict[str, Any]]:
    if not cas:
        return []
    return [{"operator": "FetchWithCas", "keyspace": keyspace, "ids": ids, "on": "owners"}]


def _send(word: str, keyspace: str, alias: str, cas: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"operator": word, "keyspace": keyspace, "as": alias}
    if cas:
        out["under_cas"] = True  # a CAS mismatch reads and decides again
    return out


def _set(sets: Any, unsets: Any, where: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"operator": "Set"}
    out["set"] = [{"path": _text(p), "expr": _text(e)} for p, e in sets]
    if unsets:
        out["unset"] = [_text(p) for p in unsets]
    return _where(out, where)


def _where(out: dict[str, Any], where: Any) -> dict[str, Any]:
    if where is not None:
        out["where"] = _text(where)
    return out


def _terms(terms: tuple[ResultTerm, ...]) -> list[dict[str, Any]]:
    return [
        {
            "expr": "*" if t.expr is None else _text(t.expr),
            **({"as": t.alias} if t.alias else {}),
            **({"star": True} if t.star else {}),
        }
        for t in terms
    ]
