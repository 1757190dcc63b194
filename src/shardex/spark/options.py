"""The connector's options, parsed once where Spark creates the data source (the driver).

The connection part is the change source's (``pipeline/source/options.py``): ``cluster`` is
turned into its ``cluster_dir`` or ``addresses`` and parsed by ``SourceOptions.parse``, so
the node credential is the same picklable ``NodeAccess`` (addresses, node secret, the CA's
PEM text) and an executor on another host needs no file of the driver's. What is the
connector's own (consistency, index, sampling, the write's key and durability) is checked
here, and every bad value is a ``ConfigError`` naming the option and the value, with the
hint in the message: Spark hands a Python worker's error to the caller as text only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardex.api.validation import DURABILITIES, durability_level
from shardex.client import Client
from shardex.core.timestamp import Timestamp
from shardex.errors import ConfigError, ShardexError
from shardex.pipeline.source.options import SourceOptions

CONSISTENCIES = ("not_bounded", "request_plus")
DEFAULT_SAMPLE_SIZE = 1000
# Options of the change source a connector read passes through as they are.
_PASSED = ("secret", "secret_file", "tls_ca", "request_timeout", "max_records_per_batch")
# Options the connector understands; anything else is refused (a typo must not be ignored).
KNOWN = frozenset(
    {
        "cluster",
        "keyspace",
        "consistency",
        "index",
        "sample_size",
        "snapshot_ts",
        "starting_offsets",
        "key",
        "durability",
        "path",  # Spark's own: load(path) / save(path) set it
        *_PASSED,
    }
)


def bad_option(
    message: str, option: str, value: Any = None, hint: str | None = None
) -> ConfigError:
    """A ConfigError whose text carries the option, the value and the hint."""
    text = f"option {option!r}: {message}"
    if value is not None:
        text += f" (got {value!r})"
    if hint:
        text += f"; hint: {hint}"
    details: dict[str, Any] = {"option": option}
    if value is not None:
        details["value"] = value
    if hint:
        details["hint"] = hint
    return ConfigError(text, details=details)


@dataclass(frozen=True)
class ConnectorOptions:
    """Parsed connector options: ``source`` (the change source's, with the endpoint) plus
    the connector's own. Pickled into readers, writers and partitions."""

    source: SourceOptions
    consistency: str = "not_bounded"
    index: str | None = None
    sample_size: int = DEFAULT_SAMPLE_SIZE
    key: str = "_id"
    durability: str = "persist"

    @property
    def keyspace(self) -> str:
        return self.source.endpoint.keyspace

    def connect(self) -> Client:
        return self.source.connect()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ConnectorOptions:
        o = {str(k).lower(): str(v) for k, v in options.items()}
        unknown = sorted(set(o) - KNOWN)
        if unknown:
            raise bad_option(
                "unknown option", unknown[0], hint=f"the options are {', '.join(sorted(KNOWN))}"
            )
        keyspace = o.get("keyspace") or o.get("path")
        if not keyspace:
            raise bad_option("is required", "keyspace", hint='.option("keyspace", "users")')
        consistency = o.get("consistency", "not_bounded").lower()
        if consistency not in CONSISTENCIES:
            raise bad_option(
                "unknown consistency", "consistency", consistency, hint=" or ".join(CONSISTENCIES)
            )
        durability = o.get("durability", "persist")
        if durability not in DURABILITIES:
            raise bad_option(
                "unknown durability level", "durability", durability, hint=", ".join(DURABILITIES)
            )
        sample_size = _positive(o, "sample_size", DEFAULT_SAMPLE_SIZE)
        source = {"keyspace": keyspace, **_where(o)}
        source.update({k: o[k] for k in _PASSED if k in o})
        source.update(
            mode="snapshot",
            tasks="partition",  # one Spark partition per data partition
            starting_offsets=o.get("starting_offsets", "earliest"),
        )
        if o.get("snapshot_ts"):
            source["snapshot_ts"] = o["snapshot_ts"]
        try:
            parsed = SourceOptions.parse(source)
        except ShardexError as exc:  # the change source's option names: say ours
            option = str(exc.details.get("option", "cluster"))
            raise bad_option(exc.message, option, hint=exc.details.get("hint")) from None
        return cls(
            source=parsed,
            consistency=consistency,
            index=o.get("index") or None,
            sample_size=sample_size,
            key=o.get("key") or "_id",
            durability=durability_level(durability),
        )

    def check_keyspace(self) -> tuple[int, dict[int, str]]:
        """The keyspace's partition count and owners; KEYSPACE_NOT_FOUND naming it (with
        the keyspaces there are) when the cluster has no such keyspace."""
        with self.connect() as client:
            try:
                meta, topo = client.rpc.run(client.rpc.router.keyspace(self.keyspace))
            except ShardexError as exc:
                names = sorted(k.name for k in client.list_keyspaces())
                raise ShardexError(
                    f"{exc.message}; the cluster's keyspaces are {', '.join(names) or 'none'}",
                    code=exc.code,
                    details={**exc.details, "keyspace": self.keyspace},
                ) from None
        return meta.num_partitions, dict(topo.assignment)

    def snapshot_ts(self) -> Timestamp | None:
        return self.source.snapshot_ts


def _where(o: Mapping[str, str]) -> dict[str, str]:
    """``cluster`` as the change source's ``cluster_dir`` (a directory) or ``addresses``."""
    raw = o.get("cluster", "").strip()
    hint = "a cluster directory (shardex cluster init --dir) or host:port,host:port"
    if not raw:
        raise bad_option("is required", "cluster", hint=hint)
    if Path(raw).is_dir():
        return {"cluster_dir": raw}
    addresses = [a.strip() for a in raw.split(",") if a.strip()]
    if addresses and all(_is_address(a) for a in addresses):
        if not (o.get("secret") or o.get("secret_file")):
            raise bad_option(
                "addresses need the node secret", "secret", hint="option secret or secret_file"
            )
        return {"addresses": ",".join(addresses)}
    raise bad_option("is neither a directory nor a list of addresses", "cluster", raw, hint)


def _is_address(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit())


def _positive(o: Mapping[str, str], name: str, default: int) -> int:
    raw = o.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise bad_option("must be a whole number of at least 1", name, raw)
    return value


def offsets_json(ts: Timestamp) -> str:
    """A vector as the JSON the ``snapshot_ts`` and ``starting_offsets`` options take."""
    return json.dumps(ts.to_json())
