"""``bench.tls``'s tables from its measurements: medians over rounds and the TLS/plain
ratios with the goal line."""

from __future__ import annotations

from bench import tls


def _sample(op: str, cluster: str, rate: int, p50: float) -> dict[str, object]:
    return {
        "op": op,
        "cluster": cluster,
        "ops/s": rate,
        "p50 ms": p50,
        "p99 ms": p50 * 2,
        # CPU per operation follows the latency here: 100 us of node, 40 us of client per ms.
        "node CPU µs/op": p50 * 100,
        "client CPU µs/op": p50 * 40,
    }


def test_medians_and_ratios() -> None:
    samples = []
    for op in tls.OPS:
        for r in range(3):
            samples.append(_sample(op, "plain", 1000 + r, 1.0 + r / 10))
            # TLS: 10 % slower on get and upsert, 50 % on the scan
            slower = 1.5 if op == "scan 100 rows" else 1.1
            samples.append(_sample(op, "tls", round((1000 + r) / slower), (1.0 + r / 10) * slower))
    medians = tls._medians(samples)
    by = {(m["op"], m["cluster"]): m for m in medians}
    assert by[("get", "plain")]["ops/s"] == 1001 and by[("get", "plain")]["p50 ms"] == 1.1
    ratios = {r["op"]: r for r in tls._ratios(medians)}
    assert ratios["get"]["p50 TLS/plain"] == 1.1
    assert by[("get", "plain")]["node CPU µs/op"] == 110.0
    assert ratios["get"]["node CPU TLS/plain"] == 1.1
    assert ratios["scan 100 rows"]["client CPU TLS/plain"] == 1.5
    assert ratios["get"][f"goal <= {tls.GOAL}"] == "met"
    assert abs(ratios["scan 100 rows"]["time per op TLS/plain"] - 1.5) < 0.01
    assert ratios["scan 100 rows"][f"goal <= {tls.GOAL}"] == "MISSED"
