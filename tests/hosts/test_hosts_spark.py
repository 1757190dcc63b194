"""The index pipeline on a Spark standalone cluster across hosts: three nodes (TLS) on hosts
1-3, the Spark master and the pipeline driver on host 4, a Spark worker on host 5. The
driver's executors, on another host than the driver, read the documents from the nodes over
TLS with the node credential they got from the driver (they have no file of the driver's),
build two indexes and maintain them; request_plus scans and SQL are exact."""

from __future__ import annotations

import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardex.client import Client
from shardex.testing.hosts.netns import Hosts, NetemUnavailable, require_netns
from shardex.testing.hosts.nodes import NodesOnHosts
from shardex.testing.hosts.spark import SparkOnHosts
from shardex.testing.procs import CLI, proc_env

pytestmark = pytest.mark.cluster

NODES, DRIVER, WORKER = 3, 4, 5
KS = "people"
CITIES = ("Oslo", "Rome", "Lima", "Pune")


@pytest.fixture(scope="module")
def five_hosts() -> Iterator[Hosts]:
    require_netns()
    with Hosts(5) as h:
        try:
            for i in range(1, 6):
                h.delay(i, 1.0)  # ~4 ms between two hosts
        except NetemUnavailable as exc:
            warnings.warn(f"no tc netem delay on the links: {exc}", stacklevel=1)
        yield h


@pytest.fixture(scope="module")
def setup(
    five_hosts: Hosts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[NodesOnHosts, SparkOnHosts]]:
    root = tmp_path_factory.mktemp("spark-hosts")
    nodes = NodesOnHosts(five_hosts, root / "nodes", count=NODES)
    spark = SparkOnHosts(five_hosts, root / "spark", master_host=DRIVER, worker_host=WORKER)
    nodes.start_all()
    spark.start()
    try:
        nodes.wait_formed()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + "\n".join(nodes.logs())) from None
    yield nodes, spark


def _doc(i: int) -> dict[str, Any]:
    return {"name": f"p{i}", "city": CITIES[i % len(CITIES)], "age": 20 + i % 50}


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(r["docid"] for r in rows)


def _check(c: Client, docs: dict[str, dict[str, Any]]) -> None:
    """Every index answers exactly what the documents say, at request_plus."""
    for city in CITIES:
        rows = list(
            c.scan(KS, "by_city", [{"low": [city], "high": [city]}], consistency="request_plus")
        )
        assert _ids(rows) == sorted(k for k, d in docs.items() if d["city"] == city), city
    span = {"low": [30], "high": [39]}
    rows = list(c.scan(KS, "by_age", [span], consistency="request_plus"))
    assert _ids(rows) == sorted(k for k, d in docs.items() if 30 <= d["age"] <= 39)
    got = list(
        c.query(
            f"SELECT RAW META().id FROM {KS} WHERE city = 'Lima' AND age >= 40",
            consistency="request_plus",
        )
    )
    assert sorted(got) == sorted(
        k for k, d in docs.items() if d["city"] == "Lima" and d["age"] >= 40
    )


def test_executors_on_another_host_build_and_maintain_indexes(
    setup: tuple[NodesOnHosts, SparkOnHosts],
) -> None:
    nodes, spark = setup
    assert nodes.tls_ca is not None
    spark.start_pipeline(DRIVER, nodes.addresses, nodes.secret_file, nodes.tls_ca)
    docs = {f"p{i:04}": _doc(i) for i in range(3000)}
    with nodes.connect() as c:
        c.create_keyspace(KS, 8, num_replicas=1)
        c.keyspace(KS).upsert_many(docs.items())
        c.create_index(KS, "by_city", ["city"])
        c.create_index(KS, "by_age", ["age"])
        try:
            c.wait_for_index(KS, "by_city", timeout=400)
            c.wait_for_index(KS, "by_age", timeout=400)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{spark.log_tails()}") from None
        _check(c, docs)

        # Maintenance: the streaming job (its tasks on the worker's executors) follows writes.
        ks = c.keyspace(KS)
        for i in range(0, 3000, 7):
            docs[f"p{i:04}"] = {**docs[f"p{i:04}"], "city": "Lima", "age": 33}
            ks.upsert(f"p{i:04}", docs[f"p{i:04}"], durability="majority")
        for i in range(1, 3000, 11):
            ks.delete(f"p{i:04}")
            docs.pop(f"p{i:04}")
        _check(c, docs)

    # The tasks ran in executors of the worker's host, with Spark's authentication on.
    logs = spark.executor_logs()
    assert logs, f"no executor ran on the worker\n{spark.log_tails()}"
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    assert "Finished task" in text
    assert "authentication enabled" in text
    worker_ip = spark.hosts.host(WORKER).ip
    assert f"{worker_ip}" in text  # the executor bound the worker host's address


def test_a_wrong_node_secret_stops_the_driver_before_spark(
    setup: tuple[NodesOnHosts, SparkOnHosts], tmp_path: Path
) -> None:
    """A pipeline given a secret the nodes do not know fails at once with the reason."""
    nodes, spark = setup
    bad = tmp_path / "wrong-secret"
    bad.write_text("not-the-secret\n")
    bad.chmod(0o600)
    argv = ["ip", "netns", "exec", spark.hosts.host(DRIVER).ns, *CLI, "pipeline"]
    argv += ["--addresses", ",".join(nodes.addresses), "--secret-file", str(bad)]
    argv += ["--home", str(tmp_path / "home"), "--tls-ca", str(nodes.tls_ca)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=proc_env(), timeout=300)
    assert proc.returncode != 0
    assert "authentication failed" in proc.stderr, proc.stderr
