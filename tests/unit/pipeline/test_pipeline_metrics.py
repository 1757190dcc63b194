"""The pipeline driver's /metrics: batches and builds counted, served over HTTP."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from shardex.core.timestamp import Timestamp
from shardex.pipeline.batch_steps import BatchStats
from shardex.pipeline.build import BuildResult
from shardex.pipeline.metrics import PipelineMetrics


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_batches_and_builds_move_the_numbers_served_over_http() -> None:
    m = PipelineMetrics()
    host, port = m.serve("127.0.0.1", 0)
    m.observe_batch(
        "users",
        BatchStats(batch_id=1, changes=40, key_versions=80, errors={"ix1": 2}, total=0.2),
    )
    m.observe_batch("users", BatchStats(batch_id=2, changes=2, key_versions=4, total=0.01))
    m.observe_build("users", BuildResult(ts0=Timestamp({}), docs=1000, seconds=3.5))
    m.build_failed("users")
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
        got = _samples(resp.read().decode())
    ks = (("keyspace", "users"),)
    assert got[("shardex_pipeline_batches_total", ks)] == 2
    assert got[("shardex_pipeline_batch_changes_total", ks)] == 42
    assert got[("shardex_pipeline_batch_key_versions_total", ks)] == 84
    assert got[("shardex_pipeline_evaluation_errors_total", (("index", "ix1"), *ks))] == 2
    total = (*ks, ("step", "total"))
    assert got[("shardex_pipeline_batch_seconds_count", total)] == 2
    assert abs(got[("shardex_pipeline_batch_seconds_sum", total)] - 0.21) < 1e-9
    assert got[("shardex_pipeline_builds_total", (*ks, ("outcome", "done")))] == 1
    assert got[("shardex_pipeline_builds_total", (*ks, ("outcome", "failed")))] == 1
    assert got[("shardex_pipeline_build_documents_total", ks)] == 1000
