"""The names a statement's WITH clause binds, while the statement is being bound.

A WITH name is evaluated once per statement, before its query runs, and travels with the
statement's parameters (under ``cte_param(name)``: no user parameter has that name), so
every engine and every fragment reads it the way it reads ``$name``. Binding turns a free
reference to the name into that parameter (``reference``): a name the query binds itself
(a FROM alias, LET, UNNEST or comprehension variable) shadows it, as scopes do. A WITH
inside a subquery expression binds the same way (``subquery_scope``); its terms are valued
once per evaluation of that subquery, before its query, and a query text inside it does not
stand on its own (it may read them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar

from shardex.core.expr import Expr, Param

__all__ = [
    "cte_param",
    "inlining",
    "is_cte_param",
    "reference",
    "subquery_scope",
    "visible",
]

_PREFIX = "\x00with."
_VISIBLE: ContextVar[dict[str, Expr]] = ContextVar("cte_names", default={})  # noqa: B039
_IN_SUBQUERY_WITH: ContextVar[bool] = ContextVar("cte_names_in_subquery", default=False)


def cte_param(name: str) -> str:
    return _PREFIX + name


def is_cte_param(name: str) -> bool:
    return name.startswith(_PREFIX)


def reference(name: str) -> Expr | None:
    """The parameter a free ``name`` reads, when a WITH clause being bound names it."""
    return _VISIBLE.get().get(name)


def inlining() -> bool:
    """Whether a WITH of a subquery expression is being bound: a query text read here may
    name its terms, so it does not stand on its own (``BoundSubquery.standalone``)."""
    return _IN_SUBQUERY_WITH.get()


@contextlib.contextmanager
def subquery_scope() -> Iterator[None]:
    """Binding within: the terms and query of a subquery expression's WITH."""
    token = _IN_SUBQUERY_WITH.set(True)
    try:
        yield
    finally:
        _IN_SUBQUERY_WITH.reset(token)


def visible(names: Iterable[str]) -> contextlib.AbstractContextManager[None]:
    """Binding within: ``names`` are WITH names (added to any already visible)."""
    return _visible({n: Param(cte_param(n)) for n in names})


@contextlib.contextmanager
def _visible(exprs: Mapping[str, Expr]) -> Iterator[None]:
    token = _VISIBLE.set({**_VISIBLE.get(), **exprs})
    try:
        yield
    finally:
        _VISIBLE.reset(token)
