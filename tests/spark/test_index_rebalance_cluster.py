"""Index rebalance end to end: a 3-node cluster and the Spark pipeline (in this process, on
the shared SparkSession) maintain two partitioned indexes while a writer keeps mutating;
a 4th node joins and ``shardex rebalance`` moves data partitions and index partitions to it
online. Afterwards the oracle holds at a published stability TS, request_plus scans see
every acknowledged write, and ``list_indexes`` shows the new placement.

Meanwhile paginated index scans (``client.scan_page``: random page sizes, ordered and
unordered, request_plus) run back to back: each pins the stability TS of its first page, so
the union of its pages must be exactly the oracle at that TS, no row lost and none doubled,
also when an index partition switched to node4 between two of its pages. This cluster is
the module's own (it gains a node): it does not use ``shared_cluster``."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cluster_helpers import run_cli
from data_helpers import running_cluster
from pipeline_helpers import (
    Writer,
    check_oracle,
    documents_at,
    mutate,
    running_pipeline,
    wait_stable,
)

from shardex.client import Client, connect_local
from shardex.core.keycodec import decode_entry
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.oracle import expected_entries
from shardex.manager.index_rebalance import DROP_GRACE
from shardex.meta.index_state import find_index
from shardex.pipeline.indexers import index_state, list_slices
from shardex.scan.paging_leases import LEASE_TTL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from shardex.pipeline.driver import PipelineDriver

KEYSPACE = "ixreb"
NAMES = ["by_age", "by_city"]
WAIT = 180.0
PAGE_SIZES = [3, 17, 60, 250]

Row = tuple[list[Any], str]


@dataclass
class Env:
    path: Path
    client: Client
    driver: PipelineDriver


@pytest.fixture(scope="module")
def env(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("ixreb")
    path = root / "cluster"
    with running_cluster(path, nodes=3), connect_local(path, as_node=True) as client:
        client.create_keyspace(KEYSPACE, num_partitions=8)
        mutate(client, KEYSPACE, random.Random(3), 300)
        # by_age: partitioned by docid; by_city: by a key that moves between slices. Nine
        # slices over three nodes: node4 receives two of them.
        client.create_index(
            KEYSPACE, "by_age", ["age", "name"], partition_by=["META().id"], num_partition=4
        )
        client.create_index(
            KEYSPACE, "by_city", ["city", "age"], partition_by=["city"], num_partition=5
        )
        with running_pipeline(spark, path, root / "ckpt") as driver:
            for name in NAMES:
                client.wait_for_index(KEYSPACE, name, timeout=240)
            yield Env(path, client, driver)


def _scan(client: Client, name: str) -> list[Row]:
    got = client.scan(KEYSPACE, name, consistency="request_plus", timeout=WAIT)
    return [(r["key"], r["docid"]) for r in got]


def _expected(client: Client, name: str, ts: Timestamp | None = None) -> list[Row]:
    """The index's entries over the documents as of ``ts`` (default: now), in index order."""
    rec = find_index(index_state(client).indexes, KEYSPACE, name)
    assert rec is not None
    docs = documents_at(client, KEYSPACE, client.high_seqnos(KEYSPACE) if ts is None else ts)
    entries = sorted(e for _, e in expected_entries(rec.definition, docs))
    return [decode_entry(e, rec.definition.desc) for e in entries]


@dataclass
class PagedScan:
    """One completed paginated scan: every page's rows, the TS they all read, and the index
    topology seq_num before its first page and after its last."""

    index: str
    ordered: bool
    ts: Timestamp
    rows: list[Row]
    seqs: tuple[int, int]
    pages: int


@dataclass
class PagedScans:
    """Paginated request_plus scans one after the other in a thread until stopped. A scan
    whose pinned snapshot was released (SNAPSHOT_TOO_OLD: the writer keeps the stability TS
    moving) is restarted, as a caller must; any other error ends the thread and the test."""

    path: Path
    seed: int
    done: list[PagedScan] = field(default_factory=list)
    restarted: int = 0
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.thread = threading.Thread(target=self._run, name="paged-scans", daemon=True)

    def _seq(self, client: Client, name: str) -> int:
        items = {i["name"]: i for i in client.list_indexes(KEYSPACE, stats=False)}
        return int(items[name]["topology_seq"])

    def _one(self, client: Client, name: str, ordered: bool) -> PagedScan:
        before = self._seq(client, name)
        rows: list[Row] = []
        ts: Timestamp | None = None
        cont: str | None = None
        pages = 0
        while True:
            page = client.scan_page(
                KEYSPACE,
                name,
                consistency="request_plus",
                page_size=self.rng.choice(PAGE_SIZES),
                continuation=cont,
                ordered=ordered,
                timeout=WAIT,
            )
            pages += 1
            assert page.ts is not None and (ts is None or page.ts == ts)
            ts = page.ts
            rows += [(r["key"], r["docid"]) for r in page.rows]
            cont = page.continuation
            if cont is None:
                return PagedScan(name, ordered, ts, rows, (before, self._seq(client, name)), pages)

    def _run(self) -> None:
        with connect_local(self.path, as_node=True) as client:
            while not self.stop.is_set():
                name = self.rng.choice(NAMES)
                ordered = self.rng.random() < 0.5
                try:
                    self.done.append(self._one(client, name, ordered))
                except ShardexError as exc:
                    if exc.code is ErrorCode.SNAPSHOT_TOO_OLD:
                        self.restarted += 1
                        continue
                    self.errors.append(exc)
                    return
                except BaseException as exc:  # an assertion: reported by the test
                    self.errors.append(exc)
                    return

    def __enter__(self) -> PagedScans:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=WAIT + 60)


@dataclass
class HeldScan:
    """A pinned paginated scan begun before the rebalance and paged one row at a time
    (every page renews its lease) until ``finish`` reads the rest."""

    index: str
    ordered: bool
    ts: Timestamp
    rows: list[Row]
    cont: str | None


@dataclass
class HeldScans:
    path: Path
    scans: list[HeldScan] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, name="held-scans", daemon=True)

    def _page(self, client: Client, s: HeldScan, size: int) -> None:
        page = client.scan_page(
            KEYSPACE, s.index, consistency="request_plus", page_size=size,
            continuation=s.cont, ordered=s.ordered, timeout=WAIT,
        )  # fmt: skip
        assert page.ts == s.ts
        s.rows += [(r["key"], r["docid"]) for r in page.rows]
        s.cont = page.continuation

    def start(self, client: Client) -> None:
        for name in NAMES:
            for ordered in (False, True):
                page = client.scan_page(
                    KEYSPACE, name, consistency="request_plus", page_size=1, ordered=ordered,
                    timeout=WAIT,
                )  # fmt: skip
                assert page.ts is not None and page.continuation is not None
                rows = [(r["key"], r["docid"]) for r in page.rows]
                self.scans.append(HeldScan(name, ordered, page.ts, rows, page.continuation))
        self.thread.start()

    def _run(self) -> None:
        # A page every few seconds keeps each lease (60 s) alive through a slow rebalance.
        with connect_local(self.path, as_node=True) as client:
            while not self.stop.wait(3.0):
                try:
                    for s in self.scans:
                        if s.cont is not None:
                            self._page(client, s, 1)
                except BaseException as exc:  # reported by the test
                    self.errors.append(exc)
                    return

    def finish(self, client: Client) -> list[HeldScan]:
        self.stop.set()
        self.thread.join(timeout=WAIT + 60)
        assert not self.errors, self.errors
        for s in self.scans:
            while s.cont is not None:
                self._page(client, s, 50)
        return self.scans


def _held_by(client: Client, nodes: list[str]) -> set[tuple[str, int]]:
    """(index id, partition) of every slice on ``nodes``."""
    return {(s.index_id, s.partition) for s in list_slices(client, nodes, None)}


def check_paged_scans(client: Client, scans: PagedScans) -> None:
    """Every completed scan is exactly the oracle at its pinned TS."""
    assert not scans.errors, scans.errors
    oracle: dict[tuple[str, Timestamp], list[Row]] = {}
    for s in scans.done:
        key = (s.index, s.ts)
        if key not in oracle:
            oracle[key] = _expected(client, s.index, s.ts)
        want = oracle[key]
        where = f"{s.index} ordered={s.ordered} at {s.ts!r}, {s.pages} pages, seqs {s.seqs}"
        if s.ordered:
            assert s.rows == want, where
        else:  # as multisets: a row returned twice is caught as well as one lost
            assert sorted(s.rows, key=repr) == sorted(want, key=repr), where


# Slow for its length (1.5-4 min on the shared 2-core machine: its own cluster and pipeline,
# a node added, a rebalance, the drop grace). A post-rebalance request_plus scan hung once
# and did not hang again in 8 runs and 210 scans around a rebalance; every
# scan wait is bounded by the scan's deadline (the test below), so a recurrence fails with
# SCAN_TIMEOUT naming the lagging partitions instead of hanging (``kill -USR1`` a node for
# its threads and tasks).
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rebalance_moves_index_partitions_online(env: Env) -> None:
    c = env.client
    before = {i["name"]: i for i in c.list_indexes(KEYSPACE)}
    assert all(set(i["nodes"]) <= {"node1", "node2", "node3"} for i in before.values())
    run_cli("cluster", "add-node", "--dir", str(env.path))
    held = HeldScans(env.path)
    with Writer(c, KEYSPACE, seed=5, pause=0.05) as writer, PagedScans(env.path, 9) as scans:
        held.start(c)  # pinned before any move: older than every move's copy TS
        proc = run_cli("rebalance", "--dir", str(env.path), "--json", timeout=600)
        result = json.loads(proc.stdout)
        # Past the sources' drop grace: only the leases keep the handed-over slices now.
        time.sleep(DROP_GRACE + 2.0)
    assert writer.done > 0
    index_moves = [m for m in result["moves"] if m["index"]]
    assert result["state"] == "done", result["message"]
    assert index_moves and all(m["status"] == "done" for m in index_moves)
    assert {m["target"] for m in index_moves} == {"node4"}
    assert any(not m["index"] for m in result["moves"])  # data partitions moved too

    # The new placement, one topology per move, slices balanced over the four indexers.
    after = {i["name"]: i for i in c.list_indexes(KEYSPACE, fresh=True)}
    load: dict[str, int] = {}
    for name, item in after.items():
        moved = [m for m in index_moves if m["index"] == name]
        assert item["topology_seq"] == before[name]["topology_seq"] + len(moved)
        for m in moved:
            assert item["partitions"][m["partition"]] == "node4"
        for node in item["partitions"].values():
            load[node] = load.get(node, 0) + 1
    assert set(load) == {"node1", "node2", "node3", "node4"}
    assert max(load.values()) - min(load.values()) <= 1

    # The oracle at a published stability TS (the slices read from the new owners).
    ts = wait_stable(c, KEYSPACE, NAMES)
    for name in NAMES:
        check_oracle(c, KEYSPACE, name, ts)
    # Paged scans during the rebalance: each exact at its TS, some across a switch.
    check_paged_scans(c, scans)
    # Scans pinned before the moves, finished after them: their TS is older than the copy
    # on the new owner, so their moved partitions are read at the sources, which kept them.
    moves = index_state(c).rebalance.index_moves  # type: ignore[union-attr]
    copies = [Timestamp.from_wire(m.copy_ts) for m in moves if m.copy_ts]
    sources = {(m.index_id, m.partition): m.source for m in moves}
    assert _held_by(c, sorted(set(sources.values()))) >= set(sources), "retired slices dropped"
    for h in held.finish(c):
        assert all(t.covers(h.ts) and t != h.ts for t in copies), (h.ts, copies)
        want = _expected(c, h.index, h.ts)
        got = h.rows if h.ordered else sorted(h.rows, key=repr)
        assert got == (want if h.ordered else sorted(want, key=repr)), (h.index, h.ordered)
    # Their last pages released their leases: the sources drop the slices once no lease is
    # left (a scan restarted after SNAPSHOT_TOO_OLD never released its lease: it expires).
    deadline = time.monotonic() + LEASE_TTL + 60.0
    while _held_by(c, sorted(set(sources.values()))) & set(sources):
        assert time.monotonic() < deadline, "the sources kept their handed-over slices"
        time.sleep(0.5)
    straddled = [s for s in scans.done if s.seqs[0] != s.seqs[1]]
    assert straddled, (
        f"no paged scan spanned an index partition switch: {len(scans.done)} completed, "
        f"{scans.restarted} restarted (SNAPSHOT_TOO_OLD)"
    )
    # request_plus sees every acknowledged write, also writes made after the moves.
    mutate(c, KEYSPACE, random.Random(11), 120)
    for name in NAMES:
        assert _scan(c, name) == _expected(c, name)


@pytest.mark.slow  # the module's cluster and pipeline take a minute to start
@pytest.mark.timeout(600)
def test_request_plus_behind_the_index_ends_in_scan_timeout_at_its_deadline(env: Env) -> None:
    """A request_plus scan whose slices cannot reach the wanted TS (the pipeline is stopped
    after a write) ends in SCAN_TIMEOUT naming how far behind, at its deadline, not later."""
    c = env.client
    env.driver.stop()
    deadline = time.monotonic() + 120.0
    while any(kp.query is not None and kp.query.isActive for kp in env.driver.keyspaces.values()):
        assert time.monotonic() < deadline, "the pipeline's queries did not stop"
        time.sleep(0.2)
    c.keyspace(KEYSPACE).upsert("unindexed", {"age": 7, "name": "late", "city": "nowhere"})
    timeout = 2.0
    for name in NAMES:
        started = time.monotonic()
        with pytest.raises(ShardexError) as info:
            c.scan(KEYSPACE, name, consistency="request_plus", timeout=timeout)
        elapsed = time.monotonic() - started
        assert info.value.code is ErrorCode.SCAN_TIMEOUT, info.value
        assert info.value.details["mutations_behind"] >= 1, info.value.details
        # Its own deadline, not the per-request margin (10 s) or the client's stream wait.
        assert elapsed < timeout + 7.0, f"{name}: SCAN_TIMEOUT after {elapsed:.1f}s"
