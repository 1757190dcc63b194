"""Documents cut down to the paths a statement reads, before they cross an exchange.

A window query's leaves send their scope rows, documents and all, to the root, which
evaluates the windows and the projection over them (``fragment_rows``, mode ``window``).
Most of a document is often never read there: an order's lines when the statement reads
its customer, date and status. ``pruner`` makes a function that keeps, of a document, the
paths ``analyze.read_paths`` lists (every path any expression of the statement reads):
an expression over the kept document reads what it read over the whole one, a field the
document lacks is still missing, and encoding, sending and decoding a row costs what its
read fields weigh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from shardex.core.expr.analysis import Path

__all__ = ["Trie", "pruned", "pruner", "trie_of"]

# field -> the paths below it that are read; an empty trie: the whole value is read.
Trie = dict[str, "Trie"]


def pruner(paths: Iterable[Path]) -> Callable[[Any], Any] | None:
    """A function keeping of a document the fields on ``paths``; None when a path reads
    the whole document (the empty path)."""
    trie = trie_of(paths)
    if trie is None:
        return None
    return lambda doc: pruned(doc, trie)


def trie_of(paths: Iterable[Path]) -> Trie | None:
    """``paths`` as a trie of the fields kept (an array element's path keeps its array
    whole); None when a path is empty (the whole document)."""
    trie: Trie = {}
    for p in paths:
        if not p:
            return None
        node = trie
        for i, step in enumerate(p):
            if not isinstance(step, str):  # an array element: the array is kept whole
                break
            child = node.get(step)
            if child is None:
                child = node[step] = {}
            elif not child:
                break  # read whole already
            if i == len(p) - 1 or not isinstance(p[i + 1], str):
                child.clear()  # this value is read whole: what was below it too
                break
            node = child
    return trie


def pruned(value: Any, trie: Trie) -> Any:
    """``value`` with, where it is an object, only the fields of ``trie`` (recursively)."""
    if not trie or not isinstance(value, dict):
        return value
    out = {}
    for name, below in trie.items():
        if name in value:
            v = value[name]
            out[name] = pruned(v, below) if below else v
    return out
