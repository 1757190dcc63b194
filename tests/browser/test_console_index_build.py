"""An index built to ACTIVE from the console: a 3-node cluster with its index pipeline
(Spark), a deferred index created and built from the indexes page, its state and progress
bar followed to ACTIVE and 100%, its items and freshness to the keyspace's documents as
they are written, then a query through it in the workbench."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import run_cli
from console_helpers import Console
from data_helpers import running_cluster
from n1ql_http import http_port

from shardex.client import Client, connect_local

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

KS = "shelf"
DOCS = 40
BUILD = 600.0  # seconds: the Spark driver starts and builds on 2 busy cores


@pytest.fixture(scope="module")
def cluster(
    chrome: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Client, Console, str]]:
    with running_cluster(tmp_path_factory.mktemp("console-build")) as c:
        path = Path(c.path)
        run_cli("cluster", "start", "--dir", str(path), timeout=300)  # now with the pipeline
        with connect_local(path) as admin:
            admin.create_keyspace(KS, 8)
            books = admin.keyspace(KS)
            for i in range(DOCS):
                books.upsert(f"b{i:02}", {"year": 1900 + i, "title": f"Book {i}"})
            password = (path / "admin-password").read_text().strip()
            yield admin, Console(chrome, f"http://127.0.0.1:{http_port(path, 2)}"), password


@pytest.mark.timeout(int(BUILD) + 300)
def test_build_an_index_to_active_and_query_through_it(
    cluster: tuple[Client, Console, str],
) -> None:
    admin, ui, password = cluster
    ui.login("admin", password)
    ui.wait(lambda: len(ui.all(".card.node")) == 3, "3 nodes")
    ui.open("indexes")
    ui.find("#index-statement").send_keys(
        f'CREATE INDEX by_year ON {KS}(year) WITH {{"defer_build": true}}'
    )
    ui.find("#index-create button").click()
    row = f'tr[data-index="{KS}/by_year"]'
    ui.wait(lambda: ui.find(f"{row} button.build"), "the Build button of the READY index")
    ui.find(f"{row} button.build").click()
    ui.wait(lambda: ui.find(f"{row} .index-state").text in ("BUILDING", "ACTIVE"), "the build")
    ui.shot("index-building")
    ui.wait(lambda: ui.find(f"{row} .index-state").text == "ACTIVE", "by_year ACTIVE", BUILD)
    assert ui.find(f"{row} .bar").get_attribute("title") == "100%"
    (listed,) = [i for i in admin.list_indexes(KS) if i["name"] == "by_year"]
    assert listed["state"] == "ACTIVE"

    def items() -> int:
        return int(ui.find(f"{row} .index-items").text.replace(",", ""))

    ui.wait(lambda: items() == DOCS, f"{DOCS} items")
    # a write: the items follow and the freshness comes back to 0 seqnos behind
    admin.keyspace(KS).upsert("b99", {"year": 2024, "title": "New"})
    ui.wait(lambda: items() == DOCS + 1, f"{DOCS + 1} items after a write", 120)
    ui.wait(lambda: ui.find(f"{row} .index-lag").text == "0", "freshness 0", 120)
    ui.shot("index-active")
    ui.open("query")
    editor = ui.find("#query-editor")
    editor.clear()
    editor.send_keys(f"SELECT RAW title FROM {KS} WHERE year >= 1937 ORDER BY year")
    ui.find("#query-run").click()
    ui.wait(lambda: ui.find("#query-status").get_attribute("data-status") == "success", "success")
    cells = [td.text for td in ui.all("#query-table tbody td")]
    assert cells == ["Book 37", "Book 38", "Book 39", "New"]
