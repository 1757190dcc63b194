"""A private, throw-away PostgreSQL server for benchmarks (reused by the SQL benchmarks).

    with PostgresServer(settings={"synchronous_commit": "on"}) as pg:
        with pg.connect() as conn:
            conn.execute("select 1")

It uses the server binaries of the Debian package (``/usr/lib/postgresql/<major>/bin``),
installing the package with apt when they are missing (``ensure_binaries``; every step is
printed). Each server gets its own temp directory (data dir, unix socket dir, log), listens on
127.0.0.1 only on a free port, lets exactly one role in (trust, from 127.0.0.1/32 over TCP),
and is stopped and removed on exit: ``stop()`` runs from the context manager's ``finally``,
so also on Ctrl-C, and on SIGTERM too inside ``signals_raise()``.

PostgreSQL refuses to run as root, so when we are root the server commands run as an
unprivileged OS user (``postgres``, made by the package) through ``runuser``, and the temp
directory is handed to that user. As a normal user they run as ourselves.

Everything a benchmark must report is in ``PostgresServer.describe()``: the version, the
settings we passed (``settings``) and every setting whose value does not come from the
built-in default (queried from ``pg_settings`` after start).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

PG_ROOT = Path("/usr/lib/postgresql")
DEBIAN_PACKAGE = "postgresql"
SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
DEFAULT_OS_USER = "postgres"
DEFAULT_DB_USER = "bench"
DEFAULT_DBNAME = "postgres"

# What every private server gets, whatever the caller asks: loopback only, our socket dir.
# fsync and synchronous_commit are PostgreSQL's defaults; they are written out anyway so the
# durability a benchmark compared against is stated, not assumed.
BASE_SETTINGS: dict[str, str] = {
    "listen_addresses": "127.0.0.1",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    # Not ours to care about in a throw-away server; logged to the temp dir's server.log.
    "logging_collector": "off",
}

Log = Callable[[str], None]
_INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stderr(msg: str) -> None:
    print(f"[postgres] {msg}", file=sys.stderr, flush=True)


class PostgresError(RuntimeError):
    """The private server could not be found, installed, started or reached."""


# --- binaries ----------------------------------------------------------------------------


def _major_key(p: Path) -> tuple[int, str]:
    name = p.parent.parent.name  # /usr/lib/postgresql/<major>/bin/initdb
    return (int(name) if name.isdigit() else -1, name)


def find_binaries(root: Path = PG_ROOT) -> Path | None:
    """The ``bin`` directory of the newest installed major version that has all of
    ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    candidates = sorted(root.glob("*/bin/initdb"), key=_major_key, reverse=True)
    for initdb in candidates:
        bindir = initdb.parent
        if all(os.access(bindir / b, os.X_OK) for b in SERVER_BINARIES):
            return bindir
    return None


def ensure_binaries(*, install: bool = True, log: Log = _stderr, root: Path = PG_ROOT) -> Path:
    """Find the server binaries; if missing and ``install``, ``apt-get install -y postgresql``
    (as root, or through sudo). Raises ``PostgresError`` naming the package if impossible."""
    found = find_binaries(root)
    if found is not None:
        return found
    hint = f"install the Debian package {DEBIAN_PACKAGE!r} (apt-get install -y {DEBIAN_PACKAGE})"
    if not install:
        raise PostgresError(f"PostgreSQL server binaries not found under {root}/*/bin: {hint}")
    if shutil.which("apt-get") is None:
        raise PostgresError(f"PostgreSQL not found under {root}, no apt-get to install it: {hint}")
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise PostgresError(f"PostgreSQL not found, and installing needs root: {hint}")
        prefix = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        [*prefix, "apt-get", "update", "-q"],
        [*prefix, "apt-get", "install", "-y", "-q", DEBIAN_PACKAGE],
    ):
        log(f"PostgreSQL server binaries not found under {root}; running: {' '.join(cmd)}")
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            tail = proc.stdout.decode(errors="replace")[-2000:]
            raise PostgresError(f"{' '.join(cmd)} failed ({proc.returncode}): {hint}\n{tail}")
    found = find_binaries(root)
    if found is None:
        raise PostgresError(f"installed {DEBIAN_PACKAGE!r} but found no server under {root}")
    log(f"installed {DEBIAN_PACKAGE}; using {found}")
    return found


# --- pure pieces (tested without a server) -----------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the kernel's pick; a race is possible, which
    ``PostgresServer.start`` handles by retrying on a bind failure)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def render_conf(settings: Mapping[str, str | int | float | bool]) -> str:
    """``postgresql.conf`` lines for ``settings``, every value quoted (valid for any type)."""
    lines = [
        "# written by bench/common/postgres.py; later lines win over the initdb defaults above"
    ]
    for key, value in settings.items():
        if not key.replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"bad setting name {key!r}")
        text = ("on" if value else "off") if isinstance(value, bool) else str(value)
        lines.append(f"{key} = {_quote(text)}")
    return "\n".join(lines) + "\n"


def render_hba(db_user: str, *, replication: bool = False) -> str:
    """``pg_hba.conf``: one role, trust, TCP from 127.0.0.1 only; nothing else (no unix
    socket, no other address, no other role). ``replication``: that role may also open
    replication connections (``all`` does not cover them), for a standby on this machine."""
    if not db_user.replace("_", "").isalnum():
        raise ValueError(f"bad role name {db_user!r}")
    text = (
        "# written by bench/common/postgres.py: a private benchmark server, loopback TCP only\n"
        "# TYPE  DATABASE  USER  ADDRESS  METHOD\n"
        f"host    all       {db_user}  127.0.0.1/32  trust\n"
    )
    if replication:
        text += f"host    replication  {db_user}  127.0.0.1/32  trust\n"
    return text


def server_settings(
    port: int, socket_dir: Path, extra: Mapping[str, str | int | float | bool] | None = None
) -> dict[str, str]:
    """The full set of settings written to the config: base + port/socket dir + ``extra``."""
    out = dict(BASE_SETTINGS)
    out["port"] = str(port)
    out["unix_socket_directories"] = str(socket_dir)
    for k, v in (extra or {}).items():
        out[k] = ("on" if v else "off") if isinstance(v, bool) else str(v)
    if out["listen_addresses"] != "127.0.0.1":
        raise ValueError("a private benchmark server listens on 127.0.0.1 only")
    return out


def run_as_prefix(os_user: str | None) -> list[str]:
    """The command prefix that runs a server command as ``os_user`` (None: as ourselves)."""
    if os_user is None:
        return []
    if shutil.which("runuser"):
        return ["runuser", "-u", os_user, "--"]
    if shutil.which("setpriv"):
        pw = pwd.getpwnam(os_user)
        return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups"]
    raise PostgresError("running as root, and neither runuser nor setpriv is available")


def default_os_user() -> str | None:
    """Root: the package's unprivileged ``postgres`` user (PostgreSQL refuses root).
    Anyone else: None, run as ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(DEFAULT_OS_USER)
    except KeyError:
        raise PostgresError(
            f"running as root and there is no {DEFAULT_OS_USER!r} OS user to run PostgreSQL "
            f"as (the Debian package {DEBIAN_PACKAGE!r} creates it; reinstall it, or run the "
            "benchmark as a normal user)"
        ) from None
    return DEFAULT_OS_USER


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Inside: SIGINT, SIGTERM and SIGHUP raise ``KeyboardInterrupt``, so every
    ``finally`` (stopping servers, removing temp dirs) runs. Main thread only; elsewhere a
    no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    # SIGINT too: it may have come in ignored (a background job of a non-interactive shell).
    old = {s: signal.signal(s, handler) for s in _INTERRUPTS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def no_interrupts() -> Iterator[None]:
    """Hold off Ctrl-C/SIGTERM/SIGHUP while cleaning up, so a second one cannot leave a
    server behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in _INTERRUPTS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# --- the server --------------------------------------------------------------------------


class PostgresServer:
    """One private PostgreSQL server in a temp dir. ``start()``/``stop()`` or ``with``."""

    def __init__(
        self,
        settings: Mapping[str, str | int | float | bool] | None = None,
        *,
        base_dir: str | Path | None = None,
        db_user: str = DEFAULT_DB_USER,
        dbname: str = DEFAULT_DBNAME,
        os_user: str | bool | None = True,
        install: bool = True,
        log: Log = _stderr,
        start_timeout: float = 60.0,
        replication: bool = False,
    ) -> None:
        """``settings``: extra postgresql.conf settings (override the base ones).
        ``base_dir``: where the temp dir goes (default: the system temp dir); put it on the
        same file system as what you compare against. ``os_user``: True = decide
        (``postgres`` when root, else ourselves), None = ourselves, or a user name.
        ``replication``: ``db_user`` may also connect for replication (a standby's
        ``pg_basebackup`` and WAL stream, ``bench/common/pg_standby.py``)."""
        self.extra_settings = dict(settings or {})
        self.replication = replication
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.db_user = db_user
        self.dbname = dbname
        self._os_user_choice = os_user
        self.install = install
        self.log = log
        self.start_timeout = start_timeout
        self.bindir: Path | None = None
        self.os_user: str | None = None
        self.tmp: Path | None = None
        self.port: int | None = None
        self.settings: dict[str, str] = {}
        self.version: str | None = None
        self.non_default_settings: dict[str, str] = {}
        self._started = False

    # paths
    @property
    def data_dir(self) -> Path:
        assert self.tmp is not None, "not started"
        return self.tmp / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.tmp is not None, "not started"
        return self.tmp / "sock"

    @property
    def log_file(self) -> Path:
        assert self.tmp is not None, "not started"
        return self.tmp / "server.log"

    def conninfo(self) -> str:
        assert self.port is not None, "not started"
        return f"host=127.0.0.1 port={self.port} user={self.db_user} dbname={self.dbname}"

    # lifecycle
    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self, args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [*run_as_prefix(self.os_user), *args]
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.tmp,  # a cwd the server user can enter
        )
        if check and proc.returncode != 0:
            raise PostgresError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                + self._log_tail()
            )
        return proc

    def _log_tail(self) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except (OSError, AssertionError):
            return ""
        return f"\n--- server log ({self.log_file}) ---\n{text[-3000:]}"

    def start(self) -> None:
        """initdb, write config, ``pg_ctl start -w``; on any failure stop and clean up."""
        if self._started:
            return
        self._started = True  # stop() cleans up whatever part of start() happened
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.bindir = ensure_binaries(install=self.install, log=self.log)
        choice = self._os_user_choice
        if choice is True:
            self.os_user = default_os_user()
        elif isinstance(choice, str):
            self.os_user = choice
        else:
            self.os_user = None
        if self.base_dir is not None:
            self.base_dir.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="shardex-pg-", dir=self.base_dir))
        self.socket_dir.mkdir()
        if self.os_user is not None:
            pw = pwd.getpwnam(self.os_user)
            for p in (self.tmp, self.socket_dir):
                os.chown(p, pw.pw_uid, pw.pw_gid)
            # The server user must also reach the temp dir through its parents.
            if self._run(["test", "-w", str(self.tmp)], check=False).returncode != 0:
                raise PostgresError(
                    f"OS user {self.os_user!r} cannot write {self.tmp}: a parent directory "
                    "is not searchable by it (chmod o+x, or choose another base_dir)"
                )
        self._init_data_dir()
        (self.data_dir / "pg_hba.conf").write_text(
            render_hba(self.db_user, replication=self.replication)
        )
        last: PostgresError | None = None
        for _attempt in range(3):
            self.port = free_port()
            self.settings = server_settings(self.port, self.socket_dir, self.extra_settings)
            conf = self.data_dir / "postgresql.conf"
            base = conf.read_text().split("# written by bench/common/postgres.py", 1)[0]
            conf.write_text(base + render_conf(self.settings))
            if self.os_user is not None:
                pw = pwd.getpwnam(self.os_user)
                for p in (conf, self.data_dir / "pg_hba.conf"):
                    os.chown(p, pw.pw_uid, pw.pw_gid)
            proc = self._run(
                [
                    str(self.bindir / "pg_ctl"),
                    "start",
                    "-w",
                    "-t",
                    str(int(self.start_timeout)),
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_file),
                ],
                check=False,
            )
            if proc.returncode == 0:
                break
            last = PostgresError(
                f"pg_ctl start failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
                + self._log_tail()
            )
            if "could not bind" not in self._log_tail():
                raise last
            self.log(f"port {self.port} was taken meanwhile; retrying on another")
        else:
            assert last is not None
            raise last
        self.log(f"started on 127.0.0.1:{self.port} ({self.tmp})")
        self._describe_from_server()

    def _init_data_dir(self) -> None:
        """Make the data dir (here: ``initdb``; a standby copies its primary's)."""
        assert self.bindir is not None
        self.log(
            f"initdb {self.data_dir} (server {self.bindir.parent.name}, os user "
            f"{self.os_user or 'self'})"
        )
        # --no-sync: the data dir is thrown away; it only skips initdb's final fsync of its
        # own files and has nothing to do with the server's fsync/synchronous_commit.
        self._run([
            str(self.bindir / "initdb"),
            "-D", str(self.data_dir),
            "-U", self.db_user,
            "--auth=trust",
            "-E", "UTF8",
            "--no-locale",
            "--no-sync",
        ])  # fmt: skip

    def _describe_from_server(self) -> None:
        with self.connect() as conn:
            row = conn.execute("show server_version").fetchone()
            self.version = str(row[0]) if row else None
            rows = conn.execute(
                "select name, current_setting(name) from pg_settings "
                "where source not in ('default', 'override', 'client', 'session') "
                "order by name"
            ).fetchall()
        self.non_default_settings = {str(name): str(value) for name, value in rows}

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A psycopg 3 connection over TCP to 127.0.0.1 (autocommit unless told)."""
        try:
            import psycopg
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise PostgresError(
                "psycopg 3 is not installed: pip install 'psycopg[binary]' (the dev extra)"
            ) from e
        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.conninfo(), **kwargs)

    def stop(self) -> None:
        """``pg_ctl stop -m fast`` (then immediate, then SIGKILL), remove the temp dir.
        Idempotent; safe after a failed or partial start."""
        if not self._started:
            return
        self._started = False
        with no_interrupts():
            try:
                self._stop_server()
            finally:
                if self.tmp is not None:
                    shutil.rmtree(self.tmp, ignore_errors=True)
                    self.log(f"stopped and removed {self.tmp}")
                    self.tmp = None

    def _stop_server(self) -> None:
        if self.tmp is None or self.bindir is None:
            return
        pidfile = self.data_dir / "postmaster.pid"
        if not pidfile.exists():
            return
        for mode in ("fast", "immediate"):
            proc = self._run(
                [
                    str(self.bindir / "pg_ctl"),
                    "stop",
                    "-w",
                    "-t",
                    "20",
                    "-m",
                    mode,
                    "-D",
                    str(self.data_dir),
                ],
                check=False,
            )
            if proc.returncode == 0 or not pidfile.exists():
                return
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(pidfile.read_text().splitlines()[0])
            os.kill(pid, signal.SIGKILL)
            self.log(f"pg_ctl stop failed; killed postmaster {pid}")
            time.sleep(0.5)

    def postmaster_pid(self) -> int | None:
        """The running server's postmaster pid (its first line of ``postmaster.pid``)."""
        try:
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError, AssertionError):
            return None

    def describe(self) -> dict[str, Any]:
        """What a benchmark's JSON should state about this server."""
        return {
            "server_version": self.version,
            "binaries": str(self.bindir) if self.bindir else None,
            "os_user": self.os_user,
            "settings_passed": dict(self.settings),
            "non_default_settings": dict(self.non_default_settings),
            "auth": f"trust for role {self.db_user!r} from 127.0.0.1/32 over TCP only",
        }
