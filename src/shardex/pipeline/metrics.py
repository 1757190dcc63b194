"""The pipeline driver's Prometheus metrics: its micro-batches and initial builds.

The driver is no node (it has no HTTP port of the nodes'), so it serves its own ``/metrics``
(``serve``; ``shardex pipeline --metrics-port``, the URL also written to
``<pipeline home>/metrics.url``). Families (names and labels: docs/operations.md, "Metrics"):

* ``shardex_pipeline_batches_total{keyspace}``, ``..._batch_changes_total{keyspace}``,
  ``..._batch_key_versions_total{keyspace}``, ``..._evaluation_errors_total{keyspace,
  index}``: counted per micro-batch;
* ``shardex_pipeline_batch_seconds{keyspace, step}``: histograms of a batch's steps
  (``project``, ``deliver``, ``stabilise``, and ``total``: from its start to its publication);
* ``shardex_pipeline_builds_total{keyspace, outcome}``, ``..._build_seconds{keyspace}``,
  ``..._build_documents_total{keyspace}``: initial builds.

Observed once per batch or build (not per row): the cost is a few dictionary lookups.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

if TYPE_CHECKING:
    from shardex.pipeline.batch_steps import BatchStats
    from shardex.pipeline.build import BuildResult

__all__ = ["BATCH_STEPS", "PipelineMetrics"]

BATCH_STEPS: Final = ("project", "deliver", "stabilise", "total")
# A batch takes milliseconds to seconds; a build seconds to many minutes.
_BATCH_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BUILD_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class PipelineMetrics:
    """One registry per driver (tests may run several drivers in one process)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.batches = Counter(
            "shardex_pipeline_batches", "Micro-batches processed", ["keyspace"], registry=r
        )
        self.changes = Counter(
            "shardex_pipeline_batch_changes",
            "Document changes read by micro-batches",
            ["keyspace"],
            registry=r,
        )
        self.key_versions = Counter(
            "shardex_pipeline_batch_key_versions",
            "Key versions (index entry changes) sent to the indexers",
            ["keyspace"],
            registry=r,
        )
        self.errors = Counter(
            "shardex_pipeline_evaluation_errors",
            "Documents an index definition could not be evaluated on (not indexed)",
            ["keyspace", "index"],
            registry=r,
        )
        self.batch_seconds = Histogram(
            "shardex_pipeline_batch_seconds",
            "Duration of a micro-batch's steps",
            ["keyspace", "step"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.builds = Counter(
            "shardex_pipeline_builds", "Initial builds", ["keyspace", "outcome"], registry=r
        )
        self.build_seconds = Histogram(
            "shardex_pipeline_build_seconds",
            "Duration of a successful initial build",
            ["keyspace"],
            buckets=_BUILD_BUCKETS,
            registry=r,
        )
        self.build_documents = Counter(
            "shardex_pipeline_build_documents",
            "Documents read by successful initial builds",
            ["keyspace"],
            registry=r,
        )

    def observe_batch(self, keyspace: str, stats: BatchStats) -> None:
        self.batches.labels(keyspace).inc()
        self.changes.labels(keyspace).inc(stats.changes)
        self.key_versions.labels(keyspace).inc(stats.key_versions)
        for index, n in stats.errors.items():
            self.errors.labels(keyspace, index).inc(n)
        for step in BATCH_STEPS:
            self.batch_seconds.labels(keyspace, step).observe(getattr(stats, step))

    def observe_build(self, keyspace: str, result: BuildResult) -> None:
        self.builds.labels(keyspace, "done").inc()
        self.build_seconds.labels(keyspace).observe(result.seconds)
        self.build_documents.labels(keyspace).inc(result.docs)

    def build_failed(self, keyspace: str) -> None:
        self.builds.labels(keyspace, "failed").inc()

    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Serve ``/metrics`` on ``host:port`` (0: any free port) from a daemon thread;
        returns the address bound."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        assert isinstance(thread, threading.Thread)
        bound_host, bound_port = server.server_address[:2]
        return str(bound_host), int(bound_port)
