"""Snapshot leases (``index/snapshots.py``): a leased snapshot outlives the ring of K until
its lease expires (by an injected clock) or is released; at most N leased snapshots per
slice; and on real slices a pinned paginated scan whose snapshot is leased pages through
while K+3 newer snapshots are taken, exactly (``test_elastic_adapters.Rig``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.snapshots import SnapshotRing
from shardex.scan.paging_store_spec import PagedScanSpec
from shardex.storage import Store
from shardex.testing.elastic_checker import check_paginated_scan
from tests.unit.scan.test_elastic_adapters import Rig, pages_of

CF = "default"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    s.column_family(CF)
    yield s
    s.close()


def _ts(n: int) -> Timestamp:
    return Timestamp({0: (n, 1)})


def _fill(store: Store, ring: SnapshotRing, first: int, last: int) -> None:
    """Snapshots at TS first..last, each seeing value n under b"k"."""
    cf = store.column_family(CF)
    for n in range(first, last + 1):
        cf.put(b"k", str(n).encode())
        ring.add(_ts(n), lambda: store.snapshot([CF]))


def _code(fn) -> ErrorCode:  # type: ignore[no-untyped-def]
    with pytest.raises(ShardexError) as err:
        fn()
    return err.value.code


def test_a_leased_snapshot_outlives_the_ring_until_its_lease_expires(store: Store) -> None:
    clock = Clock()
    ring = SnapshotRing(3, "ix/0", max_leased=2, clock=clock)
    _fill(store, ring, 1, 2)
    ring.lease(_ts(1), "scan-a", 60.0, _ts(2))
    _fill(store, ring, 3, 8)  # K+ newer snapshots
    assert ring.timestamps() == [_ts(1), _ts(6), _ts(7), _ts(8)]
    assert ring.at(_ts(1), _ts(8)).get(CF, b"k") == b"1"  # still the state at TS 1
    assert _code(lambda: ring.at(_ts(2), _ts(8))) is ErrorCode.SNAPSHOT_TOO_OLD
    clock.now += 59.0
    ring.lease(_ts(1), "scan-a", 60.0, _ts(8))  # a page renews it
    clock.now += 59.0
    assert ring.at(_ts(1), _ts(8)).get(CF, b"k") == b"1"
    clock.now += 1.0  # 60 s after the renewal: expired, released as without leases
    assert _code(lambda: ring.at(_ts(1), _ts(8))) is ErrorCode.SNAPSHOT_TOO_OLD
    assert ring.timestamps() == [_ts(6), _ts(7), _ts(8)]
    # Renewing an expired lease of a released snapshot does not bring it back.
    assert _code(lambda: ring.lease(_ts(1), "scan-a", 60.0, _ts(8))) is (ErrorCode.SNAPSHOT_TOO_OLD)
    assert _code(lambda: ring.lease(_ts(9), "scan-b", 60.0, _ts(8))) is ErrorCode.INDEX_NOT_READY


def test_a_released_lease_lets_its_snapshot_go(store: Store) -> None:
    ring = SnapshotRing(2, "ix/0", clock=Clock())
    _fill(store, ring, 1, 1)
    ring.lease(_ts(1), "a", 60.0, _ts(1))
    ring.lease(_ts(1), "b", 60.0, _ts(1))  # two scans pinned at the same TS
    _fill(store, ring, 2, 4)
    assert ring.release_lease("a") and ring.has(_ts(1))  # b still holds it
    assert ring.release_lease("b") and not ring.has(_ts(1))
    assert not ring.release_lease("b")  # unknown ids are fine
    assert ring.timestamps() == [_ts(3), _ts(4)]


def test_at_most_n_leased_snapshots_per_slice(store: Store) -> None:
    ring = SnapshotRing(3, "ix/0", max_leased=2, clock=Clock())
    _fill(store, ring, 1, 3)
    ring.lease(_ts(1), "a", 60.0, _ts(3))
    ring.lease(_ts(2), "b", 60.0, _ts(3))
    ring.lease(_ts(2), "c", 60.0, _ts(3))  # a TS already leased costs nothing more
    with pytest.raises(ShardexError) as err:
        ring.lease(_ts(3), "d", 60.0, _ts(3))
    assert err.value.code is ErrorCode.SNAPSHOT_TOO_OLD
    assert err.value.details["max_leased"] == 2 and "not_bounded" in err.value.details["hint"]
    assert "d" not in ring.leases()  # the refusal changed nothing
    assert _code(lambda: ring.lease(_ts(3), "e", 0.0, _ts(3))) is ErrorCode.BAD_REQUEST
    ring.release_lease("a")
    ring.lease(_ts(3), "d", 60.0, _ts(3))


def test_a_leased_pinned_scan_pages_through_k_plus_3_newer_snapshots(tmp_path: Path) -> None:
    keep = 2
    rig = Rig(tmp_path, keep=keep)
    try:
        pinned = rig.ts
        for engine in rig.engines.values():  # what the first page's LeaseSnapshots does
            for sl in engine.slices("ix"):
                sl.lease_snapshot(pinned, "scan-1", 60.0)
        spec = PagedScanSpec("ks", "ix", [], snapshot=dict(pinned.to_wire()))
        want = rig.expected(pinned)
        newer: list[Timestamp] = []

        def churn(n: int) -> None:
            if len(newer) < keep + 3:
                newer.append(rig.write(10))

        pages = pages_of(rig, spec, [9], ordered=True, between=churn)
        check_paginated_scan(pages, want, ordered=True)
        assert len(newer) == keep + 3 and rig.expected(newer[-1]) != want
        # Released at the end of the scan: the next snapshot lets it go.
        for engine in rig.engines.values():
            for sl in engine.slices("ix"):
                assert sl.release_lease("scan-1")
        rig.write(5)
        with pytest.raises(ShardexError) as err:
            pages_of(rig, spec, [9], ordered=True, between=lambda n: None)
        assert err.value.code is ErrorCode.SNAPSHOT_TOO_OLD
    finally:
        rig.close()
