"""In-process stand-ins for the parts around the indexer, for tests and as a reference.

* ``FakeKeyspace``: documents with per-partition seqnos and a change log, and the documents
  *as of* any timestamp, which is what the oracle needs at a stability TS.
* ``LocalPipeline``: projector -> router -> indexer engines -> stabilise on every node, all
  in one process, without Spark: what the Spark maintenance job does per micro-batch, minus
  the distribution. Spark tests can compare against it; unit tests drive it with faults
  (re-delivery, random batch boundaries).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from shardex.core.expr import FunctionSpec, register_function
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.index.engine import IndexerEngine
from shardex.index.oracle import check_back_index, check_index
from shardex.index.slice import StabiliseAck
from shardex.meta.index_definition import IndexDefinition, make_definition
from shardex.meta.partitioning import partition_of
from shardex.pipeline.project.projector import (
    OP_DELETE,
    OP_UPSERT,
    ChangeRow,
    ProjectResult,
    project,
)
from shardex.pipeline.project.router import IndexRoute, route

__all__ = ["EXPLODE", "FakeKeyspace", "LocalPipeline", "random_workload", "workload_definitions"]


class Explosion(RuntimeError):
    """Not a ValueError/ArithmeticError: registered functions turn those into NULL, and the
    point of this function is an evaluation error that reaches the projector's counting."""


def _explode(x: Any) -> Any:
    if x == "boom":
        raise Explosion("TEST_EXPLODE met 'boom'")
    return x


EXPLODE = "TEST_EXPLODE"
"""A test-only function: ``TEST_EXPLODE(x)`` is ``x`` but raises for the string "boom", a
deterministic evaluation error that does not depend on any real function's edge cases."""
register_function(FunctionSpec(EXPLODE, 1, 1, _explode))


@dataclass
class FakeKeyspace:
    """A keyspace's history: ``log[p]`` holds (seqno, docid, op, body JSON) in seqno order."""

    num_partitions: int = 8
    uuid: int = 0xABC
    log: dict[int, list[tuple[int, str, str, bytes | None]]] = field(default_factory=dict)
    docs: dict[str, Any] = field(default_factory=dict)

    def partition(self, docid: str) -> int:
        return partition_of(docid, self.num_partitions)

    def _append(self, docid: str, op: str, body: bytes | None) -> tuple[int, int]:
        p = self.partition(docid)
        lst = self.log.setdefault(p, [])
        seqno = lst[-1][0] + 1 if lst else 1
        lst.append((seqno, docid, op, body))
        return p, seqno

    def upsert(self, docid: str, doc: Any) -> tuple[int, int]:
        self.docs[docid] = doc
        return self._append(docid, OP_UPSERT, msgspec.json.encode(doc))

    def upsert_raw(self, docid: str, body: bytes) -> tuple[int, int]:
        """Store a body as given (a test of malformed JSON)."""
        self.docs[docid] = body
        return self._append(docid, OP_UPSERT, body)

    def delete(self, docid: str) -> tuple[int, int]:
        self.docs.pop(docid, None)
        return self._append(docid, OP_DELETE, None)

    def ts(self) -> Timestamp:
        """Current high seqnos (every partition, 0 where nothing was written)."""
        return Timestamp(
            {
                p: (self.log[p][-1][0] if self.log.get(p) else 0, self.uuid)
                for p in range(self.num_partitions)
            }
        )

    def changes(self, start: Timestamp | None, end: Timestamp) -> list[ChangeRow]:
        """Change records with ``start[p] < seqno <= end[p]``, partition by partition."""
        out: list[ChangeRow] = []
        for p in range(self.num_partitions):
            lo = start.seqno(p) if start is not None else 0
            hi = end.seqno(p)
            for seqno, docid, op, body in self.log.get(p, ()):
                if lo < seqno <= hi:
                    out.append((docid, p, seqno, op, body))
        return out

    def documents_at(self, ts: Timestamp) -> dict[str, Any]:
        """The documents as of ``ts`` (replaying each partition's log up to ``ts[p]``)."""
        docs: dict[str, Any] = {}
        for p in range(self.num_partitions):
            hi = ts.seqno(p)
            for seqno, docid, op, body in self.log.get(p, ()):
                if seqno > hi:
                    break
                if op == OP_DELETE:
                    docs.pop(docid, None)
                else:
                    docs[docid] = body
        return docs


@dataclass
class LocalPipeline:
    """Projector -> router -> engines, and the timekeeper's stabilise round, in-process."""

    definitions: Sequence[IndexDefinition]
    engines: Mapping[str, IndexerEngine]  # node name -> engine
    placement: Mapping[str, Mapping[int, str]]  # index id -> index partition -> node
    errors: dict[str, int] = field(default_factory=dict)
    # index id -> index partition -> the nodes of its replica copies
    replicas: Mapping[str, Mapping[int, Sequence[str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.routes = {d.id: IndexRoute.of(d, self.topology(d.id)) for d in self.definitions}

    def topology(self, index_id: str) -> Topology:
        replicas = {p: list(ns) for p, ns in self.replicas.get(index_id, {}).items()}
        return Topology(seq_num=1, assignment=dict(self.placement[index_id]), replicas=replicas)

    def copies(self, index_id: str) -> list[tuple[int, str]]:
        """(index partition, node) of every copy, primaries first per partition."""
        topo = self.topology(index_id)
        return [(p, n) for p in sorted(topo.assignment) for n in topo.chain(p)]

    def create_slices(self) -> None:
        for d in self.definitions:
            for p, node in self.copies(d.id):
                self.engines[node].create_slice(d, p)

    def project_and_route(self, changes: Iterable[ChangeRow]) -> dict[str, list[Any]]:
        res: ProjectResult = project(self.definitions, changes)
        for k, v in res.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v
        return route(res.rows, self.routes).by_node

    def deliver(
        self,
        changes: Sequence[ChangeRow],
        *,
        rng: random.Random | None = None,
        redeliver: float = 0.0,
    ) -> None:
        """Send a micro-batch's key versions to the nodes. With ``rng``: in random chunks,
        chunks shuffled across nodes, and each chunk re-sent with probability
        ``redeliver`` (what an at-least-once sink does)."""
        by_node = self.project_and_route(changes)
        for node, rows in by_node.items():
            eng = self.engines[node]
            if rng is None:
                eng.enqueue(rows)
                continue
            i = 0
            chunks = []
            while i < len(rows):
                n = rng.randint(1, max(1, len(rows) // 3 + 1))
                chunks.append(rows[i : i + n])
                i += n
            rng.shuffle(chunks)
            for c in chunks:
                eng.enqueue(c)
                if rng.random() < redeliver:
                    eng.enqueue(c)

    def stabilise(self, ts: Timestamp) -> list[StabiliseAck]:
        acks: list[StabiliseAck] = []
        for d in self.definitions:
            for node in self.topology(d.id).copy_nodes():
                acks.extend(self.engines[node].stabilise(d.id, ts))
        return acks

    def entries(
        self, index_id: str, ts: Timestamp | None, *, replica: int = 0
    ) -> dict[int, list[bytes]]:
        """Every partition's entries, read from one copy: the primary (``replica`` 0) or the
        ``replica``-th replica copy (partitions with fewer copies are left out)."""
        topo = self.topology(index_id)
        out: dict[int, list[bytes]] = {}
        for node in topo.copy_nodes():
            for p, e in self.engines[node].entries(index_id, ts).items():
                chain = topo.chain(p)
                if replica >= len(chain) or chain[replica] != node:
                    continue  # another copy of p, read in its turn
                if p in out:
                    raise AssertionError(f"slice {index_id}/{p} hosted twice")
                out[p] = e
        return out

    def check_copies(self, index_id: str, ts: Timestamp | None) -> None:
        """Every replica copy holds exactly its primary's entries at ``ts`` (or the tip)."""
        primary = self.entries(index_id, ts)
        most = max((len(ns) for ns in self.replicas.get(index_id, {}).values()), default=0)
        for r in range(1, most + 1):
            for p, e in self.entries(index_id, ts, replica=r).items():
                if e != primary.get(p):
                    raise AssertionError(f"replica {r} of slice {index_id}/{p} differs")

    def check(self, ts: Timestamp, documents: Mapping[str, Any], *, tip: bool = False) -> None:
        """The oracle for every index at snapshot ``ts`` (or the tip) read from the primary
        copies, every replica copy equal to its primary, plus each slice's back index
        against its entries (at the tip)."""
        for d in self.definitions:
            at = None if tip else ts
            check_index(d, self.entries(d.id, at), documents, context=repr(ts))
            self.check_copies(d.id, at)
            for node in self.topology(d.id).copy_nodes():
                for sl in self.engines[node].slices(d.id):
                    check_back_index(
                        sl.entries(),
                        sl.back_rows(),
                        desc=sl.desc,
                        packed=sl.packed,
                        context=f"{d.id}/{sl.partition}",
                    )


def workload_definitions(keyspace: str = "ks") -> list[IndexDefinition]:
    """Six indexes covering the routing cases: a moving partition key with WHERE, docid
    partitioning with evaluation errors, unpartitioned with DESC, a primary index, and two
    array indexes (a leading array key partitioned by docid; a DESC array key after a plain
    key with a moving partition key, so whole sets of entries move between slices)."""
    return [
        make_definition(
            id="w_name",
            name="by_name",
            keyspace=keyspace,
            keys=["name", "age"],
            where="type = 'user'",
            partition_by=["city"],
            num_partition=4,
        ),
        make_definition(
            id="w_age",
            name="by_age",
            keyspace=keyspace,
            keys=[f"{EXPLODE}(age)", "name"],
            partition_by=["META().id"],
            num_partition=3,
        ),
        make_definition(
            id="w_city", name="by_city", keyspace=keyspace, keys=["city", ("score", True)]
        ),
        make_definition(id="w_primary", name="#primary", keyspace=keyspace, is_primary=True),
        make_definition(
            id="w_tags",
            name="by_tag",
            keyspace=keyspace,
            keys=["DISTINCT ARRAY t.k FOR t IN tags WHEN t.k != 'skip' END", "name"],
            partition_by=["META().id"],
            num_partition=2,
        ),
        make_definition(
            id="w_city_tags",
            name="by_city_tag",
            keyspace=keyspace,
            keys=["type", ("ALL ARRAY t.k FOR t IN tags END", True)],
            partition_by=["city"],
            num_partition=2,
        ),
    ]


def random_workload(ks: FakeKeyspace, rng: random.Random, n: int, *, pool: int = 60) -> None:
    """``n`` random mutations over ``pool`` docids: inserts, updates that change the indexed
    key and the partition key (city), deletes, re-inserts, documents that leave the WHERE
    filter, lose their leading key, or fail evaluation ("boom"); ``tags`` arrays (for the
    array indexes) that gain, lose and repeat elements, go empty, go missing or stop being
    arrays."""
    for _ in range(n):
        docid = f"doc{rng.randrange(pool)}"
        if docid in ks.docs and rng.random() < 0.2:
            ks.delete(docid)
            continue
        doc: dict[str, Any] = {"type": "user" if rng.random() < 0.8 else "admin"}
        if rng.random() < 0.9:
            doc["name"] = rng.choice(["ann", "bob", "cy", "dee", "eve"])
        r = rng.random()
        if r < 0.05:
            doc["age"] = "boom"
        elif r < 0.9:
            doc["age"] = rng.randrange(5)
        if rng.random() < 0.95:
            doc["city"] = rng.choice(["paris", "rome", "oslo", "lima", "kyiv"])
        if rng.random() < 0.8:
            doc["score"] = rng.choice([0.5, 1, 2.25, -3, None])
        r = rng.random()
        if r < 0.75:
            keys = ["a", "b", "c", "skip", 1, None]
            doc["tags"] = [{"k": rng.choice(keys)} for _ in range(rng.randrange(4))]
        elif r < 0.85:
            doc["tags"] = rng.choice(["a", {"k": "a"}, 3])  # not an array: no elements
        ks.upsert(docid, doc)
