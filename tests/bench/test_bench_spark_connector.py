"""``bench.spark_connector``'s pure parts: the JDBC split, the round order, the summary
rows and line, the driver check and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import spark_connector as sc


def demo_ids(n: int) -> list[str]:
    return [f"user-{i:07d}" for i in range(n)]


def matching(pred: str, key: str) -> bool:
    """``pred`` (as ``id_predicates`` writes them) evaluated for one id."""
    if pred == "TRUE":
        return True
    ok = True
    for clause in pred.split(" AND "):
        _, op, bound = clause.split(" ")
        value = bound.strip("'")
        ok = ok and (key < value if op == "<" else key >= value)
    return ok


@pytest.mark.parametrize("parts", [1, 2, 4, 7])
def test_predicates_put_every_id_in_exactly_one_even_range(parts: int) -> None:
    ids = demo_ids(1000)
    preds = sc.id_predicates(1000, parts)
    assert len(preds) == parts
    sizes = [sum(matching(p, i) for i in ids) for p in preds]
    for key in ids:
        assert sum(matching(p, key) for p in preds) == 1, key
    assert max(sizes) - min(sizes) <= 1


def test_predicates_refuse_no_partition() -> None:
    with pytest.raises(ValueError, match="--jdbc-partitions 0"):
        sc.id_predicates(1000, 0)


def test_rounds_alternate_the_order_of_the_reads() -> None:
    assert sc.round_order(0) == list(sc.READS)
    assert sc.round_order(1) == list(reversed(sc.READS))
    assert sc.round_order(2) == list(sc.READS)


def rnd(k: int, read: str, seconds: float, load: float | None = 1.0) -> dict:
    return {"round": k, "read": read, "seconds": seconds, "checksum": 42, "load1": load}


def test_summary_rows_skip_the_warm_up_and_take_medians() -> None:
    rounds = [
        rnd(0, sc.SHARDEX_INFERRED, 100.0),
        rnd(0, sc.POSTGRES, 100.0),
        *(rnd(k, sc.POSTGRES, s, None) for k, s in ((1, 1.0), (2, 2.0), (3, 3.0))),
        *(rnd(k, sc.SHARDEX_INFERRED, s, k) for k, s in ((1, 4.0), (2, 2.0), (3, 5.0))),
    ]
    summary = sc.summarise(rounds, 1000, 4_000_000)
    assert [r["read"] for r in summary] == [sc.SHARDEX_INFERRED, sc.POSTGRES]
    rows = {r["read"]: r for r in summary}
    shardex, pg = rows[sc.SHARDEX_INFERRED], rows[sc.POSTGRES]
    assert (shardex["rounds"], shardex["median_s"], shardex["best_s"]) == (3, 4.0, 2.0)
    assert (shardex["docs_per_s"], shardex["json_MB_per_s"]) == (250, 1.0)
    assert (shardex["load1"], pg["load1"]) == (2, None)
    assert (shardex["vs_postgresql"], pg["vs_postgresql"]) == (0.5, 1.0)


def test_the_summary_line_names_each_read_and_its_ratio() -> None:
    rows = sc.summarise([rnd(1, sc.SHARDEX_GIVEN, 2.0), rnd(1, sc.POSTGRES, 1.0)], 1000, 10**6)
    out = {"tables": {"t": rows}, "load_avg_start": [1.0], "load_avg_end": [2.0]}
    line = sc.summary(out, 10.0)
    assert line.startswith(
        "shardex (given schema) 500 docs/s (0.5x); postgresql (JDBC) 1,000 docs/s (1.0x); "
    )


def test_a_missing_jdbc_driver_names_its_package(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="libpostgresql-jdbc-java"):
        sc.jdbc_jar(tmp_path / "postgresql.jar")
    jar = tmp_path / "postgresql.jar"
    jar.write_bytes(b"PK")
    assert sc.jdbc_jar(jar) == jar


def test_quick_mode_and_options() -> None:
    plan, path = sc.parse(["--quick", "--rounds", "2", "--jdbc-partitions", "8"])
    assert (plan.docs, plan.rounds, plan.jdbc_partitions) == (50_000, 2, 8)
    assert path.name == "spark_connector-quick.json"
    plan, path = sc.parse([])
    assert (plan.docs, plan.rounds, plan.partitions, path.name) == (
        1_000_000,
        3,
        64,
        "spark_connector.json",
    )
