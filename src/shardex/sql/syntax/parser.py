"""The SQL++ statement parser: one entry point, ``parse_statement``, for SELECT (and set
operations and WITH), EXPLAIN, INSERT/UPSERT, DELETE, UPDATE, PREPARE/EXECUTE and the index
DDL.

``SqlParser`` extends ``DDLParser`` (itself the expression ``Parser``), so statements,
DDL and expressions share one tokenizer, one set of token helpers and one error shape:
``SqlSyntaxError`` (SQL_SYNTAX) whose message names line, column and token, with
``details`` line, column, token, text and, where it helps, expected and hint.

Grammar (keywords case-insensitive, ``;`` optional at the end)::

    SELECT [DISTINCT|ALL] [RAW|VALUE|ELEMENT] term {, term}
      [FROM keyspace [[AS] alias] [USE INDEX (name {, name})] [USE KEYS expr]
            | FROM (expr) [AS] alias | FROM var.path [[AS] alias]]
      {[LEFT [OUTER] | INNER] UNNEST expr [[AS] alias] | join}
      [LET name = expr {, ...}] [WHERE expr]
      [GROUP BY expr {, expr} [LETTING name = expr {, ...}]] [HAVING expr]
      [WINDOW name AS (window) {, ...}]
      [ORDER BY expr [ASC|DESC] [NULLS FIRST|LAST] {, ...}] [LIMIT expr] [OFFSET expr]
    term: * | expr.* | expr [[AS] alias]
    join: [INNER | LEFT [OUTER] | RIGHT [OUTER]] JOIN|NEST keyspace [[AS] alias]
          [USE INDEX (name) | USE HASH(BUILD|PROBE) | USE NL]
          ON KEYS expr | ON KEY alias.path FOR alias | ON cond   (see ``join_syntax``)
    EXPLAIN select
    query: select | query {UNION|INTERSECT|EXCEPT} [ALL] (select | (query))
      [ORDER BY ...] [LIMIT expr] [OFFSET expr]        (parse_queries.py)
    WITH name AS (query | expr) {, ...} query
    EXPLAIN query | EXPLAIN WITH ... | EXPLAIN dml | EXPLAIN EXECUTE ...
    INSERT|UPSERT INTO keyspace [(KEY, VALUE)] VALUES (k, v) {, [VALUES] (k, v)}
      [RETURNING terms]
    INSERT|UPSERT INTO keyspace (KEY expr [, VALUE expr]) query [RETURNING terms]
    PREPARE [FORCE] [name FROM|AS] statement    EXECUTE name [USING expr]
    DELETE FROM keyspace [[AS] alias] [USE KEYS expr] [WHERE expr] [LIMIT expr]
      [RETURNING terms]
    UPDATE keyspace [[AS] alias] [USE KEYS expr] [SET path = expr {, ...}]
      [UNSET path {, ...}] [WHERE expr] [LIMIT expr] [RETURNING terms]

Expressions add to the expression language: ``ANY|SOME|EVERY|ANY AND EVERY v IN coll
SATISFIES cond END``, ``ARRAY|FIRST expr FOR v IN coll [WHEN cond] END``, subquery
expressions ``(query)`` / ``(WITH ...)`` and ``EXISTS expr``, the aggregates COUNT(*),
COUNT/SUM/AVG/MIN/MAX/ARRAY_AGG([DISTINCT] expr) and the statistical ones, and window
functions ``fn(...) OVER (...)`` / ``OVER name`` (``parse_windows.py``).
"""

from __future__ import annotations

import shardex.sql.syntax.comprehension  # noqa: F401 - registers the evaluators of the new nodes
from shardex.core.expr import Expr, Identifier, Token, TokenKind
from shardex.core.expr.ast import EXPRESSION_KEYWORDS
from shardex.sql.ddl import DDL_KEYWORDS, DDLStatement
from shardex.sql.syntax.join_syntax import parse_join_term

from .ast import (
    AGGREGATES,
    SELF_NAME,
    WINDOW_FUNCTIONS,
    Aggregate,
    ArrayComprehension,
    Binding,
    CollectionPredicate,
    DeleteStmt,
    ExecuteStmt,
    Exists,
    ExplainStmt,
    InsertStmt,
    JoinTerm,
    PrepareStmt,
    ResultTerm,
    SelectStmt,
    SetOpStmt,
    SetOpSubquery,
    Subquery,
    UnnestTerm,
    UpdateStmt,
    WithStmt,
)
from .clauses import SQL_KEYWORDS, ClauseParser, implied_alias
from .merge import MergeStmt, parse_merge
from .parse_queries import (
    at_query_in_parens,
    at_with_subquery,
    parse_execute,
    parse_insert_select,
    parse_prepare,
    parse_query,
    parse_query_tail,
    parse_with,
    parse_with_subquery,
)
from .parse_windows import (
    at_window_clause,
    parse_over_aggregate,
    parse_window_clause,
    parse_window_function,
)

Statement = (
    PrepareStmt
    | ExecuteStmt
    | SelectStmt
    | SetOpStmt
    | WithStmt
    | ExplainStmt
    | InsertStmt
    | DeleteStmt
    | UpdateStmt
    | MergeStmt
    | DDLStatement
)
_STATEMENT_WORDS = (
    "SELECT, WITH, EXPLAIN, INSERT, UPSERT, UPDATE, DELETE, MERGE, PREPARE, EXECUTE, CREATE, "
    "BUILD or DROP"
)


class SqlParser(ClauseParser):
    reserved = EXPRESSION_KEYWORDS | DDL_KEYWORDS | SQL_KEYWORDS

    # -- statements -------------------------------------------------------------------------

    def parse_statement(self) -> Statement:  # type: ignore[override]
        tok = self.peek()
        word = tok.upper
        if word in ("CREATE", "BUILD", "DROP"):
            return super().parse_statement()
        stmt: Statement
        if word == "PREPARE" and tok.kind is TokenKind.IDENT:
            stmt = parse_prepare(self)
        elif word == "EXECUTE" and tok.kind is TokenKind.IDENT:
            stmt = parse_execute(self)
        else:
            stmt = self.parse_dml_or_query()
        self.accept(";")
        if not self.at_end():
            self.error(self.peek(), expected="the end of the statement")
        return stmt

    def parse_dml_or_query(self) -> Statement:
        """A query (SELECT, set operation, WITH, EXPLAIN) or a DML statement."""
        tok = self.peek()
        word = tok.upper
        stmt: Statement
        if word == "SELECT" or at_query_in_parens(self):
            stmt = parse_query(self)
        elif word == "WITH" and tok.kind is TokenKind.IDENT:
            stmt = parse_with(self)
        elif self.accept_keyword("EXPLAIN"):
            stmt = self.parse_explained()
        elif word in ("INSERT", "UPSERT"):
            stmt = self.parse_insert()
        elif word == "DELETE":
            stmt = self.parse_delete()
        elif word == "UPDATE":
            stmt = self.parse_update()
        elif word == "MERGE":
            stmt = parse_merge(self)
        else:
            self.error(
                tok,
                "not a statement" if tok.kind is not TokenKind.EOF else "empty statement",
                expected=_STATEMENT_WORDS,
            )
        return stmt

    def parse_explained(self) -> ExplainStmt:
        """What follows EXPLAIN: a query, a DML statement or EXECUTE."""
        tok = self.peek()
        word = tok.upper if tok.kind is TokenKind.IDENT else ""
        if word == "EXECUTE":
            return ExplainStmt(parse_execute(self))
        if word in ("WITH", "SELECT", "INSERT", "UPSERT", "DELETE", "UPDATE", "MERGE"):
            return ExplainStmt(self.parse_dml_or_query())
        if at_query_in_parens(self):
            return ExplainStmt(parse_query(self))
        self.error(
            tok,
            expected="SELECT, WITH, INSERT, UPSERT, DELETE, UPDATE, MERGE or EXECUTE after EXPLAIN",
        )

    def parse_select(self, *, tail: bool = True) -> SelectStmt:
        """One SELECT; ``tail`` False leaves its ORDER BY / LIMIT / OFFSET to the caller (a
        set operation's branch, whose trailing clauses belong to the whole)."""
        self.expect_keyword("SELECT")
        distinct = self.accept_keyword("DISTINCT") is not None
        if not distinct:
            self.accept_keyword("ALL")
        raw = False
        if self.peek().upper in ("RAW", "VALUE", "ELEMENT"):
            self.advance()
            raw = True
        if raw:
            terms: tuple[ResultTerm, ...] = (ResultTerm(self.parse_expr()),)
        else:
            terms = self.parse_terms()
        from_ = self.parse_from() if self.accept_keyword("FROM") else None
        unnests, joins = self.parse_from_terms() if from_ is not None else ((), ())
        let = self.parse_bindings() if self.accept_keyword("LET") else ()
        where = self.parse_expr() if self.accept_keyword("WHERE") else None
        group_by: tuple[Expr, ...] = ()
        letting: tuple[tuple[str, Expr], ...] = ()
        if self.accept_keyword("GROUP"):
            self.expect_keyword("BY")
            group_by = tuple(self.parse_expr_list())
            if self.accept_keyword("LETTING"):
                letting = self.parse_bindings()
        having_tok = self.peek()
        having = self.parse_expr() if self.accept_keyword("HAVING") else None
        if having is not None and not group_by and from_ is None:
            self.error(having_tok, "HAVING needs a FROM clause")
        windows = parse_window_clause(self) if at_window_clause(self) else ()
        order_by, limit, offset = parse_query_tail(self) if tail else ((), None, None)
        return SelectStmt(
            terms=terms,
            raw=raw,
            distinct=distinct,
            from_=from_,
            let=let,
            where=where,
            group_by=group_by,
            letting=letting,
            having=having,
            order_by=order_by,
            limit=limit,
            offset=offset,
            unnests=unnests,
            joins=joins,
            windows=windows,
        )

    def parse_from_terms(self) -> tuple[tuple[UnnestTerm, ...], tuple[JoinTerm, ...]]:
        """The terms after the FROM term, in order: ``{[LEFT [OUTER] | INNER] UNNEST expr
        [[AS] alias]}`` and JOIN / NEST terms (``join_syntax``), each join placed after the
        UNNESTs before it."""
        unnests: list[UnnestTerm] = []
        joins: list[JoinTerm] = []
        while True:
            kind = "inner"
            start = self.peek()
            prefixed = self.at_unnest_prefix()
            if prefixed:
                kind = self.advance().upper.lower()
                if kind != "inner":
                    self.accept_keyword("OUTER")
            if self.at_keyword("JOIN") or self.at_keyword("NEST"):
                first = not unnests and not joins
                joins.append(parse_join_term(self, kind, start, len(unnests), first))
                continue
            if not self.accept_keyword("UNNEST"):
                if prefixed:
                    self.error(self.peek(), expected="JOIN, NEST or UNNEST")
                return tuple(unnests), tuple(joins)
            if kind == "right":
                self.error(start, "RIGHT applies to a JOIN, not to UNNEST", expected="LEFT")
            tok = self.peek()
            expr = self.parse_expr()
            alias = self.parse_optional_alias() or implied_alias(expr)
            if alias is None:
                self.error(tok, f"UNNEST {expr.to_text()} needs an alias", expected="AS")
            unnests.append(UnnestTerm(expr, alias, kind == "left"))

    def parse_insert(self) -> InsertStmt:
        upsert = self.advance().upper == "UPSERT"
        self.expect_keyword("INTO")
        keyspace = self.parse_name("keyspace")
        if self.accept_keyword("AS"):
            self.parse_alias()
        if self.accept("("):
            self.expect_keyword("KEY")
            if not self.at_op(","):
                return parse_insert_select(self, keyspace, upsert)
            self.expect(",", "',' VALUE")
            self.expect_keyword("VALUE")
            self.expect(")", "')' after (KEY, VALUE")
        self.expect_keyword("VALUES")
        values = [self.parse_key_value()]
        while self.accept(","):
            self.accept_keyword("VALUES")
            values.append(self.parse_key_value())
        returning = self.parse_returning()
        return InsertStmt(keyspace, tuple(values), upsert=upsert, returning=returning)

    def parse_key_value(self) -> tuple[Expr, Expr]:
        self.expect("(", "'(' and a key, value pair")
        key = self.parse_expr()
        self.expect(",", "',' and the document value")
        value = self.parse_expr()
        self.expect(")", "')' after the document value")
        return key, value

    def parse_delete(self) -> DeleteStmt:
        self.expect_keyword("DELETE")
        self.expect_keyword("FROM")
        target = self.parse_target()
        where = self.parse_expr() if self.accept_keyword("WHERE") else None
        limit = self.parse_expr() if self.accept_keyword("LIMIT") else None
        return DeleteStmt(target, where=where, limit=limit, returning=self.parse_returning())

    def parse_update(self) -> UpdateStmt:
        self.expect_keyword("UPDATE")
        target = self.parse_target()
        sets, unsets = self.parse_set_unset()
        where = self.parse_expr() if self.accept_keyword("WHERE") else None
        limit = self.parse_expr() if self.accept_keyword("LIMIT") else None
        return UpdateStmt(
            target,
            set=sets,
            unset=unsets,
            where=where,
            limit=limit,
            returning=self.parse_returning(),
        )

    # -- expression extensions ---------------------------------------------------------------

    def parse_primary(self) -> Expr:
        tok = self.peek()
        word = tok.upper
        if word in ("ANY", "SOME", "EVERY") and not self.at_op("(", 1):
            return self.parse_collection_predicate()
        if word in ("ARRAY", "FIRST") and not self.at_op("(", 1):
            return self.parse_array_comprehension()
        if tok.text == "(" and tok.kind is TokenKind.OP and self.at_keyword("SELECT", 1):
            return self.parse_subquery()
        if at_with_subquery(self):
            return parse_with_subquery(self)
        if word == "EXISTS" and tok.kind is TokenKind.IDENT:
            self.advance()
            return Exists(self.parse_postfix(self.parse_primary()))
        if word == "SELF" and tok.kind is TokenKind.IDENT and not self.at_op("(", 1):
            self.advance()
            return Identifier(SELF_NAME)
        return super().parse_primary()

    def parse_in_rhs(self) -> Expr:
        if self.at_op("(") and self.at_keyword("SELECT", 1):
            return self.parse_postfix(self.parse_subquery())
        return super().parse_in_rhs()

    def parse_subquery(self) -> Expr:
        start = self.advance()
        select = parse_query(self)
        end = self.expect(")", "')' after the subquery")
        text = self.text[start.offset + 1 : end.offset].strip() if self.text else "SELECT ..."
        if isinstance(select, SetOpStmt):
            return SetOpSubquery(select, text)
        return Subquery(select, text)

    def postfix_ends(self) -> bool:
        # ".*" is left to the projection-term parser.
        return self.at_op(".") and self.at_op("*", 1)

    def parse_collection_predicate(self) -> Expr:
        tok = self.advance()
        quantifier = "EVERY" if tok.upper == "EVERY" else "ANY"
        if quantifier == "ANY" and self.at_keyword("AND") and self.at_keyword("EVERY", 1):
            self.advance()
            self.advance()
            quantifier = "ANY AND EVERY"
        bindings = self.parse_comprehension_bindings()
        self.expect_keyword("SATISFIES")
        cond = self.parse_expr()
        self.expect_keyword("END")
        return CollectionPredicate(quantifier, bindings, cond)

    def parse_array_comprehension(self) -> Expr:
        first = self.advance().upper == "FIRST"
        mapping = self.parse_expr()
        self.expect_keyword("FOR")
        bindings = self.parse_comprehension_bindings()
        when = self.parse_expr() if self.accept_keyword("WHEN") else None
        self.expect_keyword("END")
        return ArrayComprehension(mapping, bindings, when, first)

    def parse_comprehension_bindings(self) -> tuple[Binding, ...]:
        out: list[Binding] = []
        while True:
            var = self.parse_alias()
            if self.accept_keyword("WITHIN"):
                within = True
            else:
                self.expect_keyword("IN")
                within = False
            out.append(Binding(var, self.parse_expression(), within))
            if not self.accept(","):
                return tuple(out)

    def parse_call(self, name_tok: Token, name: str) -> Expr:
        upper = name.upper()
        if upper in WINDOW_FUNCTIONS:
            return parse_window_function(self, name_tok, upper)
        if upper not in AGGREGATES:
            return super().parse_call(name_tok, name)
        self.expect("(")
        if self.accept("*"):
            if upper != "COUNT":
                self.error(self.tokens[self.pos - 1], f"{upper}(*) is not allowed; only COUNT(*)")
            self.expect(")", "')' after COUNT(*")
            return parse_over_aggregate(self, Aggregate("COUNT", None))
        distinct = self.accept_keyword("DISTINCT") is not None
        if not distinct:
            self.accept_keyword("ALL")
        arg = self.parse_expression()
        self.expect(")", f"')' ({upper} takes one argument)")
        return parse_over_aggregate(self, Aggregate(upper, arg, distinct))


def parse_statement(text: str) -> Statement:
    """Parse one SQL++ statement (query, DML or index DDL). Raises ``SqlSyntaxError``
    (SQL_SYNTAX) naming line, column and token."""
    return SqlParser.for_text(text).parse_statement()


def parse_select(text: str) -> SelectStmt:
    stmt = parse_statement(text)
    if isinstance(stmt, ExplainStmt):
        stmt = stmt.statement  # type: ignore[assignment]
    if not isinstance(stmt, SelectStmt):
        raise TypeError(f"not a SELECT: {text!r}")
    return stmt
