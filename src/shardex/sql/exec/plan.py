"""Physical planning: a bound SELECT (+ parameters + the cluster state) -> ``PhysicalPlan``,
which becomes the protocol's ``QueryPlan`` of fragments once the stability TS is known.

Shape (the SQL protocol specification's fragments, split at exchanges)::

    root  (initiator)   sql.root: merge / final aggregate / distinct / order / offset+limit
      ^ one unicast exchange (edge) per indexer node
    leaf  (each indexer node holding slices to read)   sql.leaf: scan the local slices at
          the query's stability TS -> fetch documents unless covering -> LET, WHERE ->
          partial aggregate | local top-N sort | project (+ limit pushed down)

Documents named by key (USE KEYS, ``META().id = c`` / ``IN``), a FROM without keyspace, and
no FROM at all run as the root alone (``mode = "local"``): no index is read. A key lookup
of at most ``INLINE_KEYS`` documents (``inline`` switch on) does not even start the
root fragment: the initiator fetches and evaluates on its loop (EXPLAIN says so).

Late materialization (``late``, decision 0111): an ORDER BY ... LIMIT over several leaves,
whose index covers LET, WHERE and ORDER BY but not the projection, has its leaves rank the
entries without documents and send ``[sort key, docid]``; the root merges, cuts to the limit
and only then fetches the documents it returns (``late.py``). Without it every leaf fetches
the documents of its own top rows: up to leaves x limit fetches for limit results.

Fragments carry the statement's text, not its tree: every member parses and binds the same
text the same way (``bind_statement``), which keeps the plan small and the wire format free
of expression trees. ``dml`` marks the SELECT a DELETE/UPDATE derives (``dml_select``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardex.api.spans import (
    DecodedSpan,
    decode_user_span,
    eliminate_decoded,
    encode_decoded,
    plain_spans,
    to_user_spans,
)
from shardex.core.expr import Param, evaluate
from shardex.core.expr.analysis import Path
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import ACTIVE, IndexRecord, latest_index_topology
from shardex.meta.state import StateContext
from shardex.scan.scan_checks import check_servable
from shardex.sql.exec.analyze import (
    KeyLookup,
    doc_order,
    doc_where,
    key_lookup,
    ranking_paths,
    read_paths,
    reads_fetched_meta,
)
from shardex.sql.exec.fragment_rows import mode_of
from shardex.sql.exec.join_plan import JoinSides, plan_sides
from shardex.sql.exec.leaf_spec import LeafSpec
from shardex.sql.exec.plan_explain import explain_plan
from shardex.sql.exec.plan_kinds import INLINE_KEYS as INLINE_KEYS
from shardex.sql.exec.plan_kinds import LATE_MAX_ROWS as LATE_MAX_ROWS
from shardex.sql.exec.plan_kinds import LEAF_KIND as LEAF_KIND
from shardex.sql.exec.plan_kinds import ROOT_KIND as ROOT_KIND
from shardex.sql.exec.statements import bound_statement
from shardex.sql.exec.subqueries import expression_runner
from shardex.sql.exec.tuning import check_tuning
from shardex.sql.local_rows import eval_count
from shardex.sql.planner.choose import DOCID, IndexChoice, choose_index, covers
from shardex.sql.planner.exact import where_decided
from shardex.sql.planner.key_ranges import key_spans
from shardex.sql.protocol import FragmentSpec, QueryPlan
from shardex.sql.syntax.bind import BoundSelect
from shardex.sql.syntax.subquery import running_subqueries

__all__ = [
    "Leaf",
    "PhysicalPlan",
    "bind_statement",
    "lookup_keys",
    "no_keyspace",
    "plan_select",
]


def bind_statement(sql: str, dml: bool, *, cached: bool = True) -> BoundSelect:
    """The bound SELECT of ``sql`` (the one a DML statement derives when ``dml``), from the
    statement cache unless ``cached`` is False."""
    return bound_statement(sql, dml, cached=cached)


@dataclass(frozen=True)
class Leaf:
    member: str  # member id (protocol participant)
    node: str  # node name (topologies)
    partitions: list[int]


@dataclass
class PhysicalPlan:
    bound: BoundSelect
    mode: str  # group | sort | rows | local
    source: str  # index | keys | none | expr
    keyspace: str | None = None
    choice: IndexChoice | None = None
    record: IndexRecord | None = None
    spans: list[dict[str, Any]] = field(default_factory=list)
    leaves: list[Leaf] = field(default_factory=list)
    limit: int | None = None
    offset: int = 0
    ordered: bool = False  # leaves stream in index order (it satisfies ORDER BY): no sort
    decided: bool = False  # the spans decide WHERE (``planner.exact``): leaves skip it
    tuning: dict[str, bool] = field(default_factory=lambda: check_tuning(None))
    query_id: str | None = None  # once started
    inline: bool = False  # a small key lookup run on the initiator's loop (no fragment)
    # The parameters it runs with, once started: its subqueries' inputs added (0139).
    params: Any = None
    local: bool = False  # the one leaf and the root ran in-process here (``local_leaf``)
    late: bool = False  # leaves send sort keys and docids; the root fetches (decision 0111)
    guessed: Timestamp | None = None  # request_plus read at the TS pinned last (``pin_guess``)
    called: bool = False  # leaves asked by request and reply (``leaf_calls``), not streamed
    point: bool = False  # its one local leaf read as plain calls (``point_read``)
    # A join statement (``mode`` "join"): its side statements and join methods, run at the
    # initiator (``join_run``), and how EXPLAIN plans a side statement (each runs as a
    # SELECT of its own, planned when it starts).
    join: JoinSides | None = None
    side_planner: Callable[[str, bool], PhysicalPlan] | None = None

    def decoded_spans(self) -> list[DecodedSpan]:
        """The spans' bounds as key parts, once per plan (partition elimination and the
        leaves' encoded spans both read them): straight from ``spans`` when their values
        are plain (``plain_spans``), else through the caller's checked form, as a scan's."""
        found: list[DecodedSpan] | None = self.__dict__.get("_decoded")
        if found is None:
            assert self.record is not None
            n_keys = len(self.record.definition.keys)
            found = plain_spans(self.spans, n_keys)
            if found is None:
                found = [
                    (*decode_user_span(span, i, n_keys), span.inclusion)
                    for i, span in enumerate(to_user_spans(self.spans))
                ]
            self.__dict__["_decoded"] = found
        return found

    @property
    def repeatable(self) -> bool:
        """Run again at the same TS, the plan yields the same rows in the same order: they
        come from the index alone (covering: no document fetched, which may have changed
        since) and ORDER BY is a total order (``META().id`` among its terms; each docid is
        one row). The caller checks the TS is pinned."""
        b, choice = self.bound, self.choice
        if choice is None or not choice.covering or b.grouped or b.distinct or b.windows:
            return False
        return any(k.expr == DOCID for k in statement_facts(b).order)

    @property
    def top(self) -> int | None:
        """Rows a leaf needs at most (limit pushdown), None when it must send all."""
        b = self.bound
        if self.limit is None or b.grouped or b.distinct or b.windows:
            return None  # a window reads every row of its partition
        return self.offset + self.limit

    def _common(self, sql: str, dml: bool, budget: int, spill: bool) -> dict[str, Any]:
        return {
            "sql": sql,
            "dml": dml,
            "mode": self.mode,
            "budget": budget,
            "spill": spill,
            "tuning": self.tuning,
        }

    def root_args(self, sql: str, dml: bool, budget: int, spill: bool = True) -> dict[str, Any]:
        """The ``sql.root`` fragment's arguments."""
        return {
            **self._common(sql, dml, budget, spill),
            "source": self.source,
            "keyspace": self.keyspace,
            "limit": self.limit,
            "offset": self.offset,
            # A DML's derived SELECT keeps the plain path: its rows feed writes, not a client.
            "late": self.late and not dml,
        }

    def query_plan(
        self,
        sql: str,
        dml: bool,
        initiator: str,
        ts: Timestamp | None,
        budget: int,
        spill: bool = True,
    ) -> QueryPlan:
        """``budget``: the query's memory quota in bytes on each member; ``spill``: whether
        its operators may spill past it (decision 0106)."""
        common = self._common(sql, dml, budget, spill)
        fragments: list[FragmentSpec] = []
        inputs: list[int] = []
        late = self.late and not dml
        if self.choice is not None and self.record is not None:
            defn = self.record.definition
            wire_spans = [
                [s.low, s.high, s.low_inclusive, s.high_inclusive]
                for s in encode_decoded(self.decoded_spans(), defn) or []
            ]
            for i, leaf in enumerate(self.leaves, start=1):
                args = {
                    **common,
                    "keyspace": self.keyspace,
                    "index_id": defn.id,
                    "keys": [k.expr for k in defn.keys],
                    "desc": list(defn.desc),
                    "partitions": leaf.partitions,
                    "spans": wire_spans or None,
                    "ts": None if ts is None else dict(ts.to_wire()),
                    "covering": self.choice.covering,
                    "top": self.top,
                    "ordered": self.ordered,
                    "late": late,
                    "decided": self.decided,
                }
                fragments.append(
                    FragmentSpec(
                        fragment_id=i, kind=LEAF_KIND, members=[leaf.member], args=args, output=i
                    )
                )
                inputs.append(i)
        root = FragmentSpec(
            fragment_id=0,
            kind=ROOT_KIND,
            members=[initiator],
            args=self.root_args(sql, dml, budget, spill),
            inputs=inputs,
        )
        return QueryPlan(fragments=[root, *fragments])

    def leaf_spec(
        self, leaf: Leaf, dml: bool, ts: Timestamp | None, budget: int, spill: bool = True
    ) -> LeafSpec:
        """What ``leaf`` runs, as ``query_plan``'s leaf fragment would carry it, but as
        objects: for a leaf run in-process (``local_leaf``), nothing encoded or decoded."""
        assert self.choice is not None and self.record is not None and self.keyspace
        defn = self.record.definition
        return LeafSpec(
            b=self.bound,
            keyspace=self.keyspace,
            index_id=defn.id,
            partitions=leaf.partitions,
            spans=encode_decoded(self.decoded_spans(), defn) or None,
            ts=ts,
            desc=list(defn.desc),
            key_paths=list(self.choice.key_paths),
            once=defn.array_pos >= 0,
            covering=self.choice.covering,
            ordered=self.ordered,
            decided=self.decided,
            late=self.late and not dml,
            mode=self.mode,
            top=self.top,
            budget=budget,
            spill=spill,
            tuning=self.tuning,
        )

    def explain(self) -> dict[str, Any]:
        return explain_plan(self)


def no_keyspace(keyspace: str) -> ShardexError:
    return ShardexError(
        f"keyspace {keyspace!r} not found",
        code=ErrorCode.KEYSPACE_NOT_FOUND,
        details={"keyspace": keyspace, "hint": "shardex keyspace list (or check the spelling)"},
    )


def _counts(b: BoundSelect, params: Any, resolve_params: bool) -> tuple[int | None, int]:
    """LIMIT and OFFSET; for EXPLAIN without parameter values, those it can evaluate."""
    if resolve_params:
        return eval_count(b.limit, params, "LIMIT"), eval_count(b.offset, params, "OFFSET") or 0
    try:
        limit = eval_count(b.limit, params, "LIMIT")
    except ShardexError:
        limit = None
    try:
        offset = eval_count(b.offset, params, "OFFSET") or 0
    except ShardexError:
        offset = 0
    return limit, offset


@dataclass(frozen=True)
class _Facts:
    """What planning reads off a bound SELECT whatever the parameters and the cluster."""

    key_lookup: KeyLookup | None  # the ids it names, when it names them
    where: Any
    order: Any
    read_paths: Any
    ranking_paths: set[Path] | None  # what leaves must cover to rank without documents
    # The index chosen, by the active index definitions' ids and the USE INDEX hint: the
    # choice reads the statement's shape, never its parameter values, and weighing every
    # index was a third of a point query's planning. Ids are never reused (a re-created
    # index gets a new one), so a key stays true. Bounded: see ``CHOICES_MAX``.
    choices: dict[tuple[tuple[str, ...], str | None], IndexChoice] = field(
        default_factory=dict, compare=False
    )


FACTS_MAX = 512
CHOICES_MAX = 16  # index choices kept per statement (one per set of active indexes)
_facts_memo: OrderedDict[int, tuple[BoundSelect, _Facts]] = OrderedDict()


def statement_facts(b: BoundSelect) -> _Facts:
    """``_Facts`` of ``b``, once per bound statement object (the statement cache hands the
    same one to every execution of a text). Keyed by identity with ``b`` kept alive, so the
    id is not reused; an LRU. Planning runs on the event loop only."""
    hit = _facts_memo.get(id(b))
    if hit is not None:
        _facts_memo.move_to_end(id(b))
        return hit[1]
    order = doc_order(b) if not b.grouped and not b.order_aliases else []
    ranking = ranking_paths(b) if order else None
    facts = _Facts(key_lookup(b), doc_where(b), order, read_paths(b), ranking)
    _facts_memo[id(b)] = (b, facts)
    if len(_facts_memo) > FACTS_MAX:
        _facts_memo.popitem(last=False)
    return facts


def plan_select(
    b: BoundSelect,
    params: Any,
    *,
    state: StateContext,
    members: dict[str, str],
    resolve_params: bool = True,
    tuning: dict[str, bool] | None = None,
    avoid: frozenset[str] = frozenset(),
) -> PhysicalPlan:
    """Choose the source, the index and its spans, and the leaves. ``members``: node name
    -> member id of the live members. ``resolve_params`` False (EXPLAIN without values):
    spans are left empty when they need parameter values. Each index partition's leaf runs
    on its first copy (primary, then replicas) that is a live member not in ``avoid`` (the
    nodes that failed this query already)."""
    limit, offset = _counts(b, params, resolve_params)
    switches = check_tuning(tuning)
    if b.joins:
        plan = PhysicalPlan(b, "join", "join", limit=limit, offset=offset, tuning=switches)
        _plan_join(plan, params, state, members, resolve_params, tuning, avoid)
        return plan
    ref = b.from_
    if ref is None:
        return PhysicalPlan(b, "local", "none", limit=limit, offset=offset, tuning=switches)
    if ref.source is not None:
        return PhysicalPlan(b, "local", "expr", limit=limit, offset=offset, tuning=switches)
    keyspace = ref.name
    if keyspace not in state.keyspaces:
        raise no_keyspace(keyspace)
    if len(ref.use_index) > 1:
        raise ShardexError(
            "USE INDEX names one index here",
            code=ErrorCode.BAD_REQUEST,
            details={"value": list(ref.use_index), "hint": "USE INDEX (name)"},
        )
    use_index = ref.use_index[0] if ref.use_index else None
    facts = statement_facts(b)
    if facts.key_lookup is not None and use_index is None:
        return PhysicalPlan(
            b, "local", "keys", keyspace, limit=limit, offset=offset, tuning=switches
        )
    records = [r for r in state.indexes.values() if r.definition.keyspace == keyspace]
    if use_index is not None:
        hinted = [r for r in records if r.definition.name == use_index]
        if hinted:
            check_servable(hinted[0], keyspace, use_index)  # INDEX_NOT_READY names why
    active = [r for r in records if r.state == ACTIVE]
    order = facts.order
    known = (tuple(r.definition.id for r in active), use_index)
    choice = facts.choices.get(known)
    if choice is None:
        choice = choose_index(
            [r.definition for r in active],
            facts.where,
            keyspace=keyspace,
            read_paths=facts.read_paths,
            order_by=order,
            use_index=use_index,
        )
        if len(facts.choices) >= CHOICES_MAX:
            facts.choices.clear()  # index sets seldom change: start over
        facts.choices[known] = choice
    record = next(r for r in active if r.definition.id == choice.definition.id)
    defn = record.definition
    spans: list[dict[str, Any]] = []
    if resolve_params:
        spans = key_spans(choice.per_key, list(defn.desc), params)
    else:
        try:
            spans = key_spans(choice.per_key, list(defn.desc), None)
        except ShardexError:
            spans = []
    mode = mode_of(b)
    decided = (
        resolve_params
        and not b.unnests  # WHERE reads elements too: spans decide no such conjunct
        and choice.covering
        and not defn.is_primary
        and switches["exact_spans"]
        and where_decided(facts.where, choice.keys, choice.per_key, params)
    )
    plan = PhysicalPlan(
        b,
        mode,
        "index",
        keyspace,
        choice,
        record,
        spans,
        limit=limit,
        offset=offset,
        ordered=bool(order)
        and mode == "sort"  # the only mode whose leaves rank rows
        and choice.ordered
        and not b.distinct
        and switches["index_order"],
        decided=decided,
        tuning=switches,
    )
    if not spans or limit == 0:
        return plan  # nothing can match: the root alone (a global aggregate still answers)
    topo = latest_index_topology(state.index_topologies, record.id)
    if topo is None or not topo.assignment:
        raise ShardexError(
            f"index {defn.name!r} on {keyspace!r} has no topology",
            code=ErrorCode.INDEX_NOT_READY,
            details={"keyspace": keyspace, "index": defn.name},
        )
    by_node: dict[str, list[int]] = {}
    for p in eliminate_decoded(plan.decoded_spans(), defn):
        if p not in topo.assignment:
            raise ShardexError(
                f"index partition {p} of {defn.name!r} has no indexer",
                code=ErrorCode.INDEX_NOT_READY,
                details={"index": defn.name, "partition": p},
            )
        copies = topo.chain(p)
        node = next((n for n in copies if n in members and n not in avoid), None)
        if node is None:
            down = copies[0] if len(copies) == 1 else copies
            raise ShardexError(
                f"no live indexer holds index partition {p} of {defn.name!r} "
                f"(its copies: {', '.join(copies)})",
                code=ErrorCode.NODE_UNAVAILABLE,
                details={
                    "node": down,
                    "index": defn.name,
                    "partition": p,
                    "hint": "shardex cluster status",
                },
            )
        by_node.setdefault(node, []).append(p)
    for node, parts in sorted(by_node.items()):
        plan.leaves.append(Leaf(members[node], node, parts))
    plan.late = _late_fetch_wins(plan, facts)
    return plan


def _plan_join(
    plan: PhysicalPlan,
    params: Any,
    state: StateContext,
    members: dict[str, str],
    resolve_params: bool,
    tuning: dict[str, bool] | None,
    avoid: frozenset[str],
) -> None:
    """``plan.join`` (``join_plan.plan_sides``), and its side statements' planner."""

    def plan_one(sql: str, resolve: bool) -> PhysicalPlan:
        b = bind_statement(sql, False, cached=plan.tuning["plan_cache"])
        return plan_select(
            b,
            params,
            state=state,
            members=members,
            resolve_params=resolve and resolve_params,
            tuning=tuning,
            avoid=avoid,
        )

    plan_sides(plan, state, no_keyspace)
    plan.side_planner = plan_one


def _late_fetch_wins(plan: PhysicalPlan, facts: _Facts) -> bool:
    """Late materialization where it saves fetches and costs nothing else: an ORDER BY ...
    LIMIT (small: the root holds the candidates) over several leaves, with documents to
    fetch (not covering) and an index that covers what ranks the rows (LET, WHERE, ORDER
    BY), so the leaves cut to the limit on the entries alone. One leaf fetches just its
    top rows already; a covering plan fetches nothing."""
    b, choice, top = plan.bound, plan.choice, plan.top
    return (
        plan.tuning["late"]
        and plan.mode == "sort"
        and not b.distinct
        and top is not None
        and 0 < top <= LATE_MAX_ROWS
        and len(plan.leaves) > 1
        and choice is not None
        and not choice.covering
        and choice.definition.array_pos < 0  # entries per element would rank one row twice
        and facts.ranking_paths is not None
        and covers(choice.key_paths, facts.ranking_paths)
        and not reads_fetched_meta(b)  # the root's fetch brings no CAS or expiry
    )


def lookup_keys(expr: Any, params: Any, *, dedupe: bool) -> list[str]:
    """The document ids a key lookup names (non-strings are ignored, as SQL++ does). USE
    KEYS keeps repeats (as the reference engine does); ``META().id IN [...]`` cannot."""
    if isinstance(expr, Param):  # the common ``META().id = $1``: no subquery inside
        keys = evaluate(expr, {}, params=params)
    else:
        with running_subqueries(expression_runner):  # USE KEYS (SELECT RAW ... FROM [...])
            keys = evaluate(expr, {}, params=params)
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(keys, list):
        return []
    strings = [k for k in keys if isinstance(k, str)]
    return list(dict.fromkeys(strings)) if dedupe else strings
