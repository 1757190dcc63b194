"""A deterministic generator of realistic user documents (for the demo, tests, benchmarks).

Every document has the shapes an index and a SQL test want: nested objects
(``address.city``), arrays (``tags``), strings, integers, floats, booleans, dates as ISO
strings, and skewed value distributions (a few big cities, most users active, order counts
with a long tail). The same ``(seed, index)`` always gives the same document, whatever ``n``
is: documents come from one ``random.Random(seed)`` stream in order, so the first k documents
of a 100k set equal a k-document set.

    python -m shardex.demo.datagen users.jsonl --docs 100000 --seed 42
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

DEFAULT_DOCS = 100_000
DEFAULT_SEED = 42

FIRST = [
    "Ada",
    "Alan",
    "Amara",
    "Ana",
    "Ava",
    "Ben",
    "Carlos",
    "Chen",
    "Chloe",
    "Dara",
    "Diego",
    "Elena",
    "Emma",
    "Eva",
    "Farah",
    "Felix",
    "Grace",
    "Hana",
    "Hugo",
    "Ines",
    "Ivan",
    "Jamal",
    "Jin",
    "Julia",
    "Kai",
    "Kenji",
    "Lara",
    "Leo",
    "Lina",
    "Luca",
    "Maya",
    "Mei",
    "Mia",
    "Nadia",
    "Noah",
    "Nora",
    "Omar",
    "Oscar",
    "Priya",
    "Rafael",
    "Rosa",
    "Sami",
    "Sara",
    "Sofia",
    "Tariq",
    "Theo",
    "Uma",
    "Vera",
    "Wei",
    "Yara",
    "Yusuf",
    "Zoe",
]
LAST = [
    "Abe",
    "Alvarez",
    "Andersen",
    "Bauer",
    "Becker",
    "Chen",
    "Costa",
    "Diaz",
    "Dubois",
    "Evans",
    "Fischer",
    "Garcia",
    "Gupta",
    "Haddad",
    "Hansen",
    "Ito",
    "Jensen",
    "Kim",
    "Kowalski",
    "Kumar",
    "Larsen",
    "Lee",
    "Lopez",
    "Martin",
    "Meyer",
    "Moreau",
    "Nakamura",
    "Nguyen",
    "Novak",
    "Okafor",
    "Olsen",
    "Patel",
    "Perez",
    "Rossi",
    "Santos",
    "Schmidt",
    "Silva",
    "Smith",
    "Suzuki",
    "Tanaka",
    "Wagner",
    "Wang",
    "Weber",
    "Wilson",
    "Yamamoto",
    "Zhang",
]
# (city, country, zip format, weight): weights make a few cities dominate, as real data does.
CITIES = (
    ("London", "GB", "@@# #@@", 9),
    ("Paris", "FR", "75###", 8),
    ("Berlin", "DE", "1####", 7),
    ("New York", "US", "1####", 10),
    ("San Francisco", "US", "94###", 5),
    ("Tokyo", "JP", "1##-####", 8),
    ("Sao Paulo", "BR", "0####-###", 6),
    ("Lagos", "NG", "1#####", 4),
    ("Mumbai", "IN", "4#####", 7),
    ("Sydney", "AU", "2###", 3),
    ("Toronto", "CA", "M#@ #@#", 3),
    ("Madrid", "ES", "28###", 3),
    ("Copenhagen", "DK", "1###", 1),
    ("Lyon", "FR", "69###", 2),
    ("Osaka", "JP", "5##-####", 2),
    ("Austin", "US", "78###", 2),
)
DOMAINS = ("example.com", "mail.test", "inbox.example", "post.test")
TAGS = [
    "newsletter",
    "beta",
    "vip",
    "early-adopter",
    "mobile",
    "desktop",
    "referral",
    "student",
    "business",
    "gamer",
    "traveler",
    "photographer",
    "developer",
    "designer",
]
STATUSES = (("active", 70), ("inactive", 18), ("suspended", 4), ("pending", 8))
PLANS = (("free", 60), ("plus", 30), ("pro", 10))
SIGNUP_START = dt.date(2015, 1, 1)
SIGNUP_DAYS = (dt.date(2025, 6, 30) - SIGNUP_START).days
LETTERS = "ABCDEFGHJKLMNPRSTUVWXYZ"


def _weighted(rng: random.Random, table: tuple[tuple[Any, ...], ...]) -> tuple[Any, ...]:
    total = sum(row[-1] for row in table)
    x = rng.random() * total
    for row in table:
        x -= row[-1]
        if x < 0:
            return row
    return table[-1]


def _zip(rng: random.Random, fmt: str) -> str:
    return "".join(
        str(rng.randrange(10)) if c == "#" else rng.choice(LETTERS) if c == "@" else c for c in fmt
    )


def user(rng: random.Random, i: int) -> dict[str, Any]:
    """The ``i``-th user (``rng`` must have produced users 0..i-1 before, for determinism)."""
    first, last = rng.choice(FIRST), rng.choice(LAST)
    city, country, zip_fmt, _ = _weighted(rng, CITIES)
    signup = SIGNUP_START + dt.timedelta(days=rng.randrange(SIGNUP_DAYS))
    orders = int(rng.expovariate(1 / 6)) if rng.random() < 0.85 else 0
    return {
        "id": f"user-{i:07d}",
        "name": f"{first} {last}",
        "email": f"{first}.{last}{i % 1000}@{rng.choice(DOMAINS)}".lower(),
        "age": max(16, min(95, int(rng.gauss(38, 13)))),
        "address": {"city": city, "country": country, "zip": _zip(rng, zip_fmt)},
        "signup_date": signup.isoformat(),
        "tags": sorted(rng.sample(TAGS, rng.choice((0, 1, 1, 2, 2, 3, 4)))),
        "orders": orders,
        "lifetime_value": round(orders * rng.uniform(8, 120), 2),
        "status": _weighted(rng, STATUSES)[0],
        "plan": _weighted(rng, PLANS)[0],
        "verified": rng.random() < 0.8,
    }


def users(n: int = DEFAULT_DOCS, seed: int = DEFAULT_SEED) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    for i in range(n):
        yield user(rng, i)


def write_jsonl(path: Path, n: int = DEFAULT_DOCS, seed: int = DEFAULT_SEED) -> int:
    """Write ``n`` users as JSON Lines; returns the bytes written."""
    enc = msgspec.json.Encoder()
    size = 0
    with Path(path).open("wb") as fh:
        buf: list[bytes] = []
        for doc in users(n, seed):
            buf.append(enc.encode(doc))
            if len(buf) >= 5000:
                chunk = b"\n".join(buf) + b"\n"
                fh.write(chunk)
                size += len(chunk)
                buf.clear()
        if buf:
            chunk = b"\n".join(buf) + b"\n"
            fh.write(chunk)
            size += len(chunk)
    return size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write a deterministic users data set (JSONL).")
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=int, default=DEFAULT_DOCS)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = ap.parse_args(argv)
    size = write_jsonl(args.out, args.docs, args.seed)
    print(f"wrote {args.docs:,} users ({size / 1e6:.1f} MB) to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
