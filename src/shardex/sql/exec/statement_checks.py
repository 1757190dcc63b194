"""What a node checks of a statement before it runs it: its size (before parsing), its memory
quota against the node's maximum, and the user's privileges for what it does. Shared by the
RPC path (``SqlQuery``) and the HTTP query service."""

from __future__ import annotations

from typing import Final

from shardex.api.privileges import Privilege, require
from shardex.net import Principal
from shardex.sql.exec.memory import MIN_QUERY_MEMORY
from shardex.sql.exec.statements import bad_request, merge_select
from shardex.sql.exec.subqueries import subquery_keyspaces
from shardex.sql.syntax import (
    DeleteStmt,
    ExplainStmt,
    InsertStmt,
    SelectStmt,
    UpdateStmt,
    cte_names,
)
from shardex.sql.syntax.ast import ResultTerm, SetOpStmt, WithStmt
from shardex.sql.syntax.merge import MergeStmt

__all__ = [
    "MAX_STATEMENT_BYTES",
    "MAX_TIMEOUT",
    "MIN_LEFT",
    "check_memory_quota",
    "check_statement",
    "check_statement_size",
    "time_left",
]

MAX_TIMEOUT: Final = 3600.0
MIN_LEFT: Final = 0.001  # what a step started at the end of its statement's timeout gets
# The longest statement text a node takes, in UTF-8 bytes: checked before parsing (a
# megabyte of SQL already costs seconds to parse; values that large belong in parameters).
MAX_STATEMENT_BYTES: Final = 1 << 20


def time_left(deadline: float, now: float) -> float:
    """Seconds of a statement's timeout left at ``now`` (both loop times), at least
    ``MIN_LEFT``: every step of a statement (a pin, a query, a fallback) gets what its
    earlier steps left, and one started at the deadline times out with its own error."""
    return max(deadline - now, MIN_LEFT)


def check_statement_size(sql: str, limit: int) -> None:
    """BAD_REQUEST naming the size and the limit when ``sql`` is over ``limit`` UTF-8 bytes;
    run before the text is parsed."""
    if len(sql) <= limit // 4:  # at most 4 bytes a character: surely within
        return
    size = len(sql.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise bad_request(
            f"statement is {size} bytes, over the limit of {limit} bytes",
            size=size,
            limit=limit,
            hint="pass large values as parameters ($name) or split the statement",
        )


def check_memory_quota(quota: object, most: int) -> None:
    """BAD_REQUEST naming the value and the limit unless ``quota`` (None: the node's
    default) is bytes in [``MIN_QUERY_MEMORY``, ``most``]: a client may lower its budget,
    never raise it past the node's per-query maximum (``sql_query_memory``)."""
    if quota is None:
        return
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < MIN_QUERY_MEMORY:
        raise bad_request(
            f"memory_quota must be a number of bytes >= {MIN_QUERY_MEMORY}, got {quota!r:.80}",
            value=repr(quota)[:80],
            limit=most,
            hint=f"give bytes between {MIN_QUERY_MEMORY} and {most}, or leave it out",
        )
    if quota > most:
        raise bad_request(
            f"memory_quota {quota} bytes is over this node's per-query maximum of "
            f"{most} bytes (sql_query_memory)",
            value=quota,
            limit=most,
            hint=f"ask for at most {most} bytes, or raise sql_query_memory on the nodes",
        )


def check_statement(principal: Principal | None, stmt: object) -> None:
    """A user's statement against its roles (``shardex.api.privileges``): SELECT and EXPLAIN
    need query.select on their keyspace, INSERT, UPSERT, UPDATE and DELETE query.update.
    ``None``: a connection this node dialled, a node's."""
    if principal is None or principal.is_node:
        return
    for keyspace in sorted(subquery_keyspaces(stmt)):  # a subquery reads as a SELECT does
        require(principal, (Privilege.QUERY_SELECT,), keyspace, "SELECT")
    if isinstance(stmt, ExplainStmt):
        stmt = stmt.statement
    if isinstance(stmt, SetOpStmt):  # each branch reads as the SELECT it is
        for branch in stmt.branches:
            check_statement(principal, branch)
        return
    if isinstance(stmt, WithStmt):  # each term and the query, the WITH names no keyspaces
        names: list[str] = []
        for term in stmt.terms:
            with cte_names.visible(names):
                check_statement(principal, term.query or SelectStmt(terms=(ResultTerm(term.expr),)))
            names.append(term.name)
        with cte_names.visible(names):
            check_statement(principal, stmt.body)
        return
    if isinstance(stmt, SelectStmt):
        ref = stmt.from_
        # FROM (expr) or FROM a WITH name: no keyspace is read
        if ref is not None and ref.name and cte_names.reference(ref.name) is None:
            require(principal, (Privilege.QUERY_SELECT,), ref.name, "SELECT")
        for j in stmt.joins:  # a joined keyspace is read as FROM's is
            require(principal, (Privilege.QUERY_SELECT,), j.target.name, "SELECT")
    elif isinstance(stmt, InsertStmt):
        kind = "UPSERT" if stmt.upsert else "INSERT"
        require(principal, (Privilege.QUERY_UPDATE,), stmt.keyspace, kind)
        if stmt.select is not None:  # INSERT ... SELECT reads as its query does
            check_statement(principal, stmt.select)
    elif isinstance(stmt, DeleteStmt | UpdateStmt):
        kind = "DELETE" if isinstance(stmt, DeleteStmt) else "UPDATE"
        require(principal, (Privilege.QUERY_UPDATE,), stmt.target.name, kind)
    elif isinstance(stmt, MergeStmt):
        require(principal, (Privilege.QUERY_UPDATE,), stmt.keyspace, "MERGE")
        source = merge_select(stmt)  # the source is read as a SELECT reads it
        if source is not None:
            check_statement(principal, source)
