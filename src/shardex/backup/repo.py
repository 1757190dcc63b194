"""The backup repository: its layout, its manifests, and the partition files.

    REPO/
      shardex-backup.json            what makes a directory a repository (format, version)
      .lock                          flock held by the one backup or restore writing here
      backups/0001-20261129T084500Z/ one finished backup (the sequence number orders them)
        manifest.json                keyspaces, index definitions, the seqno vector, files
        users/p0000.parquet ...      one Parquet file per data partition of each keyspace
      tmp/0002-.../                  a backup under way: renamed into backups/ when done
      restores/NAME--KS--TO.json     the partitions a restore has finished (its resume point)

Open on purpose: any Parquet reader sees a partition's rows (docid, seqno, cas, deleted,
body as JSON bytes, flags, expiry), and the manifest is plain JSON. Each file's size and
SHA-256 are in the manifest, so a truncated or altered file is refused by name instead of
restoring wrong data. A manifest lands last, by an atomic rename of the whole backup
directory: a directory under ``backups/`` is complete or absent.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from shardex.api.records import OP_DELETE, Change
from shardex.errors import ErrorCode, ShardexError
from shardex.runtime.files import atomic_write_bytes

FORMAT = "shardex-backup"
VERSION = 1
MARKER = "shardex-backup.json"
BACKUPS = "backups"
TMP = "tmp"
RESTORES = "restores"
MANIFEST = "manifest.json"

FULL = "full"
INCREMENTAL = "incremental"

# One row per document version; ``body`` is the document's JSON exactly as stored (null for
# a deletion), so restoring writes the same bytes back.
SCHEMA = pa.schema(
    [
        pa.field("docid", pa.string(), nullable=False),
        pa.field("seqno", pa.int64(), nullable=False),
        pa.field("cas", pa.int64(), nullable=False),
        pa.field("deleted", pa.bool_(), nullable=False),
        pa.field("body", pa.binary()),
        pa.field("flags", pa.int64(), nullable=False),
        pa.field("expiry", pa.int64(), nullable=False),
    ]
)

_NAME_RE = re.compile(r"^(\d{4,})-\d{8}T\d{6}Z$")


class PartitionEntry(msgspec.Struct, kw_only=True, frozen=True):
    """One data partition in one backup: the versions of (from_seqno, seqno] on ``uuid``'s
    history (a full copy starts at 0 and holds the live documents only)."""

    kind: str  # FULL | INCREMENTAL
    from_seqno: int
    from_uuid: int
    seqno: int
    uuid: int
    rows: int
    tombstones: int
    file: str  # relative to the backup's directory
    bytes: int
    sha256: str
    note: str | None = None  # why a full copy was taken where an incremental was due


class IndexEntry(msgspec.Struct, kw_only=True, frozen=True):
    """An index definition as ``create_index`` takes it."""

    name: str
    keys: list[str]
    where: str | None
    partition_by: list[str] | None
    num_partition: int
    is_primary: bool
    num_replica: int
    defer_build: bool  # deferred and never built: restored deferred too


class KeyspaceEntry(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    num_partitions: int
    num_replicas: int
    uuid: str  # the keyspace's identity: a dropped and re-created one starts a new chain
    indexes: list[IndexEntry]
    partitions: dict[int, PartitionEntry]

    @property
    def documents(self) -> int:
        """Document versions stored (all documents for a full backup, the changed ones for
        an incremental)."""
        return sum(e.rows - e.tombstones for e in self.partitions.values())

    @property
    def tombstones(self) -> int:
        return sum(e.tombstones for e in self.partitions.values())

    @property
    def vector(self) -> dict[int, tuple[int, int]]:
        """partition -> (seqno, uuid): where the backup holds each partition."""
        return {p: (e.seqno, e.uuid) for p, e in sorted(self.partitions.items())}


class Manifest(msgspec.Struct, kw_only=True, frozen=True):
    format: str
    version: int
    name: str
    parent: str | None  # the backup this one's incrementals continue
    started: str  # ISO 8601, UTC
    finished: str
    keyspaces: dict[str, KeyspaceEntry]


class RepoMarker(msgspec.Struct, kw_only=True, frozen=True):
    format: str
    version: int
    created: str


def repo_error(path: Path, what: str, hint: str, **details: Any) -> ShardexError:
    """A repository problem, naming the path and what is wrong."""
    return ShardexError(
        f"backup repository {str(path)!r}: {what}",
        code=ErrorCode.BAD_REQUEST,
        details={"path": str(path), "hint": hint, **details},
    )


def corrupt(path: Path, what: str, **details: Any) -> ShardexError:
    return ShardexError(
        f"backup repository file {str(path)!r} is corrupt: {what}",
        code=ErrorCode.STORAGE_ERROR,
        details={
            "path": str(path),
            "hint": "restore from an earlier backup (`shardex backup list`), or take a new "
            "full backup into an empty repository",
            **details,
        },
    )


def _decode(path: Path, raw: bytes, kind: type[Any]) -> Any:
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise corrupt(path, f"not a valid {kind.__name__}: {exc}") from None


class Repo:
    """A backup repository on a local (or mounted) file system."""

    def __init__(self, path: Path) -> None:
        self.path = path

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path) -> Repo:
        """An existing repository; a missing, foreign or newer one is refused."""
        if not path.is_dir():
            raise repo_error(
                path,
                "no such directory",
                "take a backup into it first: shardex backup create --repo PATH",
            )
        marker = path / MARKER
        if not marker.is_file():
            raise repo_error(
                path,
                f"not a shardex backup repository (no {MARKER})",
                "name the directory `shardex backup create --repo` wrote, or an empty one",
            )
        m = _decode(marker, marker.read_bytes(), RepoMarker)
        if m.format != FORMAT:
            raise repo_error(
                path,
                f"{MARKER} names format {m.format!r}, not {FORMAT!r}",
                "this directory belongs to another tool; use an empty directory",
            )
        if m.version > VERSION:
            raise repo_error(
                path,
                f"format version {m.version} is newer than this shardex reads ({VERSION})",
                "use the shardex release that wrote the repository",
            )
        return cls(path)

    @classmethod
    def open_or_init(cls, path: Path, now: str) -> Repo:
        """The repository at ``path``, made there if the directory is missing or empty; a
        non-empty directory that is not one is refused (nothing is written into it)."""
        if path.exists() and not path.is_dir():
            raise repo_error(path, "is a file", "name a directory")
        if not (path / MARKER).exists():
            if path.is_dir() and any(path.iterdir()):
                raise repo_error(
                    path,
                    f"not empty and not a shardex backup repository (no {MARKER})",
                    "name an empty or new directory for a new repository",
                )
            path.mkdir(parents=True, exist_ok=True)
            marker = RepoMarker(format=FORMAT, version=VERSION, created=now)
            atomic_write_bytes(path / MARKER, msgspec.json.encode(marker) + b"\n")
        return cls.open(path)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The repository's write lock: one backup or restore writes here at a time."""
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise repo_error(
                    self.path,
                    "another backup or restore is using it",
                    "wait for it to finish (a crashed one releases the lock with its process)",
                ) from None
            yield
        finally:
            os.close(fd)

    # --- backups ---------------------------------------------------------------------------

    def backups(self) -> list[Manifest]:
        """Every finished backup, oldest first (by sequence number)."""
        root = self.path / BACKUPS
        if not root.is_dir():
            return []
        out: list[tuple[int, Manifest]] = []
        for d in root.iterdir():
            m = _NAME_RE.match(d.name)
            if m is None or not d.is_dir():
                continue
            out.append((int(m.group(1)), self.manifest(d)))
        out.sort(key=lambda t: t[0])
        return [m for _, m in out]

    def manifest(self, backup_dir: Path) -> Manifest:
        path = backup_dir / MANIFEST
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise corrupt(path, f"cannot be read ({exc.strerror})") from None
        m: Manifest = _decode(path, raw, Manifest)
        if m.format != FORMAT or m.name != backup_dir.name:
            raise corrupt(path, f"names format {m.format!r} and backup {m.name!r}")
        return m

    def find(self, name: str | None) -> Manifest:
        """Backup ``name`` (None: the newest)."""
        backups = self.backups()
        if not backups:
            raise repo_error(self.path, "holds no backup", "shardex backup create --repo PATH")
        if name is None:
            return backups[-1]
        for m in backups:
            if m.name == name:
                return m
        raise repo_error(
            self.path,
            f"has no backup {name!r}",
            "shardex backup list --repo PATH shows the backups",
            known=[m.name for m in backups],
        )

    def next_name(self, stamp: str) -> str:
        """The next backup's name: sequence number, then the UTC time (``stamp``)."""
        backups = self.backups()
        seq = int(backups[-1].name.split("-", 1)[0]) + 1 if backups else 1
        return f"{seq:04d}-{stamp}"

    def backup_dir(self, name: str) -> Path:
        return self.path / BACKUPS / name

    def tmp_dir(self, name: str) -> Path:
        return self.path / TMP / name

    def pending(self) -> list[Path]:
        """Backups under way (or left by a crash)."""
        root = self.path / TMP
        return sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []

    def publish(self, tmp: Path, manifest: Manifest) -> Path:
        """Write the manifest into ``tmp`` and rename it into ``backups/``: the backup
        exists whole from this rename on."""
        sync_filesystem(tmp)  # every partition file and entry, before the manifest names them
        atomic_write_bytes(tmp / MANIFEST, msgspec.json.format(msgspec.json.encode(manifest)))
        final = self.backup_dir(manifest.name)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        return final

    def restore_state_path(self, backup: str, keyspace: str, to_keyspace: str) -> Path:
        return self.path / RESTORES / f"{backup}--{keyspace}--{to_keyspace}.json"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- partition files ------------------------------------------------------------------------


def to_table(changes: Sequence[Change]) -> pa.Table:
    """Rows in the given order (seqno order within a partition)."""
    return pa.Table.from_arrays(
        [
            pa.array([c.docid for c in changes], pa.string()),
            pa.array([c.seqno for c in changes], pa.int64()),
            pa.array([c.cas for c in changes], pa.int64()),
            pa.array([c.op == OP_DELETE for c in changes], pa.bool_()),
            pa.array([None if c.op == OP_DELETE else c.body for c in changes], pa.binary()),
            pa.array([c.flags for c in changes], pa.int64()),
            pa.array([c.expiry for c in changes], pa.int64()),
        ],
        schema=SCHEMA,
    )


def write_partition(path: Path, changes: Sequence[Change]) -> tuple[int, str]:
    """Write one partition file; returns its (bytes, sha256). Not fsynced: ``publish``
    flushes the whole backup once (``sync_filesystem``), and a resumed backup checks the
    files it keeps against their entries (``intact``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(to_table(changes), tmp, compression="zstd")
    data = tmp.read_bytes()
    os.replace(tmp, path)
    return len(data), hashlib.sha256(data).hexdigest()


def write_replace(path: Path, data: bytes) -> None:
    """A small file replaced whole by a rename (not fsynced, as ``write_partition``)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def intact(backup_dir: Path, entry: PartitionEntry) -> bool:
    """Whether the entry's file is there with its recorded size and hash (a machine that
    lost power may have kept an entry but not all of its file)."""
    try:
        data = (backup_dir / entry.file).read_bytes()
    except OSError:
        return False
    return len(data) == entry.bytes and hashlib.sha256(data).hexdigest() == entry.sha256


def sync_filesystem(path: Path) -> None:
    """Flush every written file of ``path``'s file system to disk in one call (Linux
    ``syncfs``; ``sync`` elsewhere). A backup's dozens of files cost one flush instead of
    one fsync each (three per partition took 80% of a small incremental's time)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = getattr(libc, "syncfs", None)
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def read_partition(backup_dir: Path, entry: PartitionEntry) -> pa.Table:
    """A partition file's rows, checked against the manifest's size, hash and row count."""
    path = backup_dir / entry.file
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise corrupt(path, f"cannot be read ({exc.strerror})") from None
    if len(data) != entry.bytes:
        raise corrupt(path, f"{len(data)} bytes where the manifest says {entry.bytes}")
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise corrupt(path, "its SHA-256 differs from the manifest's")
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as exc:
        raise corrupt(path, f"not a readable Parquet file ({exc})") from None
    if not table.schema.equals(SCHEMA):
        raise corrupt(path, f"unexpected columns {table.schema.names}")
    if table.num_rows != entry.rows:
        raise corrupt(path, f"{table.num_rows} rows where the manifest says {entry.rows}")
    return table
