"""The benchmarks' documents and how they get into a cluster.

* The data service benchmark's documents (``bench.data_service``): the demo's users with
  benchmark extras, ~500 B - 1 KB each, deterministic for a seed; and their size figures.
* The index benchmarks' documents (``bench.pipeline``, ``bench.scan``, ``bench.sql``): the
  demo's users (``shardex.demo.datagen``) in keyspace ``KEYSPACE``, written as JSON Lines and
  loaded with ``shardex load``, the two indexes (``INDEXES``, with their PostgreSQL twins) and
  update documents that change every indexed field.

Nothing here imports PySpark at module level: the writer processes of ``bench.pipeline``
import this module too.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from bench.common.local_cluster import shardex_cli

Doc = dict[str, Any]
Item = tuple[str, Doc]

_STREETS = ("Main", "Oak", "Pine", "Maple", "Cedar", "Elm", "Lake", "Hill", "Park", "River")
_WORD_TEXT = (
    "data store index query shard node partition replica stream change seqno durable batch "
    "latency throughput cluster topology migrate rebalance json document key value range "
    "scan filter sort join group aggregate window cursor snapshot commit log flush sync"
)
_WORDS = _WORD_TEXT.split()
_ORDER_STATUS = ("paid", "shipped", "delivered", "returned")


def _extras(rng: random.Random, i: int, orders: int) -> Doc:
    """What the benchmark adds to a demo user to reach ~500 B - 1 KB: a street and geo point
    in the address, preferences, the last few orders (nested objects in an array), a bio."""
    return {
        "street": f"{rng.randint(1, 999)} {rng.choice(_STREETS)} Street",
        "geo": {"lat": round(rng.uniform(-60, 70), 5), "lon": round(rng.uniform(-180, 180), 5)},
        "preferences": {
            "newsletter": rng.random() < 0.4,
            "language": rng.choice(("en", "de", "fr", "pt", "ja", "es")),
            "theme": rng.choice(("light", "dark", "system")),
        },
        "recent_orders": [
            {
                "order_id": f"o{i}-{k}",
                "total": round(rng.uniform(5, 500), 2),
                "items": rng.randint(1, 9),
                "status": rng.choice(_ORDER_STATUS),
            }
            for k in range(min(orders, 3))
        ],
        "bio": " ".join(rng.choices(_WORDS, k=rng.randint(15, 45))),
    }


def make_docs(n: int, seed: int) -> tuple[list[Item], str]:
    """``n`` documents (docid, doc) and a description of where they come from: the demo's
    users (``shardex.demo.datagen``, the same documents the demo loads) with benchmark
    extras from a second seeded stream, so they weigh ~500 B - 1 KB. Deterministic."""
    from shardex.demo.datagen import users

    rng = random.Random(seed + 1)
    out: list[Item] = []
    for i, user in enumerate(users(n, seed)):
        extra = _extras(rng, i, int(user.get("orders", 0)))
        doc: Doc = dict(user)
        doc["address"] = {**user["address"], "street": extra.pop("street"), "geo": extra.pop("geo")}
        doc.update(extra)
        out.append((str(user["id"]), doc))
    return out, "shardex.demo.datagen users + bench extras (street, geo, preferences, orders, bio)"


def doc_sizes(items: Sequence[Item]) -> dict[str, float]:
    sizes = sorted(len(msgspec.json.encode(d)) for _, d in items)
    return {
        "min_bytes": sizes[0],
        "median_bytes": sizes[len(sizes) // 2],
        "max_bytes": sizes[-1],
        "mean_bytes": round(sum(sizes) / len(sizes), 1),
    }


KEYSPACE = "people"


SEED = 20240601


# The two indexes: (name, keys, where, partition_by, num_partition) and their PostgreSQL twin
# (expression index on the jsonb column, the same WHERE as a partial index).
INDEXES: list[dict[str, Any]] = [
    {
        "name": "by_city_age",
        "keys": ["address.city", "age"],
        "where": None,
        "partition_by": ["META().id"],
        "num_partition": 4,
        "pg": "CREATE INDEX pg_city_age ON docs ((body->'address'->'city'), (body->'age'))",
    },
    {
        "name": "by_email",
        "keys": ["email"],
        "where": "status = 'active'",
        "partition_by": None,
        "num_partition": None,
        "pg": "CREATE INDEX pg_email ON docs ((body->'email')) WHERE body->>'status' = 'active'",
    },
]

INDEX_NAMES = [i["name"] for i in INDEXES]


def updates(n: int, total_docs: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """``n`` updates of existing documents (``user-<k>``, k < total_docs): a fresh demo user
    each, so city, age, email and status (every indexed field) change. Distinct docids while
    ``n <= total_docs``."""
    from shardex.demo.datagen import user

    rng = random.Random(seed)
    gen = random.Random(seed + 7)
    if n <= total_docs:
        picks: Sequence[int] = rng.sample(range(total_docs), n)
    else:
        picks = [rng.randrange(total_docs) for _ in range(n)]
    enc = msgspec.json.Encoder()
    for i, k in enumerate(picks):
        doc = user(gen, i)
        doc["id"] = f"user-{k:07d}"
        yield doc["id"], enc.encode(doc)


def write_jsonl(paths: Sequence[Path], docs: Iterable[Doc]) -> int:
    """``docs`` as JSON Lines into ``paths`` (chunks of 5000 round-robin); the bytes written."""
    enc = msgspec.json.Encoder()
    size = 0
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(p.open("wb")) for p in paths]
        buf: list[bytes] = []
        k = 0
        for doc in docs:
            buf.append(enc.encode(doc))
            if len(buf) == 5000:
                chunk = b"\n".join(buf) + b"\n"
                files[k % len(files)].write(chunk)
                size += len(chunk)
                k += 1
                buf.clear()
        if buf:
            chunk = b"\n".join(buf) + b"\n"
            files[k % len(files)].write(chunk)
            size += len(chunk)
    return size


def write_docs(work: Path, n: int, seed: int, parts: int) -> tuple[list[Path], int]:
    """``n`` demo users as JSON Lines in ``parts`` files (chunks of 5000 round-robin)."""
    from shardex.demo.datagen import users

    paths = [work / f"docs-{k}.jsonl" for k in range(parts)]
    return paths, write_jsonl(paths, users(n, seed))


def copy_files(conn: Any, files: Sequence[Path], table: str = "docs") -> None:
    # COPY text format: a JSON line has no raw tab or newline; only backslashes need escaping.
    with conn.cursor() as cur, cur.copy(f"COPY {table} (body) FROM STDIN") as copy:
        for path in files:
            with path.open("rb") as fh:
                while block := fh.read(1 << 22):
                    while not block.endswith(b"\n"):
                        more = fh.read(1 << 16)
                        if not more:
                            break
                        block += more
                    copy.write(block.replace(b"\\", b"\\\\"))


PROGRESS_EVERY = 15.0  # seconds between progress lines of a long load


def shardex_load(
    cluster_dir: Path,
    files: Sequence[Path],
    work: Path,
    *,
    timeout: float | None = None,
    progress: Callable[[], str] | None = None,
    keyspace: str = KEYSPACE,
) -> float:
    """``shardex load`` of every file into ``keyspace``, one process each, in parallel;
    returns seconds.
    Every ``PROGRESS_EVERY`` s a line with the time so far and ``progress()`` (say, the
    documents the cluster holds); past ``timeout`` s the loaders are killed and a
    ``RuntimeError`` says how far they got."""
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    t = time.perf_counter()
    try:
        for k, path in enumerate(files):
            out = work / f"load-{keyspace}-{k}.log"
            cmd = [*shardex_cli(), "load", keyspace, str(path), "--dir", str(cluster_dir)]
            cmd += ["--id-field", "id", "--batch", "1000"]
            with out.open("wb") as fh:
                procs.append((subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT), out))
        next_report = t + PROGRESS_EVERY
        while any(proc.poll() is None for proc, _ in procs):
            now = time.perf_counter()
            if timeout is not None and now - t > timeout:
                done = progress() if progress is not None else ""
                raise RuntimeError(f"shardex load still running after {timeout:.0f} s ({done})")
            if now >= next_report:
                done = f": {progress()}" if progress is not None else ""
                print(f"[bench] loading, {now - t:.0f} s{done}", file=sys.stderr, flush=True)
                next_report = now + PROGRESS_EVERY
            time.sleep(0.2)
        for proc, out in procs:
            if proc.returncode != 0:
                raise RuntimeError(f"shardex load failed:\n{out.read_text()[-2000:]}")
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return time.perf_counter() - t


def create_indexes(client: Any) -> None:
    for i in INDEXES:
        client.create_index(
            KEYSPACE,
            i["name"],
            i["keys"],
            where=i["where"],
            partition_by=i["partition_by"],
            num_partition=i["num_partition"],
            defer_build=True,
        )
