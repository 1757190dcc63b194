"""The demo data set: deterministic per seed, prefix-stable, realistic shapes."""

from __future__ import annotations

import collections
from pathlib import Path

import msgspec

from shardex.demo.datagen import users, write_jsonl


def test_same_seed_same_documents_and_prefix_stable() -> None:
    a = list(users(300, seed=7))
    assert a == list(users(300, seed=7))
    assert list(users(50, seed=7)) == a[:50]  # the first k of a bigger set are the k-set
    assert a != list(users(300, seed=8))


def test_document_shapes() -> None:
    docs = list(users(2000, seed=1))
    assert [d["id"] for d in docs[:3]] == ["user-0000000", "user-0000001", "user-0000002"]
    assert len({d["id"] for d in docs}) == 2000
    for d in docs:
        assert set(d) == {
            "id", "name", "email", "age", "address", "signup_date", "tags", "orders",
            "lifetime_value", "status", "plan", "verified",
        }  # fmt: skip
        assert set(d["address"]) == {"city", "country", "zip"}
        assert 16 <= d["age"] <= 95 and d["orders"] >= 0
        assert "@" in d["email"] and d["tags"] == sorted(set(d["tags"]))
        assert len(d["signup_date"]) == 10 and d["signup_date"][4] == "-"
        assert isinstance(d["verified"], bool) and isinstance(d["lifetime_value"], float)
    status = collections.Counter(d["status"] for d in docs)
    assert status.most_common(1)[0][0] == "active"  # skewed, like real data
    assert len({d["address"]["city"] for d in docs}) >= 10


def test_write_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "u.jsonl"
    size = write_jsonl(path, 1234, seed=3)
    data = path.read_bytes()
    assert len(data) == size and data.endswith(b"\n")
    rows = [msgspec.json.decode(line) for line in data.splitlines()]
    assert rows == list(users(1234, seed=3))
