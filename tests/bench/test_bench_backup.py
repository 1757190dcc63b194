"""``bench.backup``'s rows and summary line, and its command line."""

from __future__ import annotations

from bench import backup


def test_rows_rate_by_documents_and_json_bytes() -> None:
    r = backup.row("shardex", "restore", 2.0, 1000, 3_000_000, 0)
    assert (r["docs_per_s"], r["json_MB_per_s"], r["output_MB"]) == (500, 1.5, 0.0)


def test_the_summary_pairs_each_step_with_postgresqls() -> None:
    rows = [
        backup.row("shardex", "backup (full)", 2.0, 1000, 10**6, 10**6),
        backup.row("shardex", "restore", 4.0, 1000, 10**6, 0),
        backup.row("postgresql", "pg_dump -Fc", 1.0, 1000, 10**6, 10**6),
        backup.row("postgresql", "pg_restore", 0.5, 1000, 10**6, 0),
    ]
    line = backup.summary({"tables": {"t": rows}}, 12.0)
    assert line == (
        "backup (full) 500 docs/s vs pg_dump -Fc 1,000; "
        "restore 250 docs/s vs pg_restore 2,000 (12 s in all)"
    )


def test_quick_mode_and_options() -> None:
    plan, path = backup.parse(["--quick", "--partitions", "8"])
    assert (plan.docs, plan.partitions) == (backup.QUICK["docs"], 8)
    assert path.name == "backup-quick.json"
    plan, path = backup.parse([])
    assert (plan.docs, plan.partitions, path.name) == (1_000_000, 64, "backup.json")
