"""The documents of ``bench.sql_breadth``: customers and their orders, deterministic for a
seed, and the counts the queries' parameters and expected answers come from. Pure logic
(no cluster, no server): unit-tested in ``tests/bench/test_bench_sql_breadth.py``.

* ``customers``: ``c0000042`` -> ``{"id", "name", "region", "order_ids"}``; a region holds
  about ``CUSTOMERS_PER_REGION`` customers (so "the customers of one region" is a selective
  filter at any scale); ``order_ids`` lists the customer's orders (the keys a correlated
  subquery reads with USE KEYS, as a document model that keeps them does).
* ``orders``: ``o00000042`` -> ``{"id", "customer_id", "status", "date", "lines", "total"}``:
  a uniformly drawn customer, one of ``STATUSES``, an ISO date in ``YEARS``, 1 to
  ``MAX_LINES`` lines ``{sku, qty, price}`` (a price in cents: sums stay integers in both
  systems), ``total`` = sum of qty x price. About ``LINES_PER_SKU`` lines per SKU at any scale.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common.dataset import write_jsonl

CUSTOMERS, ORDERS = "customers", "orders"
STATUSES = ("new", "paid", "shipped", "delivered", "returned")
FIRST_DAY = dt.date(2024, 1, 1)
DAYS = 731  # 2024 and 2025
MAX_LINES = 5
CUSTOMERS_PER_REGION = 50
LINES_PER_SKU = 300

Doc = dict[str, Any]


def customer_id(k: int) -> str:
    return f"c{k:07d}"


def order_id(i: int) -> str:
    return f"o{i:08d}"


def regions(n_customers: int) -> int:
    return max(1, n_customers // CUSTOMERS_PER_REGION)


def skus(n_orders: int) -> int:
    """SKUs for ``n_orders``: about ``LINES_PER_SKU`` lines each (3 lines per order on
    average)."""
    return max(10, n_orders * (MAX_LINES + 1) // 2 // LINES_PER_SKU)


def make_orders(n_orders: int, n_customers: int, seed: int) -> Iterator[Doc]:
    rng = random.Random(seed)
    n_skus = skus(n_orders)
    for i in range(n_orders):
        lines = [
            {
                "sku": f"s{rng.randrange(n_skus):06d}",
                "qty": rng.randint(1, 5),
                "price": rng.randint(100, 10_000),
            }
            for _ in range(rng.randint(1, MAX_LINES))
        ]
        yield {
            "id": order_id(i),
            "customer_id": customer_id(rng.randrange(n_customers)),
            "status": rng.choice(STATUSES),
            "date": (FIRST_DAY + dt.timedelta(days=rng.randrange(DAYS))).isoformat(),
            "lines": lines,
            "total": sum(line["qty"] * line["price"] for line in lines),
        }


def make_customers(n_customers: int, orders_of: dict[str, list[str]], seed: int) -> Iterator[Doc]:
    rng = random.Random(seed + 1)
    n_regions = regions(n_customers)
    for k in range(n_customers):
        cid = customer_id(k)
        yield {
            "id": cid,
            "name": f"customer {k}",
            "region": f"r{rng.randrange(n_regions):05d}",
            "order_ids": orders_of.get(cid, []),
        }


@dataclass
class Stats:
    """What the parameters and the expected row counts need from the documents."""

    region_of: dict[str, str] = field(default_factory=dict)  # customer -> region
    orders_of: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    status_of: dict[str, str] = field(default_factory=dict)  # order -> status
    # (status, date) -> orders
    status_date: Counter[tuple[str, str]] = field(default_factory=Counter)
    # (status, date, customer) -> orders: the hash join's groups
    status_date_customer: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    sku_lines: Counter[str] = field(default_factory=Counter)
    sku_orders: Counter[str] = field(default_factory=Counter)

    def add_order(self, o: Doc) -> None:
        self.orders_of[o["customer_id"]].append(o["id"])
        self.status_of[o["id"]] = o["status"]
        self.status_date[(o["status"], o["date"])] += 1
        self.status_date_customer[(o["status"], o["date"], o["customer_id"])] += 1
        for line in o["lines"]:
            self.sku_lines[line["sku"]] += 1
        for sku in {line["sku"] for line in o["lines"]}:
            self.sku_orders[sku] += 1

    def add_customer(self, c: Doc) -> None:
        self.region_of[c["id"]] = c["region"]

    def customers_in(self, region: str) -> list[str]:
        return sorted(c for c, r in self.region_of.items() if r == region)

    def region_orders(self, region: str) -> int:
        return sum(len(self.orders_of.get(c, [])) for c in self.customers_in(region))

    def orders_between(self, status: str, lo: str, hi: str) -> int:
        return sum(n for (s, d), n in self.status_date.items() if s == status and lo <= d <= hi)

    def regions_with_orders(self, status: str, since: str) -> int:
        """The hash join's groups: regions with an order of ``status`` on or after
        ``since``."""
        return len(
            {
                self.region_of[c]
                for (s, d, c) in self.status_date_customer
                if s == status and d >= since and c in self.region_of
            }
        )


def generate(
    work: Path | None, n_orders: int, n_customers: int, seed: int, parts: int
) -> tuple[Stats, dict[str, list[Path]], dict[str, int]]:
    """Both keyspaces' documents (as JSONL files under ``work`` in ``parts`` files each,
    unless ``work`` is None) and their ``Stats``: keyspace -> files, keyspace -> bytes."""
    stats = Stats()

    def orders() -> Iterator[Doc]:
        for o in make_orders(n_orders, n_customers, seed):
            stats.add_order(o)
            yield o

    def customers() -> Iterator[Doc]:
        for c in make_customers(n_customers, stats.orders_of, seed):
            stats.add_customer(c)
            yield c

    files: dict[str, list[Path]] = {}
    sizes: dict[str, int] = {}
    for name, docs in ((ORDERS, orders), (CUSTOMERS, customers)):  # orders first: order_ids
        if work is None:
            for _ in docs():
                pass
            files[name], sizes[name] = [], 0
            continue
        files[name] = [work / f"{name}-{k}.jsonl" for k in range(parts)]
        sizes[name] = write_jsonl(files[name], docs())
    return stats, files, sizes
