"""``bench.diagnostics.indexer_round`` runs both shapes of a round end to end in process and
accounts
for every key version: each round's JSON record names its phases, every phase of the path
took time, the drain shape spends nothing deciding ahead and the early shape decides its
rows before its round."""

from __future__ import annotations

import json
from pathlib import Path

from bench.diagnostics.indexer_round import PHASES, main


def test_both_shapes_report_every_phase(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "round.json"
    assert main(["--changes", "300", "--docs", "400", "--rounds", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rounds = data["rounds"]
    assert [r["shape"] for r in rounds] == ["drain", "early"]
    for r in rounds:
        assert set(r["cpu"]) == set(PHASES)
        # 300 changes of two indexes, by docid and unpartitioned: two key versions each
        assert r["kvs"] == 600
        for phase in ("route", "encode", "decode", "enqueue", "prepare", "write", "commit"):
            assert r["cpu"][phase] > 0, (r["shape"], phase)
    drain, early = rounds
    assert drain["cpu"]["decide"] == 0
    assert early["cpu"]["decide"] > 0
    assert "drain" in capsys.readouterr().out
