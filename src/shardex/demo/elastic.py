"""Demo step: paginated scans over an index and over ``#primary`` while ``shardex rebalance``
moves data and index partitions onto a node that just joined.

No write changes the expected rows during this step: the documents are read from the data
service's change logs as of the keyspace's high seqnos (not through any index), the index's
expected entries are its definition evaluated over them (``shardex.index.oracle``), and the
primary scan must return every docid. A request_plus scan first waits until the index covers
those seqnos; the pages then read the tips (not_bounded). Only a ticker document that no index
holds is rewritten, because index moves wait for the pipeline's stabilise rounds and the
pipeline runs them only for micro-batches with changes (see ``Ticker``).

Why not request_plus pages: they pin one stability TS, and with the ticker publishing a new
snapshot several times a second that snapshot leaves the indexers' ring long before a scan of
hundreds of pages ends (SNAPSHOT_TOO_OLD: a clear error, by design).

``shardex rebalance --json`` runs as a child process; while it runs, the scans go back to back
with small pages, each counting its pages and the partition moves that completed meanwhile,
and each ends with ``rows read == rows expected`` (as multisets: nothing lost, nothing twice).

    python -m shardex.demo.elastic DIR [--index by_city] [--page-size 100]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from shardex.client import Client, connect_local
from shardex.core.keycodec import decode_entry
from shardex.core.timestamp import Timestamp
from shardex.demo.checks import Comparison, compare_rows, row_key
from shardex.errors import ErrorCode, ShardexError
from shardex.index.oracle import expected_entries
from shardex.meta.index_state import find_index
from shardex.pipeline.indexers import index_state
from shardex.pipeline.source.plan import plan_ranges
from shardex.pipeline.source.read import read_ranges

KEYSPACE: Final = "users"
PRIMARY: Final = "#primary"
SCAN_TIMEOUT: Final = 300.0


def documents_at(client: Client, keyspace: str, ts: Timestamp) -> dict[str, Any]:
    """Every live document as of ``ts``, from the partitions' snapshot reads (the last
    version of each docid with seqno <= ts), independent of any index."""
    out: dict[str, Any] = {}
    for batch in read_ranges(
        client, keyspace, plan_ranges(keyspace, Timestamp({}), ts), snapshot=True
    ):
        cols = (batch["docid"].to_pylist(), batch["deleted"].to_pylist(), batch["body"].to_pylist())
        for docid, deleted, body in zip(*cols, strict=True):
            if deleted:
                out.pop(docid, None)
            else:
                out[docid] = json.loads(body)
    return out


def expected_index_rows(client: Client, index: str, docs: dict[str, Any]) -> list[Any]:
    rec = find_index(index_state(client).indexes, KEYSPACE, index)
    if rec is None:
        raise ShardexError(
            f"index {index!r} not found on {KEYSPACE!r}",
            code=ErrorCode.INDEX_NOT_FOUND,
            details={"index": index, "hint": "shardex index list users --dir DIR"},
        )
    desc = rec.definition.desc if any(rec.definition.desc) else None
    rows = []
    for _, entry in expected_entries(rec.definition, docs):
        key, docid = decode_entry(entry, desc)
        rows.append(row_key({"docid": docid, "key": key}))
    return rows


class Moves:
    """Partition moves the running rebalance has completed, as seen by polling its status."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.id: str | None = None
        self.done: set[tuple[str, str, int]] = set()
        last = client.rebalance_status()  # before ours starts: an older one is not ours
        self.older = None if last is None else last.id

    def poll(self) -> set[tuple[str, str, int]]:
        status = self.client.rebalance_status()
        if status is not None and status.kind == "rebalance" and status.id != self.older:
            if self.id is None:
                self.id = status.id
            if status.id == self.id:
                self.done = {(m.keyspace, m.index, m.partition) for m in status.moved}
        return set(self.done)


@dataclass
class PagedScan:
    index: str
    pages: int
    rows: list[Any]
    moved: set[tuple[str, str, int]]  # moves completed while this scan ran
    comparison: Comparison


def paged_scan(
    client: Client, index: str, page_size: int, expected: list[Any], moves: Moves
) -> PagedScan:
    primary = index == PRIMARY
    before = moves.poll()
    rows: list[Any] = []
    pages = 0
    cont: str | None = None
    while True:
        page = client.scan_page(
            KEYSPACE,
            index,
            consistency="not_bounded",  # the tips: the index caught up before the step began
            page_size=page_size,
            continuation=cont,
            timeout=SCAN_TIMEOUT,
        )
        pages += 1
        rows.extend(r["docid"] if primary else row_key(r) for r in page.rows)
        cont = page.continuation
        if cont is None:
            break
    moved = moves.poll() - before
    return PagedScan(index, pages, rows, moved, compare_rows(rows, expected))


def describe_moves(moved: set[tuple[str, str, int]]) -> str:
    data = sum(1 for _, ix, _ in moved if not ix)
    return f"{len(moved)} partitions moved meanwhile ({data} data, {len(moved) - data} index)"


def start_rebalance(cluster_dir: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "shardex.cli.main", "rebalance", "--dir", cluster_dir, "--json"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Ticker(threading.Thread):
    """Rewrites one document that no index covers (no ``address``, no ``age``) a few times a
    second. The pipeline runs a stabilise round only when a micro-batch has changes, and an
    index move waits for such a round to route the moving slice to its new node; on an idle
    keyspace it would time out. The ticker's docid exists before the expected rows are taken
    and it never has a by_city or by_status entry, so the expected rows stay fixed."""

    DOCID: Final = "demo-ticker"

    def __init__(self, client: Client, interval: float = 0.2) -> None:
        super().__init__(name="demo-ticker", daemon=True)
        self.users = client.keyspace(KEYSPACE)
        self.interval = interval
        self.stop = threading.Event()
        self.ticks = 0
        self.error: BaseException | None = None

    def tick(self) -> None:
        self.users.upsert(self.DOCID, {"ticker": self.ticks})
        self.ticks += 1

    def run(self) -> None:
        try:
            while not self.stop.wait(self.interval):
                self.tick()
        except BaseException as exc:  # reported by the main thread
            self.error = exc


class KindScanner(threading.Thread):
    """Paginated scans of one index (or ``#primary``) back to back on a connection of its own,
    until a scan starts after the rebalance ended. Prints the scans during which moves
    completed, and any that is not exact or ends with an error; counts the others."""

    def __init__(
        self,
        cluster_dir: str,
        index: str,
        page_size: int,
        expected: list[Any],
        over: threading.Event,
        out: threading.Lock,
    ) -> None:
        super().__init__(name=f"demo-scan-{index}", daemon=True)
        self.client = connect_local(cluster_dir, name=f"demo-scan-{index}")
        self.moves = Moves(self.client)  # before the rebalance starts: an older one is not ours
        self.index, self.page_size, self.expected = index, page_size, expected
        self.over, self.out = over, out
        self.scans = self.quiet = self.quiet_pages = self.failed = 0
        self.moved: set[tuple[str, str, int]] = set()
        self.error: BaseException | None = None

    def say(self, *lines: str) -> None:
        with self.out:
            for line in lines:
                print(line, flush=True)

    def run(self) -> None:
        try:
            while True:
                last = self.over.is_set()
                self.scan_once()
                if last:
                    return
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            self.client.close()

    def scan_once(self) -> None:
        self.scans += 1
        t0 = time.monotonic()
        try:
            s = paged_scan(self.client, self.index, self.page_size, self.expected, self.moves)
        except ShardexError as e:
            # A clear error, never wrong rows: the demo reports it and fails at the end.
            self.failed += 1
            self.say(f"  {self.index} scan {self.scans} ended with {e.code.value}: {e.message}")
            return
        self.moved |= s.moved
        if not s.comparison.equal:
            self.failed += 1
        if not s.moved and s.comparison.equal:
            self.quiet += 1
            self.quiet_pages += s.pages
            return
        self.say(
            f"  {self.index} scan {self.scans}: {s.pages} pages, {len(s.rows):,} rows, "
            f"{describe_moves(s.moved)} [{time.monotonic() - t0:.1f} s]",
            f"      {s.comparison.describe()}",
        )

    def summary(self) -> str:
        text = f"  {self.index}: {self.scans} scans, {self.failed} not exact or failed"
        if self.quiet:
            text += (
                f"; {self.quiet} of them ({self.quiet_pages:,} pages) with no move completing "
                "meanwhile, each with rows read == rows expected: True"
            )
        return text


def run(cluster_dir: str, index: str, page_size: int) -> bool:
    with (
        connect_local(cluster_dir, name="demo-elastic") as client,
        connect_local(cluster_dir, name="demo-ticker") as tclient,
    ):
        ticker = Ticker(tclient)
        ticker.tick()  # the ticker document exists before the expected rows are taken
        ts = client.high_seqnos(KEYSPACE)
        docs = documents_at(client, KEYSPACE, ts)
        # One request_plus scan: returns once the index's stability TS covers ``ts``, so its
        # entries (its tips) are the expected rows from here on.
        list(
            client.scan(KEYSPACE, index, consistency="request_plus", limit=1, timeout=SCAN_TIMEOUT)
        )
        expected = {PRIMARY: sorted(docs), index: expected_index_rows(client, index, docs)}
        print(
            f"expected rows, from the documents as of the high seqnos ({len(docs):,} documents "
            f"read from the partitions' change logs, not through an index): {len(docs):,} "
            f"docids for {PRIMARY}, {len(expected[index]):,} entries for {index}"
        )
        print(
            f"no writes change them during this step: only {Ticker.DOCID} (no address, no age: "
            "in no index) is rewritten so the pipeline keeps running stabilise rounds, which "
            f"index moves wait for; a request_plus scan waited until {index} covered the "
            "documents read, so the pages read the tips (not_bounded) and must match exactly"
        )
        print(
            f"starting `shardex rebalance`; meanwhile paginated scans of {index} and of "
            f"{PRIMARY} (at most {page_size} rows a page) run back to back, side by side:"
        )
        over, out = threading.Event(), threading.Lock()
        scanners = [
            KindScanner(cluster_dir, name, page_size, expected[name], over, out)
            for name in (index, PRIMARY)
        ]
        ticker.start()
        t0 = time.monotonic()
        proc = start_rebalance(cluster_dir)
        for s in scanners:
            s.start()
        try:
            stdout, stderr = proc.communicate()  # the rebalance's end (and its JSON result)
            with out:
                print(
                    f"rebalance ended after {time.monotonic() - t0:.1f} s (exit {proc.returncode})"
                )
        finally:
            over.set()
            for s in scanners:
                s.join()
            ticker.stop.set()
            ticker.join()
        for s in scanners:
            if s.error is not None:
                raise s.error
            print(s.summary())
        if ticker.error is not None:
            raise ticker.error
        try:
            result = json.loads(stdout)
        except ValueError:
            print(f"  shardex rebalance printed no result: {stderr.strip()[-400:]}")
            return False
        summarise(result)
        ok = proc.returncode == 0 and not any(s.failed for s in scanners)
    print(f"every paginated scan read exactly the expected rows, and the rebalance completed: {ok}")
    return ok


def summarise(result: dict[str, Any]) -> None:
    moves = result.get("moves", [])
    done = [m for m in moves if m["status"] == "done"]
    data = [m for m in done if not m.get("index")]
    ix = [m for m in done if m.get("index")]
    targets = sorted({m["target"] for m in done})
    print(
        f"  rebalance {result.get('state')}: {len(data)} data and {len(ix)} index partitions "
        f"moved (of {len(moves)} planned), to {', '.join(targets) or 'nowhere'}"
    )
    for m in ix:
        print(f"    {m['keyspace']}.{m['index']}/{m['partition']}: {m['source']} -> {m['target']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cluster_dir")
    ap.add_argument("--index", default="by_city")
    ap.add_argument("--page-size", type=int, default=100)
    args = ap.parse_args(argv)
    return 0 if run(args.cluster_dir, args.index, args.page_size) else 1


if __name__ == "__main__":
    raise SystemExit(main())
