"""Demo step: write while scanning, and show that request_plus scans see every acknowledged write.

A background writer moves existing users to a city the generated data never uses (and inserts
new users there), one write per document, while the main thread runs request_plus scans of
``by_city`` over just that city. Before each scan it notes which writes were acknowledged (the
scan must return each with exactly the key written) and which were only issued (allowed, not
required); after the writer stops, one more request_plus scan must see all of them, and an
at_plus scan with one write's returned timestamp must see that write.

    python -m shardex.demo.scans DIR [--docs N] [--scans 5]
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from shardex.client import Client, MutationResult, connect_local
from shardex.demo.checks import Visibility, check_visibility
from shardex.demo.datagen import user

KEYSPACE: Final = "users"
INDEX: Final = "by_city"
CITY: Final = "Reykjavik"  # not in datagen.CITIES: only the writer's users live there
SPAN: Final = [{"low": [CITY], "high": [CITY], "inclusion": "both"}]
SCAN_TIMEOUT: Final = 300.0  # a loaded 2-core machine: the pipeline may be seconds behind


@dataclass(frozen=True)
class Written:
    docid: str
    key: list[Any]  # the by_city key the write gives the document: [city, age]
    result: MutationResult


class Writer(threading.Thread):
    """Updates (with CAS) and inserts users in ``CITY`` until stopped; every document is
    written at most once, so "the scan sees the write" is exact: the row has its key."""

    def __init__(self, client: Client, docs: int, seed: int, pause: float) -> None:
        super().__init__(name="demo-writer", daemon=True)
        self.client = client
        self.users = client.keyspace(KEYSPACE)
        self.rng = random.Random(seed)
        self.order = self.rng.sample(range(docs), min(docs, 100_000))
        self.pause = pause
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.issued: set[str] = set()
        self.acked: list[Written] = []
        self.error: BaseException | None = None
        self.progress = threading.Condition(self.lock)

    def wait_acked(self, n: int) -> None:
        """Until ``n`` writes are acknowledged (or the writer ended): the first scan then
        has writes to check."""
        with self.progress:
            self.progress.wait_for(lambda: len(self.acked) >= n or not self.is_alive())

    def snapshot(self) -> tuple[dict[str, Any], set[str]]:
        """(acknowledged writes: docid -> key, docids issued so far)."""
        with self.lock:
            return {w.docid: w.key for w in self.acked}, set(self.issued)

    def run(self) -> None:
        try:
            n = 0
            while not self.stop.is_set() and n < len(self.order):
                self._write(n)
                n += 1
                time.sleep(self.pause)
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            with self.progress:
                self.progress.notify_all()

    def _write(self, n: int) -> None:
        age = self.rng.randrange(18, 90)
        if n % 3 == 2:  # every third write is an insert of a new user
            doc = user(self.rng, n)
            docid = f"user-new-{n:06d}"
            doc.update(id=docid, age=age)
            doc["address"] = {**doc["address"], "city": CITY, "country": "IS"}
            with self.lock:
                self.issued.add(docid)
            result = self.users.upsert(docid, doc)
        else:
            docid = f"user-{self.order[n]:07d}"
            with self.lock:
                self.issued.add(docid)
            v = self.users.get_versioned(docid)
            doc = {**v.doc, "age": age, "address": {**v.doc["address"], "city": CITY}}
            result = self.users.replace(docid, doc, cas=v.cas)
        with self.progress:
            self.acked.append(Written(docid, [CITY, age], result))
            self.progress.notify_all()


def scan_city(client: Client, consistency: str, at: Any = None) -> list[dict[str, Any]]:
    return list(
        client.scan(
            KEYSPACE, INDEX, spans=SPAN, consistency=consistency, at=at, timeout=SCAN_TIMEOUT
        )
    )


def report(label: str, v: Visibility, seconds: float) -> None:
    extra = f" (+{v.in_flight_seen} written while it ran, also seen)" if v.in_flight_seen else ""
    print(
        f"  {label}: {v.must_see} writes acknowledged before it, {v.seen} visible{extra}, "
        f"every acknowledged write visible: {v.ok}  [{seconds * 1000:.0f} ms]"
    )
    for name in ("missing", "wrong_key", "unexpected", "doubled"):
        items = getattr(v, name)
        if items:
            print(f"    {len(items)} {name}: {items[:5]}")


def run(cluster_dir: str, docs: int, scans: int, seed: int, pause: float) -> bool:
    ok = True
    with (
        connect_local(cluster_dir, name="demo-scanner") as client,
        connect_local(cluster_dir, name="demo-writer") as wclient,
    ):
        writer = Writer(wclient, docs, seed, pause)
        print(
            f"a writer moves users to {CITY} (updates with CAS, and inserts), one write per "
            f"document; meanwhile request_plus scans of {INDEX} over {CITY}:"
        )
        writer.start()
        writer.wait_acked(10)
        try:
            for i in range(1, scans + 1):
                must_see, _ = writer.snapshot()
                t0 = time.monotonic()
                rows = scan_city(client, "request_plus")
                elapsed = time.monotonic() - t0
                _, issued = writer.snapshot()
                v = check_visibility(rows, must_see, issued)
                report(f"scan {i} (while writing)", v, elapsed)
                ok = ok and v.ok
        finally:
            writer.stop.set()
            writer.join()
        if writer.error is not None:
            raise writer.error
        must_see, issued = writer.snapshot()
        t0 = time.monotonic()
        v = check_visibility(scan_city(client, "request_plus"), must_see, issued)
        report(
            f"final scan (writer stopped after {len(must_see)} writes)", v, time.monotonic() - t0
        )
        ok = ok and v.ok and v.seen == len(must_see)

        # at_plus: the timestamp is the write's own result (its partition's seqno and uuid).
        docid = f"user-{writer.order[-1]:07d}"
        users = client.keyspace(KEYSPACE)
        cur = users.get_versioned(docid)
        age = 77
        result = users.replace(
            docid,
            {**cur.doc, "age": age, "address": {**cur.doc["address"], "city": CITY}},
            cas=cur.cas,
        )
        t0 = time.monotonic()
        rows = scan_city(client, "at_plus", at=[result])
        seen = [r["key"] for r in rows if r["docid"] == docid]
        hit = seen == [[CITY, age]]
        print(
            f"  at_plus scan with the timestamp of one write (partition {result.partition}, "
            f"seqno {result.seqno}): {docid} seen with key {seen[0] if seen else None}: {hit}  "
            f"[{(time.monotonic() - t0) * 1000:.0f} ms]"
        )
        ok = ok and hit
    print(f"every acknowledged write was visible to the scans that followed it: {ok}")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cluster_dir")
    ap.add_argument("--docs", type=int, default=100_000, help="users loaded (user-0000000..)")
    ap.add_argument("--scans", type=int, default=5, help="request_plus scans while writing")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pause", type=float, default=0.01, help="seconds between writes")
    args = ap.parse_args(argv)
    return 0 if run(args.cluster_dir, args.docs, args.scans, args.seed, args.pause) else 1


if __name__ == "__main__":
    raise SystemExit(main())
