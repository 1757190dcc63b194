"""The coordinator's replicated state: ``StateContext``, its durable record, and dedup helpers.

The ``StateContext`` is the whole cluster metadata the manager replicas agree on (keyspaces,
the data topology history, index definitions and states, index topologies). It is
small and changes rarely (DDL rates), so every change replicates the *whole* value rather than
a delta: a replica that missed any number of changes catches up with one message, and there
is no log to truncate or replay.

Versions. ``cas`` counts changes (+1 per commit, never reused on a node). ``epoch`` is the
master term that produced the state: a promoted master commits under a new, higher epoch.
States are ordered by ``(epoch, cas)`` (``version_of``), not by ``cas`` alone, because an old
master cut off by a partition may have persisted one state that never reached a majority; a
new master's state at the same ``cas`` must win over it (see
``docs/decisions/0023-coordinator-majority-commit.md``).

Durability. Each manager node keeps one ``CoordinatorRecord`` (its promise and its latest
state) in one file, rewritten atomically (temp file, fsync, rename, directory fsync) on every
change. The value is a few KB to a few MB and has exactly one writer, so a file is simpler
and easier to inspect than a RocksDB column family, and a node without the data service does
not have to open RocksDB for it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

import msgspec

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError, StorageError
from shardex.meta.index_state import IndexRecord
from shardex.meta.rebalance_state import RebalanceRecord
from shardex.meta.users import UserRecord
from shardex.net.messages import Envelope, Kind, Message, decode_frame, encode_frame

# How many request ids the state remembers for deduplication. A client retrying a request
# after this many newer requests have been applied gets it re-run.
MAX_APPLIED_REQUESTS = 1000

RECORD_FORMAT = 1
STATE_FILE = "coordinator.state"


class KeyspaceMeta(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    num_partitions: int
    uuid: str  # unique per creation, so drop + recreate is distinguishable
    created_cas: int
    num_replicas: int = 0  # replica copies of each partition, on distinct nodes
    # seconds: a write without expiry gets this one, a longer one is cut to it (0: none)
    max_ttl: int = 0


class StateContext(msgspec.Struct, frozen=True, kw_only=True):
    """The replicated cluster metadata. Build a changed copy with ``msgspec.structs.replace``
    and hand it to ``OpContext.commit``, which sets ``cas``, ``epoch`` and ``master``."""

    cas: int = 0
    keyspaces: dict[str, KeyspaceMeta] = {}
    # keyspace -> every published data topology, ascending seq_num (the topology history)
    data_topologies: dict[str, list[Topology]] = {}
    # the current or last rebalance / partition move, with the status of every move: what a
    # new master finishes or aborts, and what data nodes reconcile migrations against
    rebalance: RebalanceRecord | None = None
    # request id -> encoded reply (insertion order = apply order), bounded for dedup
    applied_requests: dict[str, bytes] = {}
    # index id -> definition + state (``index_state.py``; the ops are ``index_ddl.py``)
    indexes: dict[str, IndexRecord] = {}
    # index id -> every published index topology (index partition -> indexer node)
    index_topologies: dict[str, list[Topology]] = {}
    # node name -> the cas of the commit that failed it over: such a node serves nothing
    # (its copies may hold writes the cluster never acknowledged) until it is recovered
    failed_over: dict[str, int] = {}
    # node name -> "delta" | "full": recovered after a failover and not yet rebalanced in;
    # the node keeps (delta) or drops (full) the copies the topology no longer gives it
    recovering: dict[str, str] = {}
    # The coordinator's voters: manager name -> member id. Only these count towards a
    # majority (``voter_set.py``); changed one manager at a time by a majority commit of the
    # current set. Empty only before the first commit (and in states written before it
    # existed): the first commit fills it from the manager members.
    voters: dict[str, str] = {}
    # member id -> name of every manager removed from the voters: never admitted again
    retired_voters: dict[str, str] = {}
    # user name -> name, roles and SCRAM keys (``users.py``): every node checks a login
    # against its own copy; a user's StateRequest never sees this section
    users: dict[str, UserRecord] = {}
    epoch: int = 0  # master term that committed this state
    master: str = ""  # name of the master that committed it (diagnostics)


# The fields a reader may ask for in a ``StateRequest``; the version fields always come along.
STATE_SECTIONS: tuple[str, ...] = tuple(
    f for f in StateContext.__struct_fields__ if f not in ("cas", "epoch", "master")
)


class CoordinatorRecord(msgspec.Struct, kw_only=True):
    """What one manager node keeps on disk: its promise and its latest state.

    ``promised_epoch`` is the highest master term this node has granted; it never accepts a
    replicate from a lower term again (what makes a deposed master harmless). ``leader`` is
    who holds that term, as far as this node knows (a hint, not needed for safety)."""

    format: int = RECORD_FORMAT
    promised_epoch: int = 0
    leader: str | None = None
    state: StateContext = msgspec.field(default_factory=StateContext)


def version_of(state: StateContext) -> tuple[int, int]:
    """The order of states: later term first, then later change."""
    return (state.epoch, state.cas)


def newest(states: list[StateContext]) -> StateContext:
    """The state a promoted master continues from: the highest ``(epoch, cas)``.

    Ties (equal versions) are equal states: one master produces one state per version."""
    if not states:
        raise ValueError("no states to choose from")
    return max(states, key=version_of)


_record_encoder = msgspec.msgpack.Encoder()
_record_decoder = msgspec.msgpack.Decoder(CoordinatorRecord)
_state_decoder = msgspec.msgpack.Decoder(StateContext)
# Sorted map keys: equal content gives equal bytes whatever the dict insertion order.
_digest_encoder = msgspec.msgpack.Encoder(order="deterministic")


def encode_record(record: CoordinatorRecord) -> bytes:
    return _record_encoder.encode(record)


def decode_record(data: bytes) -> CoordinatorRecord:
    return _record_decoder.decode(data)


def encode_state(state: StateContext) -> bytes:
    return _record_encoder.encode(state)


def decode_state(data: bytes) -> StateContext:
    return _state_decoder.decode(data)


def state_digest(state: StateContext) -> str:
    """A short content hash (checkers compare states across nodes with it). Map keys are
    made strings first: sorting needs them (topologies map int partitions)."""
    plain = msgspec.to_builtins(state, str_keys=True)
    return hashlib.blake2b(_digest_encoder.encode(plain), digest_size=8).hexdigest()


def select_sections(state: StateContext, sections: list[str] | None) -> StateContext:
    """``state`` with only ``sections`` filled (``None``: everything); versions always kept."""
    if sections is None:
        return state
    unknown = [s for s in sections if s not in STATE_SECTIONS]
    if unknown:
        raise ShardexError(
            f"unknown state section(s) {unknown}",
            code=ErrorCode.BAD_REQUEST,
            details={"unknown": unknown, "valid": list(STATE_SECTIONS)},
        )
    empty = StateContext()
    drop = {f: getattr(empty, f) for f in STATE_SECTIONS if f not in sections}
    return msgspec.structs.replace(state, **drop)


# --- request deduplication ----------------------------------------------------------------


def encode_reply(reply: Message) -> bytes:
    """A reply as stored in ``applied_requests`` (a whole frame, so any message type decodes)."""
    return encode_frame(Envelope(Kind.RESPONSE, 0, reply))


def decode_reply(data: bytes) -> Message:
    return decode_frame(data).body


def record_reply(
    state: StateContext, request_id: str, reply: Message, limit: int = MAX_APPLIED_REQUESTS
) -> StateContext:
    """``state`` with ``request_id -> reply`` remembered, oldest entries evicted past ``limit``.

    Recorded in the same commit as the op's effect, so "applied" and "answered" can never be
    separated by a crash."""
    applied = dict(state.applied_requests)
    applied.pop(request_id, None)  # re-recording moves it to the young end
    applied[request_id] = encode_reply(reply)
    excess = len(applied) - limit
    if excess > 0:
        for rid in list(applied)[:excess]:
            del applied[rid]
    return msgspec.structs.replace(state, applied_requests=applied)


def stored_reply(state: StateContext, request_id: str | None) -> Message | None:
    """The reply recorded for ``request_id``, if that request was already applied."""
    if request_id is None:
        return None
    data = state.applied_requests.get(request_id)
    return None if data is None else decode_reply(data)


# --- stores ----------------------------------------------------------------------------


class StateStore(Protocol):
    """Where a manager node keeps its ``CoordinatorRecord`` across restarts. ``save`` must be
    atomic and durable when it returns: the coordinator acknowledges right after it."""

    def load(self) -> CoordinatorRecord | None: ...

    def save(self, record: CoordinatorRecord) -> None: ...


class MemoryStateStore:
    """For tests and the simulator: keeps the *encoded* record, so every simulated restart
    goes through the same encode/decode as a real one."""

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.saves = 0

    def load(self) -> CoordinatorRecord | None:
        return None if self.data is None else decode_record(self.data)

    def save(self, record: CoordinatorRecord) -> None:
        self.data = encode_record(record)
        self.saves += 1


class FileStateStore:
    """``<data-dir>/coordinator.state``, msgpack, replaced atomically on every save.

    The write is synchronous (a few ms with fsync): commits are DDL-rate, and the ack to the
    master must not go out before the bytes are durable anyway."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / STATE_FILE

    def load(self) -> CoordinatorRecord | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StorageError(
                f"cannot read {self.path}: {e}", details={"path": str(self.path)}
            ) from e
        try:
            record = decode_record(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise StorageError(
                f"{self.path} is not a valid coordinator state: {e}",
                details={
                    "path": str(self.path),
                    "hint": "restore it from a backup, or remove it: the node then resyncs "
                    "from the master (it must not be the only copy)",
                },
            ) from e
        if record.format != RECORD_FORMAT:
            raise StorageError(
                f"{self.path} has format {record.format}, this version reads {RECORD_FORMAT}",
                details={"path": str(self.path), "format": record.format},
            )
        return record

    def save(self, record: CoordinatorRecord) -> None:
        from shardex.runtime.files import atomic_write_bytes

        try:
            atomic_write_bytes(self.path, encode_record(record))
        except OSError as e:
            raise StorageError(
                f"cannot write {self.path}: {e}", details={"path": str(self.path)}
            ) from e
