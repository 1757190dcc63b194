"""Index selection: which index serves a query's WHERE clause, and whether it covers it.

Eligibility (an index must never miss a row the query wants):

* its leading key part is constrained by a sargable conjunct, because documents whose leading
  key is MISSING have no entry, and every sargable predicate is non-TRUE for MISSING; or the
  index is the primary index (its key ``META().id`` is never MISSING);
* its own WHERE clause (a partial index) appears among the query's conjuncts, so every row the
  query wants passed the index's filter;
* ``USE INDEX (name)`` restricts the candidates to that index (an ineligible hint is an error,
  not a silent full scan elsewhere).

Preference: the most leading key parts pinned by equality, then constrained at all, then a
covering index (no document fetch), then an index whose order already satisfies ORDER BY,
then the fewest key parts (smaller entries); the primary index last.

Covering: every document path the query reads has a key part that is a plain path and a
prefix of it (``a`` covers ``a.b``); the row is then rebuilt from the key values
(:func:`covered_document`). Non-path keys (``LOWER(name)``) never cover, a limitation that
costs a fetch, not a wrong answer.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from shardex.core.expr import MISSING, Expr, parse_expression, static_path
from shardex.core.expr.analysis import Path
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.array_key import array_key_of
from shardex.meta.index_definition import IndexDefinition

from .sargable import KeyAtom, Range, conjuncts, constrain_keys

__all__ = ["DOCID", "IndexChoice", "OrderKey", "choose_index", "covered_document", "covers"]

DOCID = parse_expression("META().id")


@dataclass(frozen=True, slots=True)
class OrderKey:
    expr: Expr
    desc: bool = False
    nulls_first: bool | None = None  # None: the default (first for ASC, last for DESC)


@dataclass(frozen=True, slots=True)
class IndexChoice:
    definition: IndexDefinition
    keys: tuple[Expr, ...]
    per_key: tuple[tuple[KeyAtom, ...], ...]
    covering: bool
    key_paths: tuple[Path | None, ...]  # each key part's document path, None if not a path
    ordered: bool  # the index order satisfies the ORDER BY (a merge replaces the sort)

    @property
    def equality_keys(self) -> int:
        n = 0
        for atoms in self.per_key:
            if not any(_is_equality(a) for a in atoms):
                break
            n += 1
        return n

    @property
    def sargable_keys(self) -> int:
        n = 0
        for atoms in self.per_key:
            if not atoms:
                break
            n += 1
        return n


def _is_equality(atom: KeyAtom) -> bool:
    return isinstance(atom, Range) and atom.low is not None and atom.low == atom.high


def _implies(query_terms: Sequence[Expr], index_where: str | None) -> bool:
    if index_where is None:
        return True
    have = set(query_terms)
    return all(t in have for t in conjuncts(parse_expression(index_where)))


def covers(key_paths: Sequence[Path | None], read: Iterable[Path]) -> bool:
    """Whether key parts at ``key_paths`` rebuild every path in ``read``."""
    # A path through an array position cannot be rebuilt into a document: never covering.
    paths = [p for p in key_paths if p is not None and all(isinstance(s, str) for s in p)]
    return all(any(r[: len(p)] == p for p in paths) for r in read)


def _order_satisfied(
    choice_keys: Sequence[Expr], defn: IndexDefinition, eq: int, order_by: Sequence[OrderKey]
) -> bool:
    """ORDER BY follows the index order: its terms are the key parts after the ones pinned by
    equality (which are constant within the result), in order, with the same directions and
    default NULLS placement (the index sorts MISSING/NULL first for ASC, last for DESC),
    optionally followed by ``META().id`` ASC once every key part is ordered (ties break by
    docid in the index)."""
    if not order_by:
        return True
    keys = list(zip(choice_keys, (k.desc for k in defn.keys), strict=True))
    i = 0
    for term in order_by:
        # A term on an equality-pinned key part is constant: it orders nothing.
        pinned = [k for k, _ in keys[:eq]]
        if term.expr in pinned:
            continue
        j = max(i, eq)
        if j >= len(keys) and term.expr == DOCID and not term.desc:
            # Entries with equal keys sort by docid (``key + 0x02 + docid``), and docids
            # are unique: the order is total here, later terms order nothing.
            return True

        if j >= len(keys) or keys[j][0] != term.expr or keys[j][1] != term.desc:
            return False
        if term.nulls_first is not None and term.nulls_first != (not term.desc):
            return False
        i = j + 1
    return True


@functools.lru_cache(maxsize=1024)
def key_exprs(texts: tuple[str, ...]) -> tuple[Expr, ...]:
    """An index's key expressions parsed, once per text (a query plans against every index
    of its keyspace, and parsing dominated a point query's planning). Trees are immutable."""
    return tuple(array_key_of(t) or parse_expression(t) for t in texts)


def choose_index(
    indexes: Iterable[IndexDefinition],
    where: Expr | None,
    *,
    keyspace: str,
    read_paths: Iterable[Path] | None,
    order_by: Sequence[OrderKey] = (),
    use_index: str | None = None,
) -> IndexChoice:
    """The best eligible index of ``keyspace`` for the query.

    ``where`` and ``order_by`` are in document terms (the keyspace alias stripped);
    ``read_paths`` are every document path the query reads, or None when it needs whole
    documents (``SELECT *``, META() beyond ``id``) and so can never be covered.
    Raises ``INDEX_NOT_FOUND`` when no index can serve it, with a hint.
    """
    terms = conjuncts(where)
    read = None if read_paths is None else frozenset(read_paths)
    candidates: list[tuple[tuple[int, ...], IndexChoice]] = []
    seen_names: list[str] = []
    for defn in indexes:
        if defn.keyspace != keyspace:
            continue
        seen_names.append(defn.name)
        if use_index is not None and defn.name != use_index:
            continue
        keys = key_exprs(tuple(k.expr for k in defn.keys))
        per_key = tuple(tuple(a) for a in constrain_keys(where, keys))
        if not (defn.is_primary or per_key[0]) or not _implies(terms, defn.where):
            continue
        key_paths = tuple(static_path(k) for k in keys)
        # An array index holds a document once per element: its entries are no rows.
        covering = read is not None and covers(key_paths, read) and defn.array_pos < 0
        choice = IndexChoice(defn, keys, per_key, covering, key_paths, False)
        ordered = _order_satisfied(keys, defn, choice.equality_keys, order_by)
        choice = IndexChoice(defn, keys, per_key, covering, key_paths, ordered)
        score = (
            0 if defn.is_primary else 1,
            choice.equality_keys,
            choice.sargable_keys,
            int(covering),
            int(ordered),
            -len(keys),
        )
        candidates.append((score, choice))
    if not candidates:
        raise _no_index(keyspace, use_index, seen_names)
    candidates.sort(key=lambda c: (c[0], c[1].definition.name), reverse=True)
    return candidates[0][1]


def _no_index(keyspace: str, use_index: str | None, names: list[str]) -> ShardexError:
    if use_index is not None and use_index not in names:
        return ShardexError(
            f"index {use_index!r} does not exist on keyspace {keyspace!r}",
            code=ErrorCode.INDEX_NOT_FOUND,
            details={"index": use_index, "keyspace": keyspace, "hint": "see SHOW INDEXES"},
        )
    what = f"index {use_index!r}" if use_index else "no index"
    return ShardexError(
        f"{what} can serve this query on keyspace {keyspace!r}: no sargable predicate on an "
        "index's leading key",
        code=ErrorCode.INDEX_NOT_FOUND,
        details={
            "keyspace": keyspace,
            "hint": f"CREATE PRIMARY INDEX ON {keyspace}, or an index on a field the WHERE "
            "clause compares with a constant",
        },
    )


def covered_document(key_paths: Sequence[Path | None], values: Sequence[Any]) -> dict:
    """The part of a document a covering scan knows: each key path set to its value.

    Shorter paths first, so ``a`` (an object) is set before ``a.b`` refines it; a MISSING
    value leaves its path out.
    """
    doc: dict = {}
    for i in _shorter_first(tuple(key_paths)):
        path, value = key_paths[i], values[i]
        if path is None or value is MISSING:
            continue
        _set_path(doc, path, value)
    return doc


@functools.lru_cache(maxsize=256)
def _shorter_first(key_paths: tuple[Path | None, ...]) -> tuple[int, ...]:
    """Key part positions, shorter paths first (once per index: every covered row asks)."""
    return tuple(sorted(range(len(key_paths)), key=lambda i: len(key_paths[i] or ())))


def _set_path(doc: dict, path: Path, value: Any) -> None:
    node: Any = doc
    for step in path[:-1]:
        if isinstance(step, int) or not isinstance(node, dict):
            return  # array positions cannot be rebuilt: such keys are not covering
        node = node.setdefault(step, {})
        if not isinstance(node, dict):
            return
    last = path[-1]
    if isinstance(last, str) and isinstance(node, dict):
        node[last] = value
