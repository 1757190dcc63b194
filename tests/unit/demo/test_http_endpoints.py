"""The demo's closing lines: the console, metrics and query service URLs of a cluster
directory, and a curl command that a shell runs as printed (the password read from its
file, never printed)."""

from __future__ import annotations

import shlex
from pathlib import Path

from shardex.demo.http_endpoints import endpoints
from shardex.meta import cluster_dir as cdir


def test_urls_and_curl_of_a_cluster_dir(tmp_path: Path) -> None:
    spec = cdir.create(tmp_path, nodes=3, base_port=21000)
    ports = [n.http_port for n in spec.nodes]
    assert len(set(ports)) == 3
    stmt = 'SELECT RAW name FROM users WHERE city = "Oslo"'
    where = endpoints(tmp_path, stmt)
    assert where["console"] == f"http://127.0.0.1:{ports[0]}/ui/"
    assert where["metrics"] == [f"http://127.0.0.1:{p}/metrics" for p in ports]
    password = (tmp_path / "admin-password").read_text().strip()
    assert password not in where["curl"]
    args = shlex.split(where["curl"])
    assert args == [
        "curl",
        "-s",
        "-u",
        f"admin:$(cat {tmp_path / 'admin-password'})",
        f"http://127.0.0.1:{ports[0]}/query/service",
        "--data-urlencode",
        f"statement={stmt}",
    ]


def test_a_tls_cluster_is_asked_over_https_with_its_ca(tmp_path: Path) -> None:
    spec = cdir.create(tmp_path, nodes=1, base_port=21100, tls=True)
    where = endpoints(tmp_path, "SELECT 1")
    assert where["console"] == f"https://127.0.0.1:{spec.nodes[0].http_port}/ui/"
    assert where["ca"] is not None and Path(where["ca"]).is_file()
    assert ["--cacert", where["ca"]] == shlex.split(where["curl"])[2:4]
