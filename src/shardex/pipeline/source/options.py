"""Options of the change source, parsed once on the driver, and the unit of a Spark task.

``SourceOptions`` and ``ChangeRangesPartition`` are pickled to Spark's planner and worker
processes: everything a worker needs travels inside them. The options are parsed where Spark
creates the data source, on the driver's host: ``cluster_dir`` and ``secret_file`` are read
there and become one ``NodeAccess`` value (addresses, secret), so an executor on another
host, which has neither file, never opens a path of the driver's (the secret never appears
in a repr).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from shardex.client import Client
from shardex.core.timestamp import Timestamp
from shardex.errors import ConfigError, ShardexError
from shardex.pipeline.source.plan import group_ranges
from shardex.pipeline.source.projected import (
    COUNTS_SCHEMA,
    ProjectSpec,
    load_batches,
    project_batches,
)
from shardex.pipeline.source.read import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_ITEMS,
    DEFAULT_RESUME_TIMEOUT,
    client_for,
    read_ranges_for,
)
from shardex.pipeline.source.types import Endpoint, NodeAccess, PartitionRange

MODES = ("changes", "snapshot")
READERS = ("partitioned", "driver", "follow")
# How the stream readers learn the high seqnos: "owners" (default: each owner asked
# directly, one hop; ``source/seqnos.py``) or "gather" (one HighSeqnos to a data node, which
# gathers from the owners). Measured in the pipeline at 5,000 writes/s: the RPC at a
# batch's start 0.24-0.64x in 9 of 10 pairs (docs/decisions/0064-latestoffset-from-owners.md).
HIGH_SEQNOS = ("owners", "gather")
# Idle, Spark asks for the latest offset about 50 times a second (measured); each ask costs a
# HighSeqnos fan-out (2.5-3 ms here). Reusing an answer for 20 ms bounds that to 50/s at most
# and to ~25/s in practice, adds at most 20 ms before an idle query notices a write, and
# changes nothing under load (a busy query's previous ask is a whole batch old).
DEFAULT_LATEST_OFFSET_INTERVAL_MS = 20.0
# ... and while nothing changes the reuse grows to this (``source/idle.py``): an idle stream
# asks each owner ~4 times a second instead of ~25-50. The maintenance job's read-ahead polls
# every 100 ms meanwhile and notices a write first; without it, an idle stream's first write
# waits at most this long to be noticed (docs/decisions/0107-idle-high-seqnos-backoff.md).
DEFAULT_IDLE_OFFSET_INTERVAL_MS = 250.0
OWNERS_MAX_AGE = 10.0  # seconds between refreshes of the topology used to group tasks


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options: resolved on the driver, pickled into readers and partitions."""

    endpoint: Endpoint
    mode: str = "changes"
    start_ts: Timestamp | None = None
    end_ts: Timestamp | None = None
    snapshot_ts: Timestamp | None = None
    starting_offsets: str | Timestamp = "earliest"
    reader: str = "partitioned"
    high_seqnos: str = "owners"
    tasks: str | int = "owner"
    max_records_per_batch: int | None = None
    latest_offset_interval: float = DEFAULT_LATEST_OFFSET_INTERVAL_MS / 1000.0
    idle_offset_interval: float = DEFAULT_IDLE_OFFSET_INTERVAL_MS / 1000.0
    concurrency: int = DEFAULT_CONCURRENCY
    max_items: int = DEFAULT_MAX_ITEMS
    resume_timeout: float = DEFAULT_RESUME_TIMEOUT
    stats_path: str | None = None
    project: ProjectSpec | None = None

    @property
    def schema_ddl(self) -> str:
        """The rows this read hands Spark: changes, key versions or load counts."""
        from shardex.index.keyversion import KEY_VERSION_DDL
        from shardex.pipeline.source.types import SCHEMA_DDL

        if self.project is None:
            return SCHEMA_DDL
        return KEY_VERSION_DDL if self.project.load is None else COUNTS_SCHEMA

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        o = {str(k).lower(): v for k, v in options.items()}
        keyspace = o.get("keyspace")
        if not keyspace:
            raise config_error("option 'keyspace' is required", "keyspace")
        timeout = _num(o, "request_timeout", 10.0)
        return cls(
            endpoint=_endpoint(o, keyspace, timeout),
            mode=_choice(o, "mode", MODES),
            start_ts=_ts(o, "start_ts"),
            end_ts=_ts(o, "end_ts"),
            snapshot_ts=_ts(o, "snapshot_ts"),
            starting_offsets=_starting(o.get("starting_offsets", "earliest")),
            reader=_choice(o, "reader", READERS),
            high_seqnos=_choice(o, "high_seqnos", HIGH_SEQNOS),
            tasks=_tasks(o.get("tasks", "owner")),
            max_records_per_batch=_opt_int(o, "max_records_per_batch"),
            latest_offset_interval=_num(
                o, "latest_offset_interval_ms", DEFAULT_LATEST_OFFSET_INTERVAL_MS
            )
            / 1000.0,
            idle_offset_interval=_num(o, "idle_offset_interval_ms", DEFAULT_IDLE_OFFSET_INTERVAL_MS)
            / 1000.0,
            concurrency=int(_num(o, "concurrency", DEFAULT_CONCURRENCY)),
            max_items=int(_num(o, "max_items", DEFAULT_MAX_ITEMS)),
            resume_timeout=_num(o, "resume_timeout", DEFAULT_RESUME_TIMEOUT),
            stats_path=o.get("stats_path"),
            project=_project(o),
        )

    def connect(self) -> Client:
        return self.endpoint.access.connect("shardex-spark-driver")


def config_error(message: str, option: str, **details: Any) -> ConfigError:
    return ConfigError(message, details={"option": option, **details})


def _endpoint(o: Mapping[str, str], keyspace: str, timeout: float) -> Endpoint:
    if o.get("cluster_dir"):
        from shardex.meta import cluster_dir as cdir

        path = Path(o["cluster_dir"])
        spec = cdir.load(path)
        addresses = tuple(n.address for n in spec.nodes)
        secret = cdir.read_secret(path, spec)
        tls_ca = cdir.tls_ca(path, spec)
    elif o.get("addresses"):
        addresses = tuple(a.strip() for a in o["addresses"].split(",") if a.strip())
        if o.get("secret"):
            secret = o["secret"]
        elif o.get("secret_file"):
            secret = Path(o["secret_file"]).read_text().strip()
        else:
            raise config_error(
                "option 'secret' or 'secret_file' is required with 'addresses'", "secret"
            )
        tls_ca = Path(o["tls_ca"]) if o.get("tls_ca") else None
    else:
        raise config_error(
            "option 'cluster_dir' or 'addresses' is required",
            "cluster_dir",
            hint="cluster_dir=/path/of/a/local/cluster or addresses=host:port,...",
        )
    return Endpoint(NodeAccess(addresses, secret, timeout, _read_ca(tls_ca)), keyspace)


def _read_ca(path: Path | None) -> str | None:
    """The CA certificate's PEM text, read here on the driver: read tasks run on executors
    that may have no such file."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise config_error(
            f"cannot read the cluster CA certificate {path}: {exc}",
            "tls_ca",
            value=str(path),
            hint="the ca.pem made by `shardex cluster certs`",
        ) from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise config_error(
            f"{path} holds no PEM certificate",
            "tls_ca",
            value=str(path),
            hint="the ca.pem made by `shardex cluster certs`",
        )
    return text


def _choice(o: Mapping[str, str], name: str, allowed: Sequence[str]) -> str:
    value = o.get(name, allowed[0]).lower()
    if value not in allowed:
        raise config_error(
            f"option {name!r} must be one of {', '.join(allowed)}", name, value=value
        )
    return value


def _num(o: Mapping[str, str], name: str, default: float) -> float:
    raw = o.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise config_error(f"option {name!r} must be a number", name, value=raw) from None
    if value < 0:
        raise config_error(f"option {name!r} must not be negative", name, value=raw)
    return value


def _opt_int(o: Mapping[str, str], name: str) -> int | None:
    if not o.get(name):
        return None
    value = int(_num(o, name, 0))
    if value < 1:
        raise config_error(f"option {name!r} must be at least 1", name, value=o[name])
    return value


def _ts(o: Mapping[str, str], name: str) -> Timestamp | None:
    raw = o.get(name)
    if not raw:
        return None
    try:
        return Timestamp.from_json(json.loads(raw))
    except (ValueError, ShardexError, AttributeError) as exc:
        raise config_error(
            f"option {name!r} is not a timestamp: {exc}",
            name,
            hint='{"<partition>": [seqno, uuid], ...}',
        ) from None


def _project(o: Mapping[str, str]) -> ProjectSpec | None:
    raw = o.get("project")
    if not raw:
        if o.get("load"):
            raise config_error("option 'load' needs 'project' (the indexes to load)", "load")
        return None
    spec = ProjectSpec.from_options(raw, o.get("load"))
    if spec.load is not None:
        if o.get("mode", "changes").lower() != "snapshot":
            raise config_error("option 'load' is an initial build: it needs mode=snapshot", "load")
        snap = _ts(o, "snapshot_ts")
        if snap is None or snap != spec.load.ts0:
            raise config_error(
                "option 'load' must name the same TS as 'snapshot_ts' (chunks are loaded at it)",
                "load",
                hint="snapshot_ts=<T0 JSON>, load=LoadSpec(T0, owners).to_option()",
            )
    return spec


def _starting(raw: str) -> str | Timestamp:
    if raw.lower() in ("earliest", "latest"):
        return raw.lower()
    parsed = _ts({"starting_offsets": raw}, "starting_offsets")
    assert parsed is not None
    return parsed


def _tasks(raw: str) -> str | int:
    if raw.lower() in ("owner", "partition"):
        return raw.lower()
    try:
        n = int(raw)
    except ValueError:
        raise config_error("option 'tasks' must be owner, partition or a number", "tasks") from None
    if n < 1:
        raise config_error("option 'tasks' must be at least 1", "tasks", value=raw)
    return n


def current_timestamp(options: Mapping[str, str] | SourceOptions) -> Timestamp:
    """The keyspace's current high seqnos: the T0 to pass as ``snapshot_ts`` (and then as the
    stream's ``starting_offsets``) when the caller must know the snapshot's timestamp, as an
    initial build does."""
    opts = options if isinstance(options, SourceOptions) else SourceOptions.parse(options)
    with opts.connect() as client:
        return client.high_seqnos(opts.endpoint.keyspace)


class ChangeRangesPartition(InputPartition):
    """One Spark task: the ranges it reads and how to reach the data service. Pickled to a
    worker, so it carries everything (the worker has no access to the driver's state)."""

    def __init__(
        self,
        endpoint: Endpoint,
        ranges: Sequence[PartitionRange],
        *,
        snapshot: bool = False,
        concurrency: int = DEFAULT_CONCURRENCY,
        max_items: int = DEFAULT_MAX_ITEMS,
        resume_timeout: float = DEFAULT_RESUME_TIMEOUT,
        project: ProjectSpec | None = None,
    ) -> None:
        super().__init__(None)
        self.endpoint = endpoint
        self.ranges = tuple(ranges)
        self.snapshot = snapshot
        self.concurrency = concurrency
        self.max_items = max_items
        self.resume_timeout = resume_timeout
        self.project = project

    def __repr__(self) -> str:
        parts = ",".join(str(r.partition) for r in self.ranges[:8])
        more = "..." if len(self.ranges) > 8 else ""
        return f"ChangeRangesPartition(partitions=[{parts}{more}], snapshot={self.snapshot})"

    def read(self) -> Iterator[pa.RecordBatch]:
        changes = read_ranges_for(
            self.endpoint,
            self.ranges,
            snapshot=self.snapshot,
            concurrency=self.concurrency,
            max_items=self.max_items,
            resume_timeout=self.resume_timeout,
        )
        spec = self.project
        if spec is None:
            return changes
        if spec.load is None:
            return project_batches(spec.definitions, changes)
        return load_batches(client_for(self.endpoint), spec.definitions, spec.load, changes)


def task_partitions(
    opts: SourceOptions,
    ranges: Sequence[PartitionRange],
    owners: Mapping[int, str],
    *,
    snapshot: bool = False,
) -> list[ChangeRangesPartition]:
    return [
        ChangeRangesPartition(
            opts.endpoint,
            group,
            snapshot=snapshot,
            concurrency=opts.concurrency,
            max_items=opts.max_items,
            resume_timeout=opts.resume_timeout,
            project=opts.project,
        )
        for group in group_ranges(ranges, owners, opts.tasks)
    ]


def with_options(opts: SourceOptions, **changes: Any) -> SourceOptions:
    """A copy with fields replaced (tests and benchmarks)."""
    return replace(opts, **changes)
