"""The benchmark PostgreSQL harness (bench/common/postgres.py) and the data service benchmark's pure
pieces. Only the ``slow`` test starts a real server (run with ``-m slow``)."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
from bench.common import postgres as pgh
from bench.common.dataset import doc_sizes, make_docs
from bench.common.local_cluster import free_base_port, ports_free
from bench.common.runner import percentile

from bench import data_service as ds


def test_render_conf_quotes_every_value_and_renders_bools() -> None:
    text = pgh.render_conf({"fsync": True, "port": 5433, "unix_socket_directories": "/t/it's"})
    lines = text.splitlines()
    assert lines[0].startswith("# written by bench/common/postgres.py")
    assert "fsync = 'on'" in lines
    assert "port = '5433'" in lines
    assert "unix_socket_directories = '/t/it''s'" in lines


def test_render_conf_rejects_bad_names() -> None:
    with pytest.raises(ValueError):
        pgh.render_conf({"fsync = off\nport": "1"})


def test_render_hba_is_one_role_from_loopback_only() -> None:
    rules = [
        line.split()
        for line in pgh.render_hba("bench").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules == [["host", "all", "bench", "127.0.0.1/32", "trust"]]
    with pytest.raises(ValueError):
        pgh.render_hba("x all 0.0.0.0/0")


def test_server_settings_are_durable_loopback_and_stated(tmp_path: Path) -> None:
    s = pgh.server_settings(6543, tmp_path, {"shared_buffers": "256MB", "jit": False})
    assert s["listen_addresses"] == "127.0.0.1"
    assert s["fsync"] == "on" and s["synchronous_commit"] == "on"
    assert s["port"] == "6543"
    assert s["unix_socket_directories"] == str(tmp_path)
    assert s["shared_buffers"] == "256MB" and s["jit"] == "off"
    # A caller may relax durability, but then it is written out (and so reported).
    assert pgh.server_settings(1, tmp_path, {"synchronous_commit": "off"})["synchronous_commit"]
    with pytest.raises(ValueError):
        pgh.server_settings(1, tmp_path, {"listen_addresses": "*"})


def test_free_port_is_bindable_on_loopback() -> None:
    port = pgh.free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def _fake_bin(root: Path, major: str, names: tuple[str, ...]) -> Path:
    d = root / major / "bin"
    d.mkdir(parents=True)
    for n in names:
        (d / n).write_text("#!/bin/sh\n")
        (d / n).chmod(0o755)
    return d


def test_find_binaries_picks_the_newest_complete_major(tmp_path: Path) -> None:
    assert pgh.find_binaries(tmp_path) is None
    _fake_bin(tmp_path, "9", pgh.SERVER_BINARIES)
    want = _fake_bin(tmp_path, "15", pgh.SERVER_BINARIES)
    _fake_bin(tmp_path, "16", ("initdb", "pg_ctl"))  # no postgres: incomplete, skipped
    assert pgh.find_binaries(tmp_path) == want


def test_missing_binaries_without_install_name_the_package(tmp_path: Path) -> None:
    with pytest.raises(pgh.PostgresError, match="apt-get install -y postgresql"):
        pgh.ensure_binaries(install=False, root=tmp_path)


def test_run_as_prefix() -> None:
    assert pgh.run_as_prefix(None) == []
    prefix = pgh.run_as_prefix("postgres")
    assert prefix[0] in ("runuser", "setpriv")


def test_stop_before_start_is_a_no_op() -> None:
    pgh.PostgresServer().stop()


def test_signals_raise_turns_sigterm_into_keyboard_interrupt() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), pgh.signals_raise():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler's exception interrupts this
    assert signal.getsignal(signal.SIGTERM) is before


def test_documents_are_deterministic_and_about_half_to_one_kb() -> None:
    a, _ = make_docs(300, seed=7)
    b, _ = make_docs(300, seed=7)
    assert a == b
    assert len({docid for docid, _ in a}) == 300
    sizes = doc_sizes(a)
    assert sizes["min_bytes"] >= 400 and sizes["max_bytes"] <= 1200
    doc = a[0][1]
    assert isinstance(doc["address"], dict) and isinstance(doc["tags"], list)


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0


def test_ratios_say_which_way_is_better() -> None:
    sx, pg = ds.Figures("shardex 1 node"), ds.Figures("postgresql")
    batched = f"batched upsert ({ds.BATCH}/batch)"
    for fig, tput, p50 in ((sx, 2000.0, 0.5), (pg, 1000.0, 0.25)):
        fig.add("single upsert", {"ops_per_s": tput, "p50_ms": p50})
        fig.add(batched, {"ops_per_s": tput})
        fig.add("point get", {"p50_ms": p50, "p99_ms": p50})
    rows = {r["metric"]: r for r in ds.ratios(sx, pg, ds.BATCH)}
    assert rows["single upsert docs/s"]["shardex/pg"] == 2.0
    assert rows["single upsert docs/s"]["reads"] == "shardex better"
    assert rows["point get p50 ms"]["shardex/pg"] == 2.0
    assert rows["point get p50 ms"]["reads"] == "postgresql better"


def test_free_base_port_leaves_room_for_http_ports() -> None:
    base = free_base_port(3, 1000)
    assert ports_free([base, base + 1, base + 2, base + 1000, base + 1002])


@pytest.mark.slow
def test_real_server_starts_durable_on_loopback_and_cleans_up() -> None:
    if pgh.find_binaries() is None:
        pytest.skip("PostgreSQL server binaries absent: apt-get install -y postgresql")
    server = pgh.PostgresServer(install=False)
    with server:
        tmp, port = server.tmp, server.port
        assert tmp is not None and tmp.exists()
        with server.connect() as conn:
            conn.execute("CREATE TABLE docs (id text PRIMARY KEY, body jsonb)")
            from psycopg.types.json import Jsonb

            conn.execute("INSERT INTO docs VALUES (%s, %s)", ("a", Jsonb({"x": [1, {"y": 2}]})))
            row = conn.execute("SELECT body FROM docs WHERE id = 'a'").fetchone()
            assert row is not None and row[0] == {"x": [1, {"y": 2}]}
            shown = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in ("fsync", "synchronous_commit", "listen_addresses")
            }
        assert shown == {"fsync": "on", "synchronous_commit": "on", "listen_addresses": "127.0.0.1"}
        info = server.describe()
        assert info["non_default_settings"]["synchronous_commit"] == "on"
        assert info["server_version"]
    assert not tmp.exists()
    with socket.socket() as s:  # the server is gone: nothing listens on its port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT may remain
        s.bind(("127.0.0.1", port))
