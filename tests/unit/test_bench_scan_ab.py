"""``bench/scan_ab.py``'s twin cluster: every port of the copy moves (cluster.json, each
node's node.toml and members.json), the secret differs, the original is untouched, and the
twin is made once."""

from __future__ import annotations

import json
from pathlib import Path

from bench.scan_ab import twin


def write_cluster(base: Path, ports: list[int]) -> None:
    cdir = base / "cluster"
    nodes = []
    for i, port in enumerate(ports, 1):
        ndir = cdir / f"node{i}"
        ndir.mkdir(parents=True)
        seed = [] if i == 1 else [f"127.0.0.1:{ports[0]}"]
        (ndir / "node.toml").write_text(
            f'name = "node{i}"\nport = {port}\nhttp_port = {port + 1000}\nseed = {seed!r}\n'
        )
        members = [{"address": f"127.0.0.1:{p}", "name": f"node{j}"} for j, p in enumerate(ports)]
        (ndir / "members.json").write_text(json.dumps({"members": members}))
        (ndir / "node.lock").write_text("")
        nodes.append(
            {
                "address": f"127.0.0.1:{port}",
                "port": port,
                "http_port": port + 1000,
                "name": f"node{i}",
                "seeds": seed,
            }
        )
    (cdir / "cluster.json").write_text(json.dumps({"base_port": ports[0], "nodes": nodes}))
    (cdir / "secret").write_text("a" * 64 + "\n")


def test_the_twin_moves_every_port_and_has_its_own_secret(tmp_path: Path) -> None:
    old = [25397, 25398, 25399]
    write_cluster(tmp_path, old)
    original = {p: p.read_bytes() for p in (tmp_path / "cluster").rglob("*") if p.is_file()}
    dst = twin(tmp_path)
    assert dst == tmp_path / "twin"
    texts = [p.read_text() for p in dst.rglob("*") if p.is_file() and p.name != "secret"]
    assert texts and not any(str(p) in t for t in texts for p in [*old, *(p + 1000 for p in old)])
    spec = json.loads((dst / "cluster.json").read_text())
    ports = [n["port"] for n in spec["nodes"]]
    assert ports == [ports[0] + k for k in range(3)] and spec["base_port"] == ports[0]
    assert [n["http_port"] - n["port"] for n in spec["nodes"]] == [1000] * 3
    assert f"port = {ports[1]}" in (dst / "node2" / "node.toml").read_text()
    assert (dst / "secret").read_text() != (tmp_path / "cluster" / "secret").read_text()
    assert not (dst / "node1" / "node.lock").exists()
    after = {p: p.read_bytes() for p in (tmp_path / "cluster").rglob("*") if p.is_file()}
    assert after == original
    (dst / "marker").write_text("kept")
    assert twin(tmp_path) == dst and (dst / "marker").exists()  # made once
