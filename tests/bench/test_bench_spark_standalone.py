"""``bench.spark_standalone``'s ratio table from its builds: medians per mode, standalone
over local, and a column left out when a mode has no figure for it."""

from __future__ import annotations

from bench import spark_standalone as sa


def _build(mode: str, wall: float, job: float | None) -> dict[str, object]:
    return {"executors": mode, "BUILD -> ACTIVE s": wall, "build job s": job}


def test_ratios_are_medians_of_each_mode() -> None:
    builds = [
        _build("local", 10.0, 8.0),
        _build("standalone", 13.0, 11.0),
        _build("local", 12.0, 9.0),
        _build("standalone", 15.0, None),  # the driver's log line was not found
        _build("local", 30.0, 7.0),  # an outlier the median ignores
        _build("standalone", 14.0, 12.0),
    ]
    rows = {r["measure"]: r for r in sa._ratios(builds)}
    wall = rows["BUILD -> ACTIVE s"]
    assert (wall["local"], wall["standalone"], wall["standalone / local"]) == (12.0, 14.0, 1.167)
    job = rows["build job s"]
    assert (job["local"], job["standalone"]) == (8.0, 11.5)


def test_no_ratio_without_both_modes() -> None:
    assert sa._ratios([_build("local", 10.0, 8.0)]) == []
