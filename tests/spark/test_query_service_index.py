"""The N1QL query service over HTTP reading through an index (the session's shared cluster
and pipeline, ``shared_cluster``): statements written over HTTP are seen by the next
request at request_plus, and at_plus waits for the scan vector of a client's write, as
Couchbase's documentation shows them with curl."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from n1ql_http import basic, form, http_port, post_json

if TYPE_CHECKING:
    from pipeline_helpers import SharedCluster

KS = "http_docs"


@pytest.fixture(scope="module")
def url(shared_cluster: SharedCluster) -> Iterator[tuple[str, dict[str, str]]]:
    path = Path(shared_cluster.path)
    client = shared_cluster.client
    with shared_cluster.keyspace(KS):
        list(client.query(f"CREATE PRIMARY INDEX ON {KS}"))
        client.wait_for_index(KS, "#primary", timeout=240)
        auth = basic("admin", (path / "admin-password").read_text().strip())
        yield f"http://127.0.0.1:{http_port(path, 3)}/query/service", auth


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_request_plus_sees_the_writes_before_it(
    shared_cluster: SharedCluster, url: tuple[str, dict[str, str]]
) -> None:
    where, auth = url
    count = f"SELECT RAW COUNT(*) FROM {KS} WHERE META().id LIKE 'h%'"
    for i in range(1, 6):
        ins = form(
            where,
            auth,
            statement=f"INSERT INTO {KS} (KEY, VALUE) VALUES ('h{i}', {{'n': {i}}})",
        )
        assert ins.status == 200 and ins.body["metrics"]["mutationCount"] == 1
        a = form(where, auth, statement=count, scan_consistency="request_plus")
        assert (a.status, a.body["results"]) == (200, [i]), a.body
    a = post_json(
        where,
        auth,
        {"statement": f"SELECT RAW n FROM {KS} WHERE n >= $1 ORDER BY n", "args": [3],
         "scan_consistency": "request_plus"},
    )  # fmt: skip
    assert a.body["results"] == [3, 4, 5] and a.body["status"] == "success"
    # at_plus: the scan vector of a write made elsewhere ({"partition": [seqno, "uuid"]})
    written = shared_cluster.client.keyspace(KS).upsert("h9", {"n": 9})
    vector = {str(written.partition): [written.seqno, str(written.uuid)]}
    a = post_json(
        where,
        auth,
        {"statement": f"SELECT RAW n FROM {KS} WHERE n = 9", "scan_consistency": "at_plus",
         "scan_vector": vector},
    )  # fmt: skip
    assert a.body["results"] == [9], a.body
