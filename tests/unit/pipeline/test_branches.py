"""``pipeline/branches.py``: indexes on a partition's old branch follow a failover's new one
when they applied nothing past its start, and the batch fails with ROLLBACK otherwise;
``IndexRegistry.rebase`` rewrites only the entries at or below the checked seqno."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import shardex.pipeline.branches as branches
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.registry import IndexRegistry

OLD, NEW, OTHER = 0xA, 0xB, 0xC


@dataclass
class View:
    id: str


class Registry:
    """What ``follow_branches`` uses of an ``IndexRegistry``."""

    keyspace = "ks"

    def __init__(self, applied: dict[str, Timestamp], ahead: dict[str, Timestamp]) -> None:
        self._applied, self._ahead = applied, ahead
        self.rebased: list[tuple[int, int, int, int]] = []

    def maintained(self) -> list[View]:
        return [View(i) for i in sorted(self._applied)]

    def applied(self, index_id: str) -> Timestamp:
        return self._applied[index_id]

    def ahead(self, index_id: str) -> Timestamp:
        return self._ahead.get(index_id, self._applied[index_id])

    def rebase(self, partition: int, old: int, new: int, upto: int) -> None:
        self.rebased.append((partition, old, new, upto))


def history(branch_point: int):
    """The partition's failover log check: the old branch ended at ``branch_point``."""

    def check(_client, _keyspace, _partition, at) -> int | None:
        return None if at.seqno <= branch_point else branch_point

    return check


def ts(**entries: tuple[int, int]) -> Timestamp:
    return Timestamp.from_wire({int(k[1:]): v for k, v in entries.items()})


def test_same_branch_everywhere_asks_nothing(monkeypatch) -> None:
    def never(*_a) -> None:
        raise AssertionError("no partition changed branch: nothing to check")

    monkeypatch.setattr(branches, "_rollback_seqno", never)
    reg = Registry({"i1": ts(p0=(5, OLD), p1=(7, OTHER))}, {})
    branches.follow_branches(None, reg, ts(p0=(9, OLD), p1=(9, OTHER)))  # type: ignore[arg-type]
    assert reg.rebased == []


def test_indexes_at_or_below_the_branch_point_follow_it(monkeypatch) -> None:
    monkeypatch.setattr(branches, "_rollback_seqno", history(branch_point=50))
    reg = Registry(
        {"i1": ts(p0=(40, OLD), p1=(7, OTHER)), "i2": ts(p0=(45, OLD), p1=(7, OTHER))},
        {"i2": ts(p0=(50, OLD), p1=(9, OTHER))},
    )
    branches.follow_branches(None, reg, ts(p0=(80, NEW), p1=(9, OTHER)))  # type: ignore[arg-type]
    # the highest seqno any index holds on the old branch was checked and rebased
    assert reg.rebased == [(0, OLD, NEW, 50)]


def test_an_index_past_the_branch_point_fails_the_batch_with_rollback(monkeypatch) -> None:
    monkeypatch.setattr(branches, "_rollback_seqno", history(branch_point=50))
    # i1 applied 52 of the old branch (writes the promoted replica never had)
    reg = Registry({"i1": ts(p0=(52, OLD))}, {})
    with pytest.raises(ShardexError) as err:
        branches.follow_branches(None, reg, ts(p0=(80, NEW)))  # type: ignore[arg-type]
    assert err.value.code is ErrorCode.ROLLBACK
    assert err.value.details["partition"] == 0 and err.value.details["rollback_seqno"] == 50
    assert reg.rebased == []


def test_registry_rebase_rewrites_only_entries_on_the_old_branch_up_to_the_check() -> None:
    reg = IndexRegistry(None, "ks")  # type: ignore[arg-type]
    reg.join("i1", ts(p0=(40, OLD), p1=(3, OTHER)), ahead=ts(p0=(60, OLD), p1=(3, OTHER)))
    reg.join("i2", ts(p0=(40, OTHER)))
    reg.rebase(0, OLD, NEW, 50)
    assert reg.applied("i1").to_wire() == {0: (40, NEW), 1: (3, OTHER)}
    # ahead at 60 is past the checked seqno: left alone (the caller raised ROLLBACK for it)
    assert reg.ahead("i1").get(0).seqno == 60
    assert reg.applied("i2").to_wire() == {0: (40, OTHER)}
