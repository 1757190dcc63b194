"""The hot-path latency histograms: Prometheus' ``le`` buckets, sums, and a tuple key's
histograms merged by one of its labels."""

from __future__ import annotations

import math

from shardex.runtime.latency import Histogram, Latencies


def test_an_observation_counts_in_the_first_bucket_at_or_above_it() -> None:
    h = Histogram((0.001, 0.01, 0.1))
    for s in (0.0005, 0.001, 0.002, 0.05, 3.0):
        h.observe(s)
    assert h.counts == [2, 1, 1, 1]  # 0.001 is "le 0.001"; 3.0 only in +Inf
    assert h.count == 5
    assert math.isclose(h.total, 3.0535)
    assert h.cumulative() == [(0.001, 2), (0.01, 3), (0.1, 4), (math.inf, 5)]


def test_latencies_keep_one_histogram_per_key_and_merge_by_a_label() -> None:
    lat: Latencies[tuple[str, str]] = Latencies((0.01, 1.0))
    lat.observe(("upsert", "none"), 0.005)
    lat.observe(("upsert", "majority"), 0.5)
    lat.observe(("delete", "majority"), 2.0)
    h = lat.get(("upsert", "none"))
    assert h is not None and h.counts == [1, 0, 0]
    assert lat.get(("insert", "none")) is None
    by_op = lat.merged(lambda k: k[0])
    assert by_op["upsert"].counts == [1, 1, 0] and math.isclose(by_op["upsert"].total, 0.505)
    by_level = lat.merged(lambda k: k[1])
    assert by_level["majority"].counts == [0, 1, 1]
    assert by_level["none"].count == 1
    # merging copies: the kept histograms do not change
    assert lat.get(("upsert", "none")).counts == [1, 0, 0]  # type: ignore[union-attr]
