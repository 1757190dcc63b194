"""A synchronous streaming standby of a private PostgreSQL server, on this machine.

    primary = PostgresServer(settings=sync_primary_settings(), replication=True)
    with primary, StandbyServer(primary) as standby:
        standby.wait_sync()
        ...  # every commit at synchronous_commit >= remote_write waits for the standby

The standby is a ``PostgresServer`` whose data dir is a ``pg_basebackup`` of the primary
(streamed WAL, a fast checkpoint) instead of an ``initdb``, in its own temp dir beside the
primary's; it follows the primary over loopback TCP with ``application_name`` = its name,
which the primary's ``synchronous_standby_names`` names, so it is the synchronous standby.
Same OS user, same settings, stopped and removed like any private server.
"""

from __future__ import annotations

import time
from typing import Any

from bench.common.postgres import PostgresError, PostgresServer

__all__ = ["STANDBY_NAME", "StandbyServer", "sync_primary_settings"]

STANDBY_NAME = "standby1"


def sync_primary_settings(standby: str = STANDBY_NAME) -> dict[str, str]:
    """The primary's settings for one synchronous standby named ``standby``. ``FIRST 1``:
    exactly that standby must confirm; ``wal_level`` and ``max_wal_senders`` are written out
    (PostgreSQL's defaults) because the standby depends on them."""
    if not standby.replace("_", "").isalnum():
        raise ValueError(f"bad standby name {standby!r}")
    return {
        "wal_level": "replica",
        "max_wal_senders": "4",
        "synchronous_standby_names": f"FIRST 1 ({standby})",
    }


def standby_conninfo(primary: PostgresServer, name: str) -> str:
    """How the standby reaches the primary: loopback TCP, the primary's role, ``name`` as
    the application name ``synchronous_standby_names`` matches."""
    assert primary.port is not None, "primary not started"
    return f"host=127.0.0.1 port={primary.port} user={primary.db_user} application_name={name}"


class StandbyServer(PostgresServer):
    """A hot standby of ``primary`` (started, with ``replication=True``), streaming from it."""

    def __init__(self, primary: PostgresServer, name: str = STANDBY_NAME, **kwargs: Any) -> None:
        settings = {
            k: v for k, v in primary.extra_settings.items() if k != "synchronous_standby_names"
        }
        settings.update(hot_standby="on", primary_conninfo=standby_conninfo(primary, name))
        kwargs.setdefault("base_dir", primary.base_dir)
        kwargs.setdefault("os_user", primary.os_user)
        kwargs.setdefault("log", primary.log)
        super().__init__(settings, db_user=primary.db_user, dbname=primary.dbname, **kwargs)
        self.primary = primary
        self.name = name

    def _init_data_dir(self) -> None:
        assert self.bindir is not None and self.primary.port is not None
        self.log(f"pg_basebackup of 127.0.0.1:{self.primary.port} into {self.data_dir}")
        # No -R: its primary_conninfo in postgresql.auto.conf would override ours (which
        # carries the application name); standby.signal is written below instead.
        self._run([
            str(self.bindir / "pg_basebackup"),
            "-h", "127.0.0.1",
            "-p", str(self.primary.port),
            "-U", self.primary.db_user,
            "-D", str(self.data_dir),
            "-X", "stream",
            "-c", "fast",
            "--no-sync",  # thrown away; the server's own fsync settings are untouched
        ])  # fmt: skip
        self._run(["touch", str(self.data_dir / "standby.signal")])

    def wait_sync(self, timeout: float = 60.0) -> dict[str, str]:
        """Wait until the primary streams to this standby as its synchronous one; returns
        the primary's ``pg_stat_replication`` row for it."""
        deadline = time.monotonic() + timeout
        last: Any = None
        with self.primary.connect() as conn:
            while True:
                last = conn.execute(
                    "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (self.name,),
                ).fetchone()
                if last is not None and tuple(last) == ("streaming", "sync"):
                    return {"state": str(last[0]), "sync_state": str(last[1])}
                if time.monotonic() > deadline:
                    raise PostgresError(
                        f"standby {self.name!r} not the synchronous standby after {timeout:g} s "
                        f"(pg_stat_replication: {last!r})" + self._log_tail()
                    )
                time.sleep(0.1)
