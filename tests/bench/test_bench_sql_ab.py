"""The pure parts of ``bench.sql.ab``: its options and the on/off table (medians over the
rounds per consistency and client count)."""

from __future__ import annotations

from bench.sql.ab import CPU, parse_args, ratios
from bench.sql.queries import COVERING, RANGE


def _row(consistency: str, clients: int, on: bool, p50: float, cpu: float | None) -> dict:
    return {"consistency": consistency, "clients": clients, "on": on, "p50 ms": p50,
            "q/s": 1000 / p50, CPU: cpu}  # fmt: skip


def test_ratios_are_medians_on_over_off_per_consistency_and_clients() -> None:
    rows = [
        _row("request_plus", 1, True, 3.0, 4.0),
        _row("request_plus", 1, True, 9.0, 4.0),  # an outlier round: the median is 4.0
        _row("request_plus", 1, True, 4.0, None),  # no CPU figure: left out of its median
        _row("request_plus", 1, False, 5.0, 5.0),
        _row("not_bounded", 4, True, 2.0, 3.0),
        _row("not_bounded", 4, False, 4.0, 6.0),
    ]
    out = {(r["consistency"], r["clients"]): r for r in ratios(rows)}
    rp = out[("request_plus", 1)]
    assert rp["p50 ms on"] == 4.0 and rp["p50 ms off"] == 5.0 and rp["p50 ms on/off"] == 0.8
    assert rp[f"{CPU} on/off"] == 0.8
    nb = out[("not_bounded", 4)]
    assert nb["p50 ms on/off"] == 0.5 and nb["q/s on/off"] == 2.0 and nb[f"{CPU} on/off"] == 0.5


def test_options_name_the_case_the_switch_and_the_rounds() -> None:
    plan, path = parse_args(["--quick"])
    assert (plan.case, plan.switch, plan.rounds, plan.docs) == (RANGE, "late", 2, 20_000)
    assert path.name == "sql-ab-quick.json"
    plan, _ = parse_args(["--case", COVERING, "--switch", "inline", "--rounds", "3",
                          "--clients", "4,1"])  # fmt: skip
    assert (plan.case, plan.switch, plan.rounds, plan.levels) == (COVERING, "inline", 3, (1, 4))
