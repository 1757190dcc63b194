"""``spawn_pipeline`` runs the driver in ``<cluster>/pipeline``: a relative cluster directory
(``make demo`` passes ``demo-cluster``) must reach it as an absolute path, or the driver looks
for ``demo-cluster/pipeline/demo-cluster`` and exits with "not a cluster directory"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardex.cli import localcluster


def test_the_driver_gets_an_absolute_cluster_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake_spawn(cmd: list[str], cwd: Path, log_path: Path, what: str) -> object:
        seen.update(cmd=cmd, cwd=cwd)
        return object()

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(localcluster, "_spawn_detached", fake_spawn)
    localcluster.spawn_pipeline(Path("demo-cluster"))
    given = Path(seen["cmd"][seen["cmd"].index("--dir") + 1])
    assert given.is_absolute()
    assert given == tmp_path / "demo-cluster"
    assert seen["cwd"] == tmp_path / "demo-cluster" / "pipeline"
