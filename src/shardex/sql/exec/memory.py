"""The memory a query may hold on a node, in bytes (decision 0106).

Three levels, each drawing on the one above:

* ``NodeMemory``: the node's SQL memory, ``sql_node_memory`` bytes shared by every query
  running there, and the node's spill directory (``<data_dir>/sql-spill``, emptied at start);
* ``QueryMemory``: one query on this node (every fragment of it here shares it), at most its
  quota (``memory_quota``, never past the node's ``sql_query_memory``), with its own spill
  directory made on first use and removed when its last fragment ends, however it ends;
* ``Budget``: one run of a fragment's operators; each blocking operator holds a
  ``Reservation`` it grows as it builds data (``grow`` answers False when neither the query's
  quota nor the node has the bytes: the operator spills, or fails with ``over``).

Reservations take from the query in chunks (``CHUNK``), so the per-row cost is an addition
and a comparison; the locks are taken once a chunk.

``value_size`` estimates what a decoded JSON value holds in CPython (3.11, 64-bit): the
object sizes ``sys.getsizeof`` reports, recursively. It over-counts objects shared between
values (the key strings msgspec reuses across decoded documents, small ints and one-character
strings CPython caches) and under-counts non-ASCII text (1-4 bytes a character, counted as 1),
the allocator's rounding and free lists (pymalloc keeps freed blocks for reuse: RSS does
not fall when a reservation is released). Operators that can, hold encoded rows (``bytes``),
whose size is exact.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from shardex.core.values import MISSING
from shardex.errors import ErrorCode, ShardexError

__all__ = [
    "DEFAULT_QUERY_MEMORY",
    "MIN_QUERY_MEMORY",
    "SLOT_BYTES",
    "SPILL_DIR",
    "Budget",
    "NodeMemory",
    "QueryMemory",
    "Reservation",
    "default_node_memory",
    "value_size",
]

log = logging.getLogger(__name__)

MiB: Final = 1 << 20
DEFAULT_QUERY_MEMORY: Final = 256 * MiB
# Below this the spill machinery's own buffers (``spill.py``) are most of the budget.
MIN_QUERY_MEMORY: Final = 64 * 1024
# A node without a setting gives SQL this share of the machine's RAM.
NODE_MEMORY_SHARE: Final = 0.25
SPILL_DIR: Final = "sql-spill"
CHUNK: Final = 64 * 1024

# CPython object sizes (sys.getsizeof on 3.11, 64-bit).
_INT, _FLOAT, _STR, _BYTES = 28, 24, 49, 33
_LIST, _SLOT, _TUPLE = 56, 8, 40
SLOT_BYTES: Final = _SLOT  # a list's reference to one more value
_DICT_SMALL, _DICT_ENTRY = 184, 48  # up to 5 keys; past that about 48 bytes a key


def value_size(v: Any) -> int:
    """Bytes a decoded value holds (see the module doc for what this over/under counts)."""
    t = type(v)
    if t is str:
        return _STR + len(v)
    if t is int:
        return _INT if -(2**30) < v < 2**30 else _INT + 4 * (v.bit_length() // 30)
    if t is dict:
        n = len(v)
        size = _DICT_SMALL + _DICT_ENTRY * max(0, n - 5)
        for k, x in v.items():
            size += value_size(k) + value_size(x)
        return size
    if t is list or t is tuple:
        size = (_LIST if t is list else _TUPLE) + _SLOT * len(v)
        for x in v:
            size += value_size(x)
        return size
    if t is float:
        return _FLOAT
    if t is bytes:
        return _BYTES + len(v)
    if v is None or v is MISSING or t is bool:
        return 0  # singletons: a reference only
    return 64  # aggregate states (``SumState``) and anything else small and fixed


def default_node_memory() -> int:
    """``NODE_MEMORY_SHARE`` of the machine's RAM (4 GiB when it cannot be read)."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        ram = 16 << 30
    return max(int(ram * NODE_MEMORY_SHARE), MIN_QUERY_MEMORY)


class NodeMemory:
    """The node's SQL memory and spill directory, shared by all its running queries."""

    def __init__(
        self,
        capacity: int | None = None,
        *,
        query_max: int = DEFAULT_QUERY_MEMORY,
        data_dir: Path | None = None,
        spill: bool = True,
    ) -> None:
        self.capacity = default_node_memory() if capacity is None else capacity
        # The per-query maximum and default: a query's quota, never more than the node's.
        self.query_max = min(query_max, self.capacity)
        self.spill = spill
        self.used = 0
        self._lock = threading.Lock()
        self._queries: dict[str, QueryMemory] = {}
        self._anonymous = itertools.count()
        self._own_root = data_dir is None
        if data_dir is None:  # an in-process node: a directory of its own, made on first use
            self.root = Path(tempfile.gettempdir()) / f"shardex-sql-spill-{os.getpid()}-{id(self)}"
        else:
            self.root = data_dir / SPILL_DIR
            # Leftovers of queries a crash or kill ended: nothing reads them any more.
            if self.root.exists():
                log.info("removing leftover spill files under %s", self.root)
                shutil.rmtree(self.root, ignore_errors=True)

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.capacity:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n

    @contextlib.contextmanager
    def fragment(
        self, query_id: str | None, quota: int | None = None, spill: bool = True
    ) -> Iterator[FragmentMemory]:
        """The memory of one fragment of ``query_id`` (None: a statement of its own): the
        query's account, shared with its other fragments here, released with the last."""
        key = f"local-{next(self._anonymous)}" if query_id is None else query_id
        with self._lock:
            q = self._queries.get(key)
            if q is None:
                limit = self.query_max if quota is None else min(quota, self.query_max)
                q = self._queries[key] = QueryMemory(self, key, limit, spill and self.spill)
            q.users += 1
        frag = FragmentMemory(q)
        try:
            yield frag
        finally:
            frag.close()
            with self._lock:
                q.users -= 1
                last = q.users == 0
                if last:
                    del self._queries[key]
            if last:
                q.close()

    def running(self) -> int:
        """Queries holding an account here now (for tests and status)."""
        with self._lock:
            return len(self._queries)

    def close(self) -> None:
        """At node stop: a directory of the node's own making goes with it."""
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class QueryMemory:
    """One query's bytes on this node and its spill directory (thread-safe: its fragments
    run in threads of their own)."""

    def __init__(self, node: NodeMemory, key: str, quota: int, spill: bool) -> None:
        self.node = node
        self.key = key
        self.quota = quota
        self.spill = spill
        self.users = 0
        self.used = 0
        self.closed = False
        self._lock = threading.Lock()
        self._dir: Path | None = None  # made on first spill: most queries never spill
        self._made = False
        self.files = 0  # spill files made so far

    def take(self, n: int) -> bool:
        with self._lock:
            if self.closed or self.used + n > self.quota or not self.node.take(n):
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            if self.closed:
                return  # everything went back at close
            self.used -= n
            self.node.give(n)

    def new_file(self, kind: str) -> Path:
        """A new spill file's path in the query's directory (made on first use)."""
        with self._lock:
            if self.closed:
                raise ShardexError(
                    "the query ended while its operators were spilling",
                    code=ErrorCode.QUERY_CANCELLED,
                    details={"hint": "nothing to do: the query's rows are no longer read"},
                )
            if not self._made:
                self.directory.mkdir(parents=True, mode=0o700, exist_ok=True)
                self._made = True
            self.files += 1
            return self.directory / f"{kind}-{self.files}"

    @property
    def directory(self) -> Path:
        if self._dir is None:
            self._dir = self.node.root / _UNSAFE.sub("_", self.key)
        return self._dir

    def close(self) -> None:
        """Give every byte back to the node and remove the spill directory. A thread still
        running the query's operators finds the account closed: it can grow nothing and
        make no file, and ends with an error nobody reads."""
        with self._lock:
            self.closed = True
            self.node.give(self.used)
            self.used = 0
            made = self._made
        if made:
            shutil.rmtree(self.directory, ignore_errors=True)
            log.info(
                "query %s spilled %d files past its budget of %d bytes",
                self.key,
                self.files,
                self.quota,
            )


class FragmentMemory:
    """One fragment's handle on its query's memory: each run of its operators (an inline run
    may restart, ``bridge.py``) gets a fresh ``Budget``; the earlier ones are closed."""

    def __init__(self, query: QueryMemory) -> None:
        self.query = query
        self._budgets: list[Budget] = []

    def budget(self) -> Budget:
        self.close()
        b = Budget(self.query)
        self._budgets.append(b)
        return b

    def close(self) -> None:
        for b in self._budgets:
            b.close()
        self._budgets.clear()


class Reservation:
    """The bytes one operator holds. ``grow`` after building (the bytes are in memory
    already): False means "over the budget": spill and ``release``, or raise ``over``."""

    __slots__ = ("budget", "chunk", "fixed", "granted", "operator", "spill", "used")

    def __init__(
        self,
        budget: Budget,
        operator: str,
        spill: Callable[[], None] | None,
        fixed: bool = False,
    ) -> None:
        self.budget = budget
        self.operator = operator
        self.spill = spill  # how another operator of the run may make this one spill
        self.fixed = fixed  # what it holds cannot be written out: others make room first
        self.used = 0
        self.granted = 0
        self.chunk = min(CHUNK, max(4096, budget.quota // 16))

    def grow(self, n: int) -> bool:
        self.used += n
        if self.used <= self.granted:
            return True
        need = self.used - self.granted
        for ask in (max(need, self.chunk), need):
            if self.budget.take(ask, self):
                self.granted += ask
                return True
        return False

    def shrink(self, n: int) -> None:
        """``n`` bytes freed (or handed on downstream); whole chunks left over go back."""
        self.used = max(0, self.used - n)
        spare = self.granted - self.used - self.chunk
        if spare > self.chunk:
            self.granted -= spare
            self.budget.give(spare)

    def release(self) -> None:
        if self.granted:
            self.budget.give(self.granted)
        self.used = self.granted = 0

    def over(self, size: int | None = None, why: str = "") -> ShardexError:
        return self.budget.over(self.operator, self.used if size is None else size, why)


class Budget:
    """One run of a fragment's operators: their reservations, drawn from the query's."""

    def __init__(self, query: QueryMemory) -> None:
        self.query = query
        self.quota = query.quota
        self.spill = query.spill
        self._held: list[Reservation] = []

    def reserve(
        self, operator: str, spill: Callable[[], None] | None = None, *, fixed: bool = False
    ) -> Reservation:
        """A reservation for ``operator`` (named in errors); ``spill``: a way to make it
        write out what it holds when another operator of this run needs the bytes (only
        for operators suspended in a consistent state whenever another runs: sorts).
        ``fixed``: what it holds can go nowhere (one window partition): every sort of the
        run spills before it is refused, whatever they hold."""
        r = Reservation(self, operator, spill, fixed)
        self._held.append(r)
        return r

    def take(self, n: int, asking: Reservation) -> bool:
        if self.query.take(n):
            return True
        if not self.spill:
            return False
        # Before the asking operator spills, a sort further down the chain that holds more
        # spills instead: writing a sorted run is cheaper than re-partitioning a table.
        for r in sorted(self._held, key=lambda r: -r.used):
            if r is asking or r.spill is None or not r.used:
                continue
            if r.used <= asking.used and not asking.fixed:
                continue
            r.spill()
            if self.query.take(n):
                return True
        return False

    def give(self, n: int) -> None:
        self.query.give(n)

    def over(self, operator: str, size: int, why: str = "") -> ShardexError:
        q = self.query
        node = q.node
        reason = why or ("spilling is off" if not self.spill else "it cannot spill what it holds")
        return ShardexError(
            f"{operator} needs more than the query's memory budget of {q.quota} bytes "
            f"(it holds {size} bytes; the query {q.used} of {q.quota}, the node's SQL "
            f"{node.used} of {node.capacity}): {reason}",
            code=ErrorCode.QUERY_MEMORY_LIMIT,
            details={
                "operator": operator,
                "value": size,
                "limit": q.quota,
                "node_used": node.used,
                "node_limit": node.capacity,
                "hint": "add a LIMIT or a narrower WHERE, raise memory_quota (up to the "
                "node's sql_query_memory), or let the query spill (spill=True)",
            },
        )

    def close(self) -> None:
        for r in self._held:
            r.release()
        self._held.clear()
