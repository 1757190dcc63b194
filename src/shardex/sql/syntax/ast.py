"""The SQL++ statement tree: SELECT, EXPLAIN, INSERT/UPSERT, DELETE, UPDATE, plus the
expression nodes only statements use (collection predicates, array comprehensions,
aggregates).

Expressions inside statements are ordinary ``shardex.core.expr`` nodes; the extra nodes here
subclass ``Expr`` and are registered with the evaluator (``comprehension.py``), so the one
interpreter and compiler evaluate everything. Statements are frozen dataclasses: the planner
and the local engine read them, nothing mutates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardex.core.expr import Expr, format_identifier
from shardex.core.expr.ast import PREC_ATOM

# -- expression nodes ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Binding:
    """``var IN expr`` (or ``var WITHIN expr``: every nested value) in ANY/EVERY/ARRAY."""

    var: str
    source: Expr
    within: bool = False

    def to_text(self) -> str:
        word = "WITHIN" if self.within else "IN"
        return f"{format_identifier(self.var)} {word} {self.source.to_text()}"


@dataclass(frozen=True, slots=True)
class CollectionPredicate(Expr):
    """``ANY | SOME | EVERY | ANY AND EVERY  var IN coll [, ...]  SATISFIES cond END``."""

    quantifier: str  # "ANY", "EVERY" or "ANY AND EVERY"
    bindings: tuple[Binding, ...]
    satisfies: Expr
    precedence: ClassVar[int] = PREC_ATOM

    def children(self) -> tuple[Expr, ...]:
        return (*(b.source for b in self.bindings), self.satisfies)

    def to_text(self) -> str:
        binds = ", ".join(b.to_text() for b in self.bindings)
        return f"{self.quantifier} {binds} SATISFIES {self.satisfies.to_text()} END"


@dataclass(frozen=True, slots=True)
class ArrayComprehension(Expr):
    """``ARRAY expr FOR var IN coll [, ...] [WHEN cond] END`` (``FIRST`` keeps the first)."""

    mapping: Expr
    bindings: tuple[Binding, ...]
    when: Expr | None = None
    first: bool = False
    precedence: ClassVar[int] = PREC_ATOM

    def children(self) -> tuple[Expr, ...]:
        out = [self.mapping, *(b.source for b in self.bindings)]
        if self.when is not None:
            out.append(self.when)
        return tuple(out)

    def to_text(self) -> str:
        word = "FIRST" if self.first else "ARRAY"
        binds = ", ".join(b.to_text() for b in self.bindings)
        when = "" if self.when is None else f" WHEN {self.when.to_text()}"
        return f"{word} {self.mapping.to_text()} FOR {binds}{when} END"


@dataclass(frozen=True, slots=True)
class Subquery(Expr):
    """``(SELECT ...)`` used as an expression: the array of the subquery's result values.
    ``text`` is the subquery's source text (for EXPLAIN and messages); name binding
    replaces the node by a ``BoundSubquery`` (``subquery.py``)."""

    select: SelectStmt
    text: str
    precedence: ClassVar[int] = PREC_ATOM

    def children(self) -> tuple[Expr, ...]:
        return ()

    def to_text(self) -> str:
        return f"({self.text})"


@dataclass(frozen=True, slots=True)
class Exists(Expr):
    """``EXISTS expr``: TRUE when ``expr`` is a non-empty array (a subquery had a row)."""

    operand: Expr
    precedence: ClassVar[int] = PREC_ATOM

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    def to_text(self) -> str:
        return f"EXISTS {self.operand.to_text()}"


# The keyword SELF (the FROM item itself, as N1QL) is parsed as this identifier, which name
# binding replaces by the FROM alias. It starts with NUL: no user identifier collides.
SELF_NAME = "\x00self"

# The scope row's META() of the FROM term (bind.py), and where a subquery's rows keep the
# META() of an enclosing query's alias (``META(o)`` inside a subquery over ``o``'s row).
META_KEY = "\x00meta"


# The scope name of a set operation's result value: its ORDER BY reads it, and INSERT ...
# SELECT's KEY and VALUE (``setops.py``).
RESULT_NAME = "\x00result"


def outer_meta_name(alias: str) -> str:
    return f"{META_KEY}.{alias}"


AGGREGATES = frozenset(
    {"COUNT", "COUNTN", "SUM", "AVG", "MIN", "MAX", "ARRAY_AGG", "MEDIAN"}
    | {"STDDEV", "STDDEV_POP", "STDDEV_SAMP", "VARIANCE", "VAR_POP", "VAR_SAMP"}
    | {"VARIANCE_POP", "VARIANCE_SAMP"}
)


@dataclass(frozen=True, slots=True)
class Aggregate(Expr):
    """``COUNT(*)`` (arg None), ``SUM(x)``, ``COUNT(DISTINCT x)``, ... Only meaningful in a
    grouped query's projection, HAVING, LETTING and ORDER BY: the binder replaces it with a
    reference to the group's computed value."""

    name: str
    arg: Expr | None
    distinct: bool = False
    precedence: ClassVar[int] = PREC_ATOM

    def children(self) -> tuple[Expr, ...]:
        return () if self.arg is None else (self.arg,)

    def to_text(self) -> str:
        if self.arg is None:
            return f"{self.name}(*)"
        d = "DISTINCT " if self.distinct else ""
        return f"{self.name}({d}{self.arg.to_text()})"


# -- statements -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResultTerm:
    """One projection term. ``expr`` None with ``star`` is ``*``; ``expr`` with ``star`` is
    ``expr.*`` (the fields of an object merged into the result)."""

    expr: Expr | None
    alias: str | None = None
    star: bool = False


@dataclass(frozen=True)
class OrderTerm:
    expr: Expr
    desc: bool = False
    nulls_first: bool | None = None  # None: the default (ASC: first, DESC: last)

    @property
    def effective_nulls_first(self) -> bool:
        return (not self.desc) if self.nulls_first is None else self.nulls_first


@dataclass(frozen=True)
class KeyspaceRef:
    """``FROM name [AS alias] [USE INDEX (...)] [USE KEYS expr]``, or an expression source
    ``FROM (expr) AS alias`` (``source`` set, ``name`` empty): the expression's array
    elements are the rows."""

    name: str
    alias: str | None = None
    use_index: tuple[str, ...] = ()
    use_keys: Expr | None = None
    source: Expr | None = None

    @property
    def as_name(self) -> str:
        return self.alias or self.name


@dataclass(frozen=True)
class UnnestTerm:
    """``[LEFT [OUTER] | INNER] UNNEST expr [AS] alias``: one row per element of ``expr``
    (an array) beside the row it was read from; ``outer`` (LEFT) keeps a row whose value
    is no array or an empty one, with ``alias`` MISSING."""

    expr: Expr
    alias: str
    outer: bool = False


@dataclass(frozen=True)
class SelectStmt:
    terms: tuple[ResultTerm, ...]
    raw: bool = False  # SELECT RAW / VALUE / ELEMENT: one term, rows are its values
    distinct: bool = False
    from_: KeyspaceRef | None = None
    let: tuple[tuple[str, Expr], ...] = ()
    where: Expr | None = None
    group_by: tuple[Expr, ...] = ()
    letting: tuple[tuple[str, Expr], ...] = ()
    having: Expr | None = None
    order_by: tuple[OrderTerm, ...] = ()
    limit: Expr | None = None
    offset: Expr | None = None
    unnests: tuple[UnnestTerm, ...] = ()  # after FROM, in order: each sees those before it
    joins: tuple[JoinTerm, ...] = ()  # JOIN / NEST terms, each placed among the UNNESTs
    # WINDOW name AS (...), ...: windows OVER name / OVER (name ...) take as they are written.
    windows: tuple[tuple[str, WindowCall], ...] = ()


@dataclass(frozen=True)
class ExplainStmt:
    """``EXPLAIN statement``: the plan of a query, of a DML statement (the query it runs,
    then its write steps) or of EXECUTE (the prepared statement's), never running it."""

    # SelectStmt | SetOpStmt | WithStmt | InsertStmt | DeleteStmt | UpdateStmt | MergeStmt
    # | ExecuteStmt (MergeStmt lives in merge.py, which imports this module)
    statement: object


@dataclass(frozen=True)
class InsertStmt:
    """``INSERT|UPSERT INTO ks (KEY, VALUE) VALUES (k, v), ...`` or ``... (KEY k [, VALUE v])
    SELECT ...``."""

    keyspace: str
    values: tuple[tuple[Expr, Expr], ...]
    upsert: bool = False
    returning: tuple[ResultTerm, ...] = ()
    # ``INSERT|UPSERT INTO ks (KEY k [, VALUE v]) query``: the query's result values are the
    # rows ``key`` and ``value`` read (a bare name is a field of the value, SELF the value);
    # without VALUE the value is the row. ``select_text``: the query as written.
    select: SelectStmt | SetOpStmt | WithStmt | None = None
    key: Expr | None = None
    value: Expr | None = None
    select_text: str = ""


@dataclass(frozen=True)
class DeleteStmt:
    target: KeyspaceRef
    where: Expr | None = None
    limit: Expr | None = None
    returning: tuple[ResultTerm, ...] = ()


@dataclass(frozen=True)
class UpdateStmt:
    target: KeyspaceRef
    set: tuple[tuple[Expr, Expr], ...] = ()
    unset: tuple[Expr, ...] = ()
    where: Expr | None = None
    limit: Expr | None = None
    returning: tuple[ResultTerm, ...] = ()


DmlStatement = InsertStmt | DeleteStmt | UpdateStmt


# -- joins ------------------------------------------------------------------------------------

JOIN_KINDS = ("inner", "left", "right")
HASH_BUILD, HASH_PROBE, USE_NL = "hash_build", "hash_probe", "nl"


@dataclass(frozen=True)
class JoinTerm:
    """``[INNER | LEFT [OUTER] | RIGHT [OUTER]] JOIN | NEST keyspace [AS] alias ...`` after
    the FROM term, in one of three forms: a lookup join ``ON KEYS expr`` (``on_keys``: the
    inner documents' ids, evaluated over the row so far), an index join ``ON KEY
    alias.path FOR outer`` (``on_key`` and ``for_alias``: the inner documents whose path
    holds the outer document's id) or an ANSI join ``ON cond``. A NEST binds ``alias`` to
    the array of the matching inner documents instead of one row per match. ``hint``: the
    inner keyspace's ``USE HASH(BUILD|PROBE)`` or ``USE NL``. ``position``: how many UNNEST
    terms precede it (the FROM clause's terms keep their order)."""

    kind: str  # JOIN_KINDS
    nest: bool
    target: KeyspaceRef
    on_keys: Expr | None = None
    on_key: Expr | None = None
    for_alias: str | None = None
    on: Expr | None = None
    hint: str | None = None
    position: int = 0

    @property
    def alias(self) -> str:
        return self.target.as_name

    @property
    def word(self) -> str:
        """The clause as written (for EXPLAIN and messages): ``LEFT JOIN``, ``NEST``, ..."""
        prefix = "" if self.kind == "inner" else f"{self.kind.upper()} "
        return prefix + ("NEST" if self.nest else "JOIN")


# -- set operations ------------------------------------------------------------------------

SET_OPERATORS = ("UNION", "INTERSECT", "EXCEPT")


@dataclass(frozen=True)
class SetOpStmt:
    """``branch {UNION | INTERSECT | EXCEPT [ALL] branch} [ORDER BY ...] [LIMIT] [OFFSET]``.

    N1QL's set operators share one precedence and combine left to right: ``ops[i]`` (the
    operator and whether ALL was written) joins the result so far with ``branches[i + 1]``.
    A branch is a SELECT without ORDER BY / LIMIT / OFFSET, or a parenthesised query (which
    may have them). ORDER BY, LIMIT and OFFSET here apply to the whole result; ORDER BY reads
    the result values (``ORDER BY name`` is their field ``name``). ``texts`` are the branches'
    source texts (a parenthesised one without its parentheses): the distributed plan runs each
    as a query of its own."""

    branches: tuple[SelectStmt | SetOpStmt, ...]
    ops: tuple[tuple[str, bool], ...]
    texts: tuple[str, ...]
    order_by: tuple[OrderTerm, ...] = ()
    limit: Expr | None = None
    offset: Expr | None = None


# -- WITH (common table expressions) -----------------------------------------------------------


@dataclass(frozen=True)
class WithTerm:
    """``name AS (query | expr)``: ``query`` a SELECT or set operation whose result values
    (an array) the name stands for, else ``expr``. ``text``: the term as written (the
    distributed plan rebuilds a statement's WITH clause from them)."""

    name: str
    text: str
    expr: Expr | None = None
    query: SelectStmt | SetOpStmt | None = None
    inner: str = ""  # the query or expression as written, without the parentheses


@dataclass(frozen=True)
class WithStmt:
    """``WITH term {, term} query``: each term is evaluated once per statement, in order
    (a term sees those before it), and its name is a variable of the query (in FROM too:
    ``FROM name`` ranges over its elements). ``body_text``: the query as written."""

    terms: tuple[WithTerm, ...]
    body: SelectStmt | SetOpStmt
    body_text: str

    def header(self, upto: int | None = None) -> str:
        """``WITH`` and the first ``upto`` terms (all by default) as written, to put before
        a query that reads them."""
        terms = self.terms if upto is None else self.terms[:upto]
        return f"WITH {', '.join(t.text for t in terms)} " if terms else ""


@dataclass(frozen=True, slots=True)
class WithSubquery(Expr):
    """``(WITH name AS (...) {, ...} SELECT ...)`` used as an expression: binding inlines each
    term where the SELECT names it (``bind.bind_with_subquery``) and makes the whole a
    ``BoundSubquery``."""

    stmt: WithStmt
    text: str
    precedence: ClassVar[int] = PREC_ATOM

    def children(self) -> tuple[Expr, ...]:
        return ()

    def to_text(self) -> str:
        return f"({self.text})"


# -- window functions --------------------------------------------------------------------------

# Functions that exist only with OVER; the aggregates (AGGREGATES) take OVER too.
WINDOW_FUNCTIONS: dict[str, tuple[int, int]] = {  # name -> (least, most) arguments
    "ROW_NUMBER": (0, 0),
    "RANK": (0, 0),
    "DENSE_RANK": (0, 0),
    "PERCENT_RANK": (0, 0),
    "CUME_DIST": (0, 0),
    "NTILE": (1, 1),
    "LAG": (1, 3),
    "LEAD": (1, 3),
    "FIRST_VALUE": (1, 1),
    "LAST_VALUE": (1, 1),
    "NTH_VALUE": (2, 2),
    "RATIO_TO_REPORT": (1, 1),
}
# Of those, the ones a frame clause does not apply to (they read the partition's order).
FRAMELESS = frozenset(
    {"ROW_NUMBER", "RANK", "DENSE_RANK", "PERCENT_RANK", "CUME_DIST", "NTILE", "LAG", "LEAD"}
)


@dataclass(frozen=True, slots=True)
class FrameBound:
    """``UNBOUNDED PRECEDING`` / ``n PRECEDING`` / ``CURRENT ROW`` / ``n FOLLOWING`` /
    ``UNBOUNDED FOLLOWING``: ``kind`` one of those words, ``offset`` the ``n``."""

    kind: str  # "UNBOUNDED PRECEDING", "PRECEDING", "CURRENT ROW", "FOLLOWING", ...
    offset: Expr | None = None

    def to_text(self) -> str:
        return self.kind if self.offset is None else f"{self.offset.to_text()} {self.kind}"


@dataclass(frozen=True, slots=True)
class Frame:
    """``ROWS | RANGE | GROUPS BETWEEN start AND end [EXCLUDE ...]``."""

    unit: str
    start: FrameBound
    end: FrameBound
    exclude: str | None = None  # "CURRENT ROW", "GROUP", "TIES" (None: NO OTHERS)

    def to_text(self) -> str:
        ex = "" if self.exclude is None else f" EXCLUDE {self.exclude}"
        return f"{self.unit} BETWEEN {self.start.to_text()} AND {self.end.to_text()}{ex}"


@dataclass(frozen=True, slots=True)
class WindowCall(Expr):
    """``fn(args) [FROM FIRST|LAST] [RESPECT|IGNORE NULLS] OVER ([PARTITION BY ...]
    [ORDER BY ...] [frame])``: a window function, or an aggregate over a window. Only in the
    projection and ORDER BY: the binder evaluates it over the rows after WHERE (or the groups
    after HAVING) and replaces it by a reference to its value (``window.py``)."""

    name: str
    args: tuple[Expr, ...]
    partition: tuple[Expr, ...] = ()
    order: tuple[OrderTerm, ...] = ()
    frame: Frame | None = None
    distinct: bool = False
    star: bool = False  # COUNT(*)
    ignore_nulls: bool = False
    from_last: bool = False
    ref: str | None = None  # OVER name / OVER (name ...): a window of the WINDOW clause
    precedence: ClassVar[int] = PREC_ATOM

    def children(self) -> tuple[Expr, ...]:
        out = [*self.args, *self.partition, *(o.expr for o in self.order)]
        if self.frame is not None:
            out += [b.offset for b in (self.frame.start, self.frame.end) if b.offset]
        return tuple(out)

    def to_text(self) -> str:
        inner = "*" if self.star else ", ".join(a.to_text() for a in self.args)
        head = f"{self.name}({'DISTINCT ' if self.distinct else ''}{inner})"
        if self.from_last:
            head += " FROM LAST"
        if self.ignore_nulls:
            head += " IGNORE NULLS"
        over: list[str] = [] if self.ref is None else [self.ref]
        if self.partition:
            over.append("PARTITION BY " + ", ".join(p.to_text() for p in self.partition))
        if self.order:
            over.append(
                "ORDER BY "
                + ", ".join(o.expr.to_text() + (" DESC" if o.desc else "") for o in self.order)
            )
        if self.frame is not None:
            over.append(self.frame.to_text())
        return f"{head} OVER ({' '.join(over)})"


# -- PREPARE / EXECUTE -------------------------------------------------------------------------


@dataclass(frozen=True)
class PrepareStmt:
    """``PREPARE [FORCE] [name FROM | AS] statement``: ``statement`` kept under ``name``
    (generated when absent) for EXECUTE; ``text`` is the statement as written."""

    name: str
    statement: object  # a query or DML statement (parser.Statement)
    text: str
    force: bool = False


@dataclass(frozen=True)
class ExecuteStmt:
    """``EXECUTE name [USING [values] | {name: value, ...}]``: the statement prepared under
    ``name``, run with the USING values as its parameters (else the request's)."""

    name: str
    using: Expr | None = None


@dataclass(frozen=True, slots=True)
class SetOpSubquery(Expr):
    """``(SELECT ... UNION | INTERSECT | EXCEPT [ALL] SELECT ...)`` used as an expression:
    binding makes each SELECT branch a ``BoundSubquery`` (``subquery.BoundSetOpSubquery``)."""

    stmt: SetOpStmt
    text: str
    precedence: ClassVar[int] = PREC_ATOM

    def children(self) -> tuple[Expr, ...]:
        return ()

    def to_text(self) -> str:
        return f"({self.text})"
