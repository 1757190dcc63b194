"""``shardex backup list``: each backup's keyspaces, kinds, counts and vector, as a table or
JSON; a foreign directory exits 1 naming it, with a hint."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from shardex.backup.repo import Repo
from shardex.cli.main import app
from tests.unit.backup.test_backup_repo import NOW, change, publish


def test_list_shows_backups_with_counts_and_vectors(tmp_path: Path) -> None:
    repo = Repo.open_or_init(tmp_path / "repo", NOW)
    first = publish(repo, "20260101T000000Z", {0: [change("a", 1), change("b", 2)]})
    second = publish(repo, "20260101T000100Z", {0: [change("a", 3), change("c", 4, None)]})
    env = {"COLUMNS": "200"}
    out = CliRunner().invoke(app, ["backup", "list", "--repo", str(repo.path)], env=env)
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if "000" in line]
    assert first.name in lines[0] and "full" in lines[0]
    assert second.name in lines[1] and "1 partitions, seqnos sum 4" in lines[1]
    vec = CliRunner().invoke(
        app, ["backup", "list", "--repo", str(repo.path), "--vectors"], env=env
    )
    assert "0:4/7" in vec.output
    raw = CliRunner().invoke(app, ["backup", "list", "--repo", str(repo.path), "--json"])
    listed = json.loads(raw.output)
    assert [m["name"] for m in listed] == [first.name, second.name]
    assert listed[1]["keyspaces"]["ks"]["partitions"]["0"]["tombstones"] == 1


def test_list_of_a_foreign_directory_fails_naming_it(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    out = CliRunner().invoke(app, ["backup", "list", "--repo", str(tmp_path)])
    assert out.exit_code == 1
    assert "not a shardex backup repository" in out.output
    assert str(tmp_path) in out.output and "hint:" in out.output
