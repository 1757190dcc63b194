"""Keyspace DDL messages (client -> any manager node -> the coordinator master) and the
cluster-level rule for keyspace names, checked by the client before sending and by the
coordinator again."""

from __future__ import annotations

import re

import msgspec

from shardex.api.errors import BadRequest
from shardex.core.topology import Topology
from shardex.meta.partitioning import DEFAULT_NUM_PARTITIONS
from shardex.meta.state import KeyspaceMeta
from shardex.net.messages import Message

KEYSPACE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # fullmatch: "$" passes "x\n"


MAX_KEYSPACE_NAME = 100


class CreateKeyspace(Message, tag="manager.CreateKeyspace"):
    name: str
    num_partitions: int = DEFAULT_NUM_PARTITIONS
    request_id: str = ""
    # replica copies of each partition, 0-3; None: 1 when two or more data nodes are up,
    # else 0 (``meta/replica_placement.py``)
    num_replicas: int | None = None
    # seconds, 0-2**31-1: the documents' default and largest expiry (0: none; api/expiry.py)
    max_ttl: int = 0


class SetKeyspaceReplicas(Message, tag="manager.SetKeyspaceReplicas"):
    """Change a keyspace's replica count (0-3): its chains are widened or narrowed at once
    on the serving data nodes, the new copies built from the actives' data."""

    name: str
    num_replicas: int
    request_id: str = ""


class KeyspaceReplicasSet(Message, tag="manager.KeyspaceReplicasSet"):
    meta: KeyspaceMeta
    topology: Topology
    previous: int  # the replica count before
    warnings: list[str] = msgspec.field(default_factory=list)


class DropKeyspace(Message, tag="manager.DropKeyspace"):
    name: str
    request_id: str = ""


class ListKeyspaces(Message, tag="manager.ListKeyspaces"):
    request_id: str = ""


class KeyspaceCreated(Message, tag="manager.KeyspaceCreated"):
    meta: KeyspaceMeta
    topology: Topology
    # what the replica placement could not honour (too few nodes or server groups)
    warnings: list[str] = msgspec.field(default_factory=list)


class KeyspaceDropped(Message, tag="manager.KeyspaceDropped"):
    name: str
    uuid: str
    # data nodes that drop their copy when they reconcile (not recorded for a retried request)
    pending_nodes: list[str] = msgspec.field(default_factory=list)


class KeyspaceList(Message, tag="manager.KeyspaceList"):
    keyspaces: list[KeyspaceMeta]
    topologies: dict[str, Topology]  # latest topology of each keyspace


def check_keyspace_name(name: object) -> str:
    """The cluster-level rule (stricter than the engine's on-disk alphabet): an identifier
    that SQL can name without quoting tricks, dashes allowed."""
    if not isinstance(name, str) or not name:
        raise BadRequest(
            f"keyspace name must be a non-empty string, got {name!r}",
            details={"keyspace": repr(name)},
        )
    if len(name) > MAX_KEYSPACE_NAME or not KEYSPACE_NAME.fullmatch(name):
        raise BadRequest(
            f"invalid keyspace name {name!r}",
            details={
                "keyspace": name[:120],
                "hint": f"1-{MAX_KEYSPACE_NAME} characters: a letter or _ first, then letters, "
                "digits, _ or -",
            },
        )
    return name
