"""The SELECTs DML statements derive: what a DELETE / UPDATE changes (``dml_select``) and
the rows MERGE reads (``merge_select``). The distributed plan runs them to choose the
documents; EXPLAIN shows their plans in both engines."""

from __future__ import annotations

from shardex.core.expr import Field, Identifier, Meta

from .ast import DeleteStmt, KeyspaceRef, ResultTerm, SelectStmt, UpdateStmt
from .merge import MergeStmt

__all__ = ["dml_select", "merge_select"]


def dml_select(stmt: DeleteStmt | UpdateStmt) -> SelectStmt:
    """The SELECT that finds what a DELETE / UPDATE changes: each row's id (the write reads
    the document again at its owner, under its CAS: shipping it here would be wasted)."""
    alias = stmt.target.as_name
    terms = (ResultTerm(Field(Meta(alias), "id"), "id"),)
    return SelectStmt(terms=terms, from_=stmt.target, where=stmt.where, limit=stmt.limit)


def merge_select(stmt: MergeStmt) -> SelectStmt | None:
    """The SELECT that reads MERGE's source rows (the leaves derive it from the statement
    text, like DELETE's): a keyspace's documents with their ids, or the source SELECT
    itself; None for an expression source (evaluated on the initiator)."""
    src = stmt.source
    if isinstance(src, KeyspaceRef):
        alias = src.as_name
        terms = (
            ResultTerm(Identifier(alias), "v"),
            ResultTerm(Field(Meta(alias), "id"), "id"),
        )
        return SelectStmt(terms=terms, from_=src)
    if isinstance(src, SelectStmt):
        return src
    return None
