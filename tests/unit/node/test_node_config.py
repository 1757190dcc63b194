"""Node configuration: TOML + flag precedence, and a clear ConfigError for every bad value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardex.errors import ConfigError, ErrorCode
from shardex.meta.node_defaults import (
    ALL_SERVICES,
    DEFAULT_EXPIRY_PAGER_BATCH,
    DEFAULT_EXPIRY_PAGER_INTERVAL,
    HTTP_PORT_OFFSET,
)
from shardex.node.config import DEFAULT_MAX_CONNECTIONS, load_config
from shardex.runtime.admission import DEFAULT_QUEUED
from shardex.sql.exec.memory import DEFAULT_QUERY_MEMORY

SECRET = "0123456789abcdef0123456789abcdef"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def base(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {"name": "n1", "data_dir": str(tmp_path / "d"), "secret": SECRET, **kw}


def bad(tmp_path: Path, **kw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(None, base(tmp_path, **kw))
    assert info.value.code == ErrorCode.CONFIG_ERROR
    return info.value


def test_defaults(tmp_path: Path) -> None:
    cfg = load_config(None, base(tmp_path))
    assert cfg.name == "n1" and cfg.data_dir == (tmp_path / "d").absolute()
    assert cfg.port == 7100 and cfg.address == "127.0.0.1:7100"
    assert cfg.http_port == 7100 + HTTP_PORT_OFFSET  # the query service's, derived
    assert cfg.services == ALL_SERVICES and cfg.runs_manager
    assert cfg.seeds == () and cfg.log_level == "INFO"
    assert cfg.heartbeat_interval == 0.5 and cfg.failure_timeout == 3.0
    assert SECRET not in repr(cfg)  # never in logs or tracebacks


def test_the_http_port_derives_from_the_port_unless_given(tmp_path: Path) -> None:
    assert load_config(None, base(tmp_path, port=7300)).http_port == 7300 + HTTP_PORT_OFFSET
    assert load_config(None, base(tmp_path, port=0)).http_port == 0  # a free one, as port's
    assert load_config(None, base(tmp_path, port=65000)).http_port == 0  # past 65535
    assert load_config(None, base(tmp_path, http_port="9000")).http_port == 9000
    assert load_config(None, base(tmp_path, http_port="off")).http_port is None
    assert "'http_port'" in str(bad(tmp_path, http_port="none"))


def test_file_then_flags_override(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    write(tmp_path / "etc" / "s", SECRET + "\n").chmod(0o600)
    f = write(
        tmp_path / "etc" / "node.toml",
        """
name = "a"
data_dir = "data"            # relative to this file
port = 7200
http_port = 8200
services = ["manager", "data", "data"]
seed = "127.0.0.1:7100"
secret_file = "s"
log_level = "debug"
heartbeat_interval = 0.25
failure_timeout = 2
""",
    )
    cfg = load_config(f)
    assert cfg.name == "a" and cfg.data_dir == tmp_path / "etc" / "data"
    assert (cfg.port, cfg.http_port) == (7200, 8200)
    assert cfg.services == ("data", "manager")  # canonical order, deduplicated
    assert cfg.seeds == ("127.0.0.1:7100",)
    assert cfg.secret == SECRET and cfg.log_level == "DEBUG"
    assert (cfg.heartbeat_interval, cfg.failure_timeout) == (0.25, 2.0)

    cfg = load_config(
        f,
        {
            "name": "b",
            "port": 7300,
            "services": "query,index",
            "seed": ["127.0.0.1:1", "127.0.0.1:2"],
            "secret": "f" * 20,  # a flag secret replaces the file's secret_file
            "data_dir": "rel",  # flags are relative to the working directory
            "heartbeat_interval": None,  # None means "flag not given"
        },
    )
    assert (cfg.name, cfg.port, cfg.services) == ("b", 7300, ("index", "query"))
    assert cfg.seeds == ("127.0.0.1:1", "127.0.0.1:2")
    assert cfg.secret == "f" * 20 and cfg.heartbeat_interval == 0.25
    assert cfg.data_dir == Path("rel").absolute()


def test_node_table_is_accepted(tmp_path: Path) -> None:
    f = write(tmp_path / "n.toml", f'[node]\nname = "t"\ndata_dir = "x"\nsecret = "{SECRET}"\n')
    assert load_config(f).name == "t"


def test_no_secret_refuses_with_hint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {"name": "n1", "data_dir": str(tmp_path)})
    e = info.value
    assert "secret" in e.message and e.details["key"] == "secret"
    assert "--secret-file" in e.details["hint"]


def test_secret_problems(tmp_path: Path) -> None:
    e = bad(tmp_path, secret="tiny-pw")
    assert e.details["key"] == "secret" and "16" in e.message
    assert "tiny-pw" not in str(e)  # the (bad) secret itself is never echoed
    e = bad(tmp_path, secret=None, secret_file=str(tmp_path / "missing"))
    assert e.details["key"] == "secret_file" and "missing" in e.message
    f = write(tmp_path / "c.toml", f'name="n"\ndata_dir="d"\nsecret="{SECRET}"\nsecret_file="s"\n')
    with pytest.raises(ConfigError, match="both secret and secret_file"):
        load_config(f)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("port", 70000, "out of range"),
        ("port", -1, "out of range"),
        ("port", "abc", "not an integer"),
        ("port", True, "not an integer"),
        ("http_port", 7100, "same as port"),
        ("http_port", 70000, "out of range"),
        ("services", "data,cache", "unknown service"),
        ("services", [], "no service"),
        ("services", 3, "not a string or a list"),
        ("seed", "localhost", "not a host:port"),
        ("seed", "127.0.0.1:0", "port 0"),
        ("name", "bad name!", "not a valid node name"),
        ("name", "", "not a valid node name"),
        ("log_level", "LOUD", "unknown log level"),
        ("heartbeat_interval", 0, "positive"),
        ("heartbeat_interval", "fast", "not a number"),
        ("failure_timeout", float("nan"), "positive"),
        ("failure_timeout", 0.9, "at least twice heartbeat_interval"),
        ("data_dir", "", "not a path"),
    ],
)
def test_bad_values_name_key_value_and_hint(
    tmp_path: Path, key: str, value: Any, fragment: str
) -> None:
    e = bad(tmp_path, **{key: value})
    assert e.details["key"] == key
    assert fragment in e.message
    assert e.details["hint"]
    assert key in str(e)


def test_unknown_key_lists_valid_keys(tmp_path: Path) -> None:
    f = write(tmp_path / "c.toml", f'name="n"\ndata_dir="d"\nsecret="{SECRET}"\nprot=1\n')
    with pytest.raises(ConfigError) as info:
        load_config(f)
    assert info.value.details["key"] == "prot" and "port" in info.value.details["hint"]


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(write(tmp_path / "c.toml", "name = \n"))
    assert info.value.details["key"] == "config"
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_data_dir_that_is_a_file(tmp_path: Path) -> None:
    write(tmp_path / "f", "")
    e = bad(tmp_path, data_dir=str(tmp_path / "f"))
    assert "not a directory" in e.message


def test_string_numbers_from_the_command_line(tmp_path: Path) -> None:
    cfg = load_config(None, base(tmp_path, port="7001", heartbeat_interval="0.1"))
    assert cfg.port == 7001 and cfg.heartbeat_interval == 0.1


def test_group_label(tmp_path: Path) -> None:
    assert load_config(None, base(tmp_path)).group == ""  # no group
    assert load_config(None, base(tmp_path, group="rack-1")).group == "rack-1"
    cfg_file = write(tmp_path / "n.toml", f'name = "n1"\ndata_dir = "d"\nsecret = "{SECRET}"\n')
    assert load_config(cfg_file, {"group": "zone_a"}).group == "zone_a"
    for value in ("has space", "-lead", "x" * 33, 3):
        err = bad(tmp_path, group=value)
        assert err.details["key"] == "group" and err.details["value"] == value
        assert "letters" in err.details["hint"]


def test_sql_admission_limits(tmp_path: Path) -> None:
    cfg = load_config(None, base(tmp_path))
    assert cfg.sql_max_running is None and cfg.sql_max_queued == DEFAULT_QUEUED  # per CPU
    assert cfg.sql_max_fragments is None
    cfg = load_config(
        None, base(tmp_path, sql_max_running="3", sql_max_queued=0, sql_max_fragments=7)
    )
    assert (cfg.sql_max_running, cfg.sql_max_queued, cfg.sql_max_fragments) == (3, 0, 7)
    for key, value in (
        ("sql_max_running", 0),
        ("sql_max_queued", -1),
        ("sql_max_running", "x"),
        ("sql_max_fragments", 0),
    ):
        err = bad(tmp_path, **{key: value})
        assert err.details["key"] == key and err.details["value"] == value
        assert "SQL statements" in err.details["hint"]
    assert cfg.max_connections == DEFAULT_MAX_CONNECTIONS
    assert load_config(None, base(tmp_path, max_connections=5)).max_connections == 5
    err = bad(tmp_path, max_connections=0)
    assert err.details["key"] == "max_connections" and "nodes'" in err.details["hint"]


def test_sql_memory_settings(tmp_path: Path) -> None:
    cfg = load_config(None, base(tmp_path))
    assert cfg.sql_query_memory == DEFAULT_QUERY_MEMORY and cfg.sql_node_memory is None
    assert cfg.sql_spill is True
    cfg = load_config(
        None,
        base(tmp_path, sql_query_memory="64MiB", sql_node_memory="2 GiB", sql_spill="false"),
    )
    assert (cfg.sql_query_memory, cfg.sql_node_memory) == (64 << 20, 2 << 30)
    assert cfg.sql_spill is False
    assert load_config(None, base(tmp_path, sql_node_memory=1 << 30)).sql_node_memory == 1 << 30
    for key, value, words in (
        ("sql_query_memory", "lots", "not a size"),
        ("sql_query_memory", 1000, "out of range"),
        ("sql_node_memory", "1MiB", "less than sql_query_memory"),
        ("sql_spill", "maybe", "not a boolean"),
    ):
        err = bad(tmp_path, **{key: value})
        assert err.details["key"] == key and words in err.message, (key, value)


def test_expiry_pager_settings(tmp_path: Path) -> None:
    cfg = load_config(None, base(tmp_path))
    assert cfg.expiry_pager_interval == DEFAULT_EXPIRY_PAGER_INTERVAL
    assert cfg.expiry_pager_batch == DEFAULT_EXPIRY_PAGER_BATCH
    cfg = load_config(None, base(tmp_path, expiry_pager_interval="0.5", expiry_pager_batch=100))
    assert (cfg.expiry_pager_interval, cfg.expiry_pager_batch) == (0.5, 100)
    for key, value in (("expiry_pager_interval", 0), ("expiry_pager_batch", 0)):
        err = bad(tmp_path, **{key: value})
        assert err.details["key"] == key and "expiry pager" in err.details["hint"]


@pytest.mark.parametrize("key", ["name", "group"])
def test_newline_suffixed_names_are_refused(tmp_path: Path, key: str) -> None:
    # ``$`` matches before a final newline: the check must cover the whole string.
    e = bad(tmp_path, **{key: "n1\n"})
    assert e.details["key"] == key and e.details["value"] == "n1\n" and e.details["hint"]


def test_host_and_advertise(tmp_path: Path) -> None:
    cfg = load_config(None, base(tmp_path, host="10.0.0.5", tls="off"))
    assert (cfg.host, cfg.advertise) == ("10.0.0.5", "10.0.0.5")  # advertise defaults to host
    assert cfg.address == cfg.advertise_address == "10.0.0.5:7100"
    cfg = load_config(
        None, base(tmp_path, host="0.0.0.0", advertise="db1.example.net", port=7200, tls="off")
    )
    assert cfg.address == "0.0.0.0:7200" and cfg.advertise_address == "db1.example.net:7200"


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
def test_wildcard_cannot_be_advertised(tmp_path: Path, wildcard: str) -> None:
    e = bad(tmp_path, host=wildcard)  # advertise defaults to host: say it must be given
    assert e.details["key"] == "advertise" and "advertise must be given" in e.message
    e = bad(tmp_path, host=wildcard, advertise=wildcard)
    assert e.details["key"] == "advertise" and "wildcard" in e.message and e.details["hint"]


@pytest.mark.parametrize("key", ["host", "advertise"])
@pytest.mark.parametrize("value", ["", "a b", "h\n", "10.0.0.1:7100/x", 7])
def test_bad_hosts_are_refused(tmp_path: Path, key: str, value: Any) -> None:
    e = bad(tmp_path, **{key: value})
    assert e.details["key"] == key and e.details["hint"]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_secret_file_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    secret = write(tmp_path / "secret", SECRET + "\n")
    secret.chmod(mode)
    e = bad(tmp_path, secret=None, secret_file=str(secret))
    assert e.details["key"] == "secret_file" and e.details["mode"] == f"{mode:04o}"
    assert e.details["hint"] == f"chmod 600 {secret}" and str(secret) in e.message
    secret.chmod(0o600)
    assert load_config(None, base(tmp_path, secret=None, secret_file=str(secret))).secret == SECRET
