"""The SQL++ statement parser: one entry point, ``parse_statement``, for SELECT, EXPLAIN,
INSERT/UPSERT, DELETE, UPDATE and the index DDL.

``SqlParser`` extends ``DDLParser`` (itself the expression ``Parser``), so statements,
DDL and expressions share one tokenizer, one set of token helpers and one error shape:
``SqlSyntaxError`` (SQL_SYNTAX) whose message names line, column and token, with
``details`` line, column, token, text and, where it helps, expected and hint.

Grammar (keywords case-insensitive, ``;`` optional at the end)::

    SELECT [DISTINCT|ALL] [RAW|VALUE|ELEMENT] term {, term}
      [FROM keyspace [[AS] alias] [USE INDEX (name {, name})] [USE KEYS expr]
            | FROM (expr) [AS] alias | FROM var.path [[AS] alias]]
      {[LEFT [OUTER] | INNER] UNNEST expr [[AS] alias]}
      [LET name = expr {, ...}] [WHERE expr]
      [GROUP BY expr {, expr} [LETTING name = expr {, ...}]] [HAVING expr]
      [ORDER BY expr [ASC|DESC] [NULLS FIRST|LAST] {, ...}] [LIMIT expr] [OFFSET expr]
    term: * | expr.* | expr [[AS] alias]
    EXPLAIN select
    INSERT|UPSERT INTO keyspace [(KEY, VALUE)] VALUES (k, v) {, [VALUES] (k, v)}
      [RETURNING terms]
    DELETE FROM keyspace [[AS] alias] [USE KEYS expr] [WHERE expr] [LIMIT expr]
      [RETURNING terms]
    UPDATE keyspace [[AS] alias] [USE KEYS expr] [SET path = expr {, ...}]
      [UNSET path {, ...}] [WHERE expr] [LIMIT expr] [RETURNING terms]

Expressions add to the expression language: ``ANY|SOME|EVERY|ANY AND EVERY v IN coll
SATISFIES cond END``, ``ARRAY|FIRST expr FOR v IN coll [WHEN cond] END``, subquery
expressions ``(SELECT ...)`` and ``EXISTS expr``, and the aggregates COUNT(*),
COUNT/SUM/AVG/MIN/MAX/ARRAY_AGG([DISTINCT] expr) and the statistical ones.
"""

from __future__ import annotations

import dataclasses
import uuid

import shardex.sql.syntax.comprehension  # noqa: F401 - registers the evaluators of the new nodes
from shardex.core.expr import Expr, Field, Identifier, Index, Literal, Token, TokenKind
from shardex.core.expr.ast import EXPRESSION_KEYWORDS
from shardex.sql.ddl import DDL_KEYWORDS, DDLParser, DDLStatement

from .ast import (
    AGGREGATES,
    FRAMELESS,
    SELF_NAME,
    SET_OPERATORS,
    WINDOW_FUNCTIONS,
    Aggregate,
    ArrayComprehension,
    Binding,
    CollectionPredicate,
    DeleteStmt,
    ExecuteStmt,
    Exists,
    ExplainStmt,
    Frame,
    FrameBound,
    InsertStmt,
    KeyspaceRef,
    OrderTerm,
    PrepareStmt,
    ResultTerm,
    SelectStmt,
    SetOpStmt,
    SetOpSubquery,
    Subquery,
    UnnestTerm,
    UpdateStmt,
    WindowCall,
    WithStmt,
    WithSubquery,
    WithTerm,
)

SQL_KEYWORDS = frozenset(
    {
        "SELECT",
        "FROM",
        "WHERE",
        "GROUP",
        "HAVING",
        "ORDER",
        "LIMIT",
        "OFFSET",
        "AS",
        "LET",
        "LETTING",
        "RAW",
        "VALUE",
        "ELEMENT",
        "DISTINCT",
        "ALL",
        "INSERT",
        "UPSERT",
        "DELETE",
        "UPDATE",
        "SET",
        "UNSET",
        "INTO",
        "VALUES",
        "KEY",
        "KEYS",
        "USE",
        "SATISFIES",
        "ANY",
        "SOME",
        "EVERY",
        "ARRAY",
        "FIRST",
        "FOR",
        "WITHIN",
        "EXPLAIN",
        "NULLS",
        "RETURNING",
        "UNION",
        "INTERSECT",
        "EXCEPT",
        "JOIN",
        "NEST",
        "UNNEST",
    }
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
    | DDLStatement
)

_STATEMENT_WORDS = (
    "SELECT, WITH, EXPLAIN, INSERT, UPSERT, UPDATE, DELETE, PREPARE, EXECUTE, CREATE, BUILD or DROP"
)
# Words that end a projection term / FROM clause when no AS precedes an alias.
_CLAUSE_WORDS = SQL_KEYWORDS | DDL_KEYWORDS | EXPRESSION_KEYWORDS


class SqlParser(DDLParser):
    reserved = EXPRESSION_KEYWORDS | DDL_KEYWORDS | SQL_KEYWORDS

    # -- statements -------------------------------------------------------------------------

    def parse_statement(self) -> Statement:  # type: ignore[override]
        tok = self.peek()
        word = tok.upper
        if word in ("CREATE", "BUILD", "DROP"):
            return super().parse_statement()
        stmt: Statement
        if word == "PREPARE" and tok.kind is TokenKind.IDENT:
            stmt = self.parse_prepare()
        elif word == "EXECUTE" and tok.kind is TokenKind.IDENT:
            stmt = self.parse_execute()
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
        if word == "SELECT" or self.at_query_in_parens():
            stmt = self.parse_query()
        elif word == "WITH" and tok.kind is TokenKind.IDENT:
            stmt = self.parse_with()
        elif self.accept_keyword("EXPLAIN"):
            if self.peek().upper == "WITH":
                stmt = ExplainStmt(self.parse_with())
            else:
                if not (self.at_keyword("SELECT") or self.at_query_in_parens()):
                    self.error(self.peek(), expected="SELECT after EXPLAIN")
                stmt = ExplainStmt(self.parse_query())
        elif word in ("INSERT", "UPSERT"):
            stmt = self.parse_insert()
        elif word == "DELETE":
            stmt = self.parse_delete()
        elif word == "UPDATE":
            stmt = self.parse_update()
        else:
            self.error(
                tok,
                "not a statement" if tok.kind is not TokenKind.EOF else "empty statement",
                expected=_STATEMENT_WORDS,
            )
        return stmt

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
        unnests = self.parse_unnests() if from_ is not None else ()
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
        order_by, limit, offset = self.parse_query_tail() if tail else ((), None, None)
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
        )

    def parse_unnests(self) -> tuple[UnnestTerm, ...]:
        """``{[LEFT [OUTER] | INNER] UNNEST expr [[AS] alias]}`` after the FROM term."""
        out: list[UnnestTerm] = []
        while True:
            outer = False
            if self.at_unnest_prefix():
                outer = self.advance().upper == "LEFT"
                if outer:
                    self.accept_keyword("OUTER")
            if not self.accept_keyword("UNNEST"):
                return tuple(out)
            tok = self.peek()
            expr = self.parse_expr()
            alias = self.parse_optional_alias() or implied_alias(expr)
            if alias is None:
                self.error(tok, f"UNNEST {expr.to_text()} needs an alias", expected="AS")
            out.append(UnnestTerm(expr, alias, outer))

    def parse_insert(self) -> InsertStmt:
        upsert = self.advance().upper == "UPSERT"
        self.expect_keyword("INTO")
        keyspace = self.parse_name("keyspace")
        if self.accept_keyword("AS"):
            self.parse_alias()
        if self.accept("("):
            self.expect_keyword("KEY")
            if not self.at_op(","):
                return self.parse_insert_select(keyspace, upsert)
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

    def parse_insert_select(self, keyspace: str, upsert: bool) -> InsertStmt:
        """``... (KEY key_expr [, VALUE value_expr]) query [RETURNING ...]``."""
        key = self.parse_expr()
        value = self.parse_expr() if self.accept(",") and self.expect_keyword("VALUE") else None
        self.expect(")", "')' after the KEY and VALUE expressions")
        start = self.peek()
        if start.upper == "WITH" and start.kind is TokenKind.IDENT:
            select: SelectStmt | SetOpStmt | WithStmt = self.parse_with()
        elif self.at_keyword("SELECT") or self.at_query_in_parens():
            select = self.parse_query()
        else:
            self.error(start, expected="the SELECT whose results are inserted")
        text = self.source_between(start.offset, self.peek().offset)  # up to any RETURNING
        returning = self.parse_returning()
        return InsertStmt(
            keyspace,
            (),
            upsert=upsert,
            returning=returning,
            select=select,
            key=key,
            value=value,
            select_text=text,
        )

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
        sets: list[tuple[Expr, Expr]] = []
        unsets: list[Expr] = []

        def assignment() -> tuple[Expr, Expr]:
            path = self.parse_path()
            self.expect("=", "'=' and the new value")
            return path, self.parse_expr()

        if self.accept_keyword("SET"):
            sets = self.comma_list(assignment)
        if self.accept_keyword("UNSET"):
            unsets = self.comma_list(self.parse_path)
        if not sets and not unsets:
            self.error(self.peek(), expected="SET or UNSET")
        where = self.parse_expr() if self.accept_keyword("WHERE") else None
        limit = self.parse_expr() if self.accept_keyword("LIMIT") else None
        return UpdateStmt(
            target,
            set=tuple(sets),
            unset=tuple(unsets),
            where=where,
            limit=limit,
            returning=self.parse_returning(),
        )

    # -- clauses ----------------------------------------------------------------------------

    def parse_terms(self) -> tuple[ResultTerm, ...]:
        return tuple(self.comma_list(self.parse_term))

    def parse_term(self) -> ResultTerm:
        if self.accept("*"):
            return ResultTerm(None, star=True)
        expr = self.parse_expr()
        if self.at_op(".") and self.at_op("*", 1):
            self.advance()
            self.advance()
            return ResultTerm(expr, star=True)
        return ResultTerm(expr, self.parse_optional_alias())

    def parse_optional_alias(self) -> str | None:
        if self.accept_keyword("AS"):
            return self.parse_alias()
        tok = self.peek()
        if self.at_unnest_prefix():
            return None
        if tok.kind is TokenKind.QIDENT or (
            tok.kind is TokenKind.IDENT and tok.upper not in _CLAUSE_WORDS
        ):
            return self.parse_alias()
        return None

    def at_unnest_prefix(self) -> bool:
        """At ``LEFT [OUTER] UNNEST`` / ``INNER UNNEST`` (LEFT and INNER are not reserved:
        they stay usable as names elsewhere)."""
        if self.peek().kind is not TokenKind.IDENT:
            return False
        word, nxt = self.peek().upper, self.peek(1).upper
        return (word == "LEFT" and nxt in ("OUTER", "UNNEST")) or (
            word == "INNER" and nxt == "UNNEST"
        )

    def parse_alias(self) -> str:
        tok = self.peek()
        if tok.kind is TokenKind.QIDENT:
            self.advance()
            return str(tok.value)
        if tok.kind is TokenKind.IDENT and tok.upper not in self.reserved:
            self.advance()
            return tok.text
        if tok.kind is TokenKind.IDENT:
            self.error(
                tok,
                f"reserved word {tok.describe()} cannot be an alias (quote it with back-ticks)",
                expected="an alias",
            )
        self.error(tok, expected="an alias")

    def parse_from(self) -> KeyspaceRef:
        # An expression term: a literal or parenthesised value, or a path into a variable
        # (``FROM o.lines`` in a subquery over its outer row's ``o``).
        path_start = self.peek().kind in (TokenKind.IDENT, TokenKind.QIDENT) and (
            self.at_op(".", 1) or self.at_op("[", 1)
        )
        if self.at_op("(") or self.at_op("[") or self.at_op("{") or path_start:
            source = self.parse_expr()
            alias = self.parse_optional_alias() or implied_alias(source)
            if alias is None:
                self.error(self.peek(), "an expression in FROM needs an alias", expected="AS")
            return KeyspaceRef("", alias, source=source)
        return self.parse_target()

    def parse_target(self) -> KeyspaceRef:
        name = self.parse_name("keyspace")
        alias = self.parse_optional_alias()
        use_index: tuple[str, ...] = ()
        use_keys: Expr | None = None
        while self.accept_keyword("USE"):
            if self.accept_keyword("INDEX"):
                self.expect("(", "'(' and index names")
                names = self.comma_list(lambda: self.parse_name("index"))
                if self.accept_keyword("USING"):
                    self.expect_keyword("GSI")
                self.expect(")", "',' or ')'")
                use_index = tuple(names)
            elif self.accept_keyword("KEYS"):
                use_keys = self.parse_expr()
            else:
                self.error(self.peek(), expected="INDEX or KEYS after USE")
        return KeyspaceRef(name, alias, use_index=use_index, use_keys=use_keys)

    def parse_bindings(self) -> tuple[tuple[str, Expr], ...]:
        out: list[tuple[str, Expr]] = []
        while True:
            name = self.parse_alias()
            if any(n == name for n, _ in out):
                self.error(self.tokens[self.pos - 1], f"variable {name!r} bound twice")
            self.expect("=", "'=' and the value")
            out.append((name, self.parse_expr()))
            if not self.accept(","):
                return tuple(out)

    def parse_expr_list(self) -> list[Expr]:
        return self.comma_list(self.parse_expr)

    def parse_order_by(self) -> tuple[OrderTerm, ...]:
        self.expect_keyword("ORDER")
        self.expect_keyword("BY")
        terms: list[OrderTerm] = []
        while True:
            expr = self.parse_expr()
            desc = False
            if self.accept_keyword("DESC"):
                desc = True
            else:
                self.accept_keyword("ASC")
            nulls_first: bool | None = None
            if self.accept_keyword("NULLS"):
                tok = self.peek()
                if tok.upper not in ("FIRST", "LAST"):
                    self.error(tok, expected="FIRST or LAST after NULLS")
                self.advance()
                nulls_first = tok.upper == "FIRST"
            terms.append(OrderTerm(expr, desc, nulls_first))
            if not self.accept(","):
                return tuple(terms)

    def parse_returning(self) -> tuple[ResultTerm, ...]:
        if not self.accept_keyword("RETURNING"):
            return ()
        if self.peek().upper in ("RAW", "VALUE", "ELEMENT"):
            self.error(self.peek(), "RETURNING RAW is not supported", expected="result terms")
        return self.parse_terms()

    def parse_path(self) -> Expr:
        """A document path for SET/UNSET: ``a``, ``a.b``, ``a[0].c`` (constant indexes)."""
        tok = self.peek()
        expr = self.parse_postfix(self.parse_primary())
        node = expr
        while isinstance(node, Field | Index):
            if isinstance(node, Index) and not isinstance(node.index, Literal):
                self.error(tok, "a SET/UNSET path may only use constant array positions")
            node = node.base
        if not isinstance(node, Identifier):
            self.error(tok, f"{expr.to_text()} is not a document path", expected="a field path")
        if node.name == SELF_NAME:
            self.error(
                tok,
                "SELF is the whole document, not a field: SET/UNSET need a field path "
                "(a field named self is written `self`)",
                expected="a field path",
            )
        return expr

    # -- set operations ----------------------------------------------------------------------

    def parse_query(self) -> SelectStmt | SetOpStmt:
        """A SELECT or a set operation of SELECTs (``SetOpStmt``), with its trailing ORDER
        BY / LIMIT / OFFSET."""
        branches: list[SelectStmt | SetOpStmt] = []
        texts: list[str] = []
        ops: list[tuple[str, bool]] = []
        while True:
            start = self.peek()
            if self.at_query_in_parens():
                self.advance()
                branch: SelectStmt | SetOpStmt = self.parse_query()
                end = self.expect(")", "')' after the parenthesised query")
                texts.append(self.source_between(start.offset + 1, end.offset))
            else:
                branch = self.parse_select(tail=False)
                texts.append(self.source_between(start.offset, self.peek().offset))
            branches.append(branch)
            op = self.peek()
            if op.kind is not TokenKind.IDENT or op.upper not in SET_OPERATORS:
                break
            self.advance()
            ops.append((op.upper, self.accept_keyword("ALL") is not None))
            if not (self.at_keyword("SELECT") or self.at_query_in_parens()):
                self.error(
                    self.peek(), expected=f"SELECT or a parenthesised query after {op.upper}"
                )
        order_by, limit, offset = self.parse_query_tail()
        after = self.peek()
        if (order_by or limit or offset) and after.upper in SET_OPERATORS:
            self.error(
                after,
                f"ORDER BY, LIMIT and OFFSET end a set operation: {after.upper} cannot follow them",
                expected="parentheses around a branch that has them: "
                f"(SELECT ... ORDER BY ... LIMIT n) {after.upper} SELECT ...",
            )
        if len(branches) == 1 and isinstance(branches[0], SelectStmt):
            one = branches[0]
            if not (order_by or limit or offset):
                return one
            if not (one.order_by or one.limit or one.offset):  # SELECT ... ORDER BY ...
                return dataclasses.replace(one, order_by=order_by, limit=limit, offset=offset)
        if len(branches) == 1 and not (order_by or limit or offset):
            return branches[0]  # (query): the parentheses change nothing
        return SetOpStmt(tuple(branches), tuple(ops), tuple(texts), order_by, limit, offset)

    def at_query_in_parens(self) -> bool:
        """At ``(SELECT`` (or ``((SELECT``, ...): a parenthesised query as a statement or a
        set operation's branch."""
        i = 0
        while self.at_op("(", i):
            i += 1
        return i > 0 and self.at_keyword("SELECT", i)

    def parse_query_tail(self) -> tuple[tuple[OrderTerm, ...], Expr | None, Expr | None]:
        """``[ORDER BY ...] [LIMIT expr] [OFFSET expr]`` (LIMIT and OFFSET in either order,
        each at most once)."""
        order_by = self.parse_order_by() if self.at_keyword("ORDER") else ()
        limit = offset = None
        for _ in range(2):
            if limit is None and self.accept_keyword("LIMIT"):
                limit = self.parse_expr()
            elif offset is None and self.accept_keyword("OFFSET"):
                offset = self.parse_expr()
        return order_by, limit, offset

    def source_between(self, start: int, end: int) -> str:
        return self.text[start:end].strip() if self.text else ""

    # -- PREPARE / EXECUTE -----------------------------------------------------------------

    def parse_prepare(self) -> PrepareStmt:
        """``PREPARE [FORCE] [name (FROM | AS)] statement``."""
        self.advance()
        force = False
        if self.at_keyword("FORCE") and self.peek(1).kind is not TokenKind.OP:
            self.advance()
            force = True
        name = ""
        if self.peek(1).upper in ("FROM", "AS"):
            name = self.parse_prepared_name()
            self.advance()
        start = self.peek()
        if start.upper in ("PREPARE", "EXECUTE", "CREATE", "BUILD", "DROP"):
            self.error(start, f"{start.upper} cannot be prepared", expected="a query or DML")
        inner = self.parse_dml_or_query()
        text = self.source_between(start.offset, self.peek().offset)
        return PrepareStmt(name or f"p{uuid.uuid4().hex}", inner, text, force)

    def parse_execute(self) -> ExecuteStmt:
        """``EXECUTE name [USING expr]``."""
        self.advance()
        name = self.parse_prepared_name()
        using = self.parse_expr() if self.accept_keyword("USING") else None
        return ExecuteStmt(name, using)

    def parse_prepared_name(self) -> str:
        tok = self.peek()
        if tok.kind is TokenKind.STRING and isinstance(tok.value, str) and tok.value:
            self.advance()
            return tok.value
        if tok.kind not in (TokenKind.IDENT, TokenKind.QIDENT):
            self.error(tok, expected="the name of a prepared statement")
        return self.parse_alias()

    # -- WITH ------------------------------------------------------------------------------

    def parse_with(self) -> WithStmt:
        """``WITH name AS (query | expr) {, ...} query``."""
        self.advance()  # WITH (not reserved: it stays usable as a name elsewhere)
        if self.peek().upper == "RECURSIVE":
            self.error(self.peek(), "WITH RECURSIVE is not supported", expected="a name")
        terms: list[WithTerm] = []
        while True:
            start = self.peek()
            name = self.parse_alias()
            if any(t.name == name for t in terms):
                self.error(start, f"WITH names {name!r} twice", expected="another name")
            self.expect_keyword("AS")
            opened = self.expect("(", f"'(' and the query or expression {name} stands for")
            if self.at_keyword("SELECT") or self.at_query_in_parens():
                query: SelectStmt | SetOpStmt | None = self.parse_query()
                expr = None
            else:
                query, expr = None, self.parse_expr()
            end = self.expect(")", f"')' after the definition of {name}")
            text = self.source_between(start.offset, end.offset + 1)
            inner = self.source_between(opened.offset + 1, end.offset)
            terms.append(WithTerm(name, text, expr, query, inner))
            if not self.accept(","):
                break
        start = self.peek()
        if not (self.at_keyword("SELECT") or self.at_query_in_parens()):
            self.error(start, expected="',' and another WITH term, or the SELECT that uses them")
        body = self.parse_query()
        body_text = self.source_between(start.offset, self.peek().offset)
        return WithStmt(tuple(terms), body, body_text)

    def at_with_subquery(self) -> bool:
        """At ``(WITH name AS``: a WITH statement in parentheses, as an expression."""
        return (
            self.at_op("(")
            and self.peek(1).upper == "WITH"
            and self.peek(2).kind in (TokenKind.IDENT, TokenKind.QIDENT)
            and self.peek(3).upper == "AS"
        )

    def parse_with_subquery(self) -> Expr:
        start = self.advance()
        stmt = self.parse_with()
        end = self.expect(")", "')' after the subquery")
        return WithSubquery(stmt, self.source_between(start.offset + 1, end.offset))

    # -- window functions --------------------------------------------------------------------

    def parse_window_function(self, name_tok: Token, upper: str) -> Expr:
        """``fn(args) [FROM FIRST|LAST] [RESPECT|IGNORE NULLS] OVER (...)``."""
        least, most = WINDOW_FUNCTIONS[upper]
        self.expect("(")
        args = self.expression_list(")")
        if not least <= len(args) <= most:
            takes = f"{least}" if least == most else f"{least} to {most}"
            self.error(
                name_tok, f"window function {upper} takes {takes} arguments, got {len(args)}"
            )
        from_last = False
        if (
            upper == "NTH_VALUE"
            and self.at_keyword("FROM")
            and self.peek(1).upper
            in (
                "FIRST",
                "LAST",
            )
        ):
            self.advance()
            from_last = self.advance().upper == "LAST"
        ignore_nulls = self.parse_null_treatment(upper)
        if not self.at_keyword("OVER"):
            self.error(self.peek(), f"window function {upper} needs OVER (...)", expected="OVER")
        return self.parse_over(
            WindowCall(upper, tuple(args), ignore_nulls=ignore_nulls, from_last=from_last)
        )

    def parse_null_treatment(self, upper: str) -> bool:
        if self.peek().upper in ("RESPECT", "IGNORE") and self.at_keyword("NULLS", 1):
            tok = self.advance()
            self.advance()
            if upper not in ("LAG", "LEAD", "FIRST_VALUE", "LAST_VALUE", "NTH_VALUE"):
                self.error(tok, f"{upper} takes no {tok.upper} NULLS")
            return tok.upper == "IGNORE"
        return False

    def parse_over_aggregate(self, agg: Aggregate) -> Expr:
        """An aggregate, or with OVER after it an aggregate over a window."""
        if not self.at_keyword("OVER"):
            return agg
        args = () if agg.arg is None else (agg.arg,)
        return self.parse_over(
            WindowCall(agg.name, args, distinct=agg.distinct, star=agg.arg is None)
        )

    def parse_over(self, call: WindowCall) -> WindowCall:
        self.expect_keyword("OVER")
        if not self.at_op("("):
            self.error(
                self.peek(),
                "named windows (WINDOW clause) are not supported: write the window in OVER (...)",
                expected="'(' and the window",
            )
        self.advance()
        partition: tuple[Expr, ...] = ()
        if self.accept_keyword("PARTITION"):
            self.expect_keyword("BY")
            partition = tuple(self.parse_expr_list())
        order = self.parse_order_by() if self.at_keyword("ORDER") else ()
        frame = None
        if self.peek().upper in _FRAME_UNITS:
            frame = self.parse_frame(bool(order))
            if call.name in FRAMELESS:
                self.error(self.tokens[self.pos - 1], f"{call.name} takes no window frame")
        self.expect(")", "')' after the window")
        return dataclasses.replace(call, partition=partition, order=order, frame=frame)

    def parse_frame(self, ordered: bool) -> Frame:
        unit_tok = self.advance()
        unit = unit_tok.upper
        if unit in ("RANGE", "GROUPS") and not ordered:
            self.error(unit_tok, f"a {unit} frame needs ORDER BY in the window")
        if self.accept_keyword("BETWEEN"):
            start = self.parse_frame_bound()
            self.expect_keyword("AND")
            end = self.parse_frame_bound()
        else:
            start, end = self.parse_frame_bound(), FrameBound("CURRENT ROW")
        order = ["UNBOUNDED PRECEDING", "PRECEDING", "CURRENT ROW", "FOLLOWING"]
        order.append("UNBOUNDED FOLLOWING")
        if (
            start.kind == "UNBOUNDED FOLLOWING"
            or end.kind == "UNBOUNDED PRECEDING"
            or order.index(start.kind) > order.index(end.kind)
        ):
            self.error(
                unit_tok,
                f"window frame from {start.to_text()} to {end.to_text()} is empty",
                expected="a start that comes before the end",
            )
        exclude = None
        if self.accept_keyword("EXCLUDE"):
            tok = self.peek()
            if tok.upper == "CURRENT" and self.at_keyword("ROW", 1):
                self.advance()
                self.advance()
                exclude = "CURRENT ROW"
            elif tok.upper in ("GROUP", "TIES"):
                self.advance()
                exclude = tok.upper
            elif tok.upper == "NO" and self.at_keyword("OTHERS", 1):
                self.advance()
                self.advance()
            else:
                self.error(tok, expected="CURRENT ROW, GROUP, TIES or NO OTHERS after EXCLUDE")
        return Frame(unit, start, end, exclude)

    def parse_frame_bound(self) -> FrameBound:
        tok = self.peek()
        if tok.upper == "UNBOUNDED":
            self.advance()
            side = self.peek()
            if side.upper not in ("PRECEDING", "FOLLOWING"):
                self.error(side, expected="PRECEDING or FOLLOWING after UNBOUNDED")
            self.advance()
            return FrameBound(f"UNBOUNDED {side.upper}")
        if tok.upper == "CURRENT" and self.at_keyword("ROW", 1):
            self.advance()
            self.advance()
            return FrameBound("CURRENT ROW")
        offset = self.parse_expression()
        side = self.peek()
        if side.upper not in ("PRECEDING", "FOLLOWING"):
            self.error(side, expected="PRECEDING or FOLLOWING after the frame offset")
        self.advance()
        return FrameBound(side.upper, offset)

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
        if self.at_with_subquery():
            return self.parse_with_subquery()
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
        select = self.parse_query()
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
            return self.parse_window_function(name_tok, upper)
        if upper not in AGGREGATES:
            return super().parse_call(name_tok, name)
        self.expect("(")
        if self.accept("*"):
            if upper != "COUNT":
                self.error(self.tokens[self.pos - 1], f"{upper}(*) is not allowed; only COUNT(*)")
            self.expect(")", "')' after COUNT(*")
            return self.parse_over_aggregate(Aggregate("COUNT", None))
        distinct = self.accept_keyword("DISTINCT") is not None
        if not distinct:
            self.accept_keyword("ALL")
        arg = self.parse_expression()
        self.expect(")", f"')' ({upper} takes one argument)")
        return self.parse_over_aggregate(Aggregate(upper, arg, distinct))


_FRAME_UNITS = ("ROWS", "RANGE", "GROUPS")


def implied_alias(expr: Expr) -> str | None:
    """The alias a FROM or UNNEST term gets without AS: its path's last field name."""
    if isinstance(expr, Field):
        return expr.name
    if isinstance(expr, Identifier) and expr.name != SELF_NAME:
        return expr.name
    return None


def parse_statement(text: str) -> Statement:
    """Parse one SQL++ statement (query, DML or index DDL). Raises ``SqlSyntaxError``
    (SQL_SYNTAX) naming line, column and token."""
    return SqlParser.for_text(text).parse_statement()


def parse_select(text: str) -> SelectStmt:
    stmt = parse_statement(text)
    if isinstance(stmt, ExplainStmt):
        return stmt.statement
    if not isinstance(stmt, SelectStmt):
        raise TypeError(f"not a SELECT: {text!r}")
    return stmt
