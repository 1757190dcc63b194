"""The web console on a real 3-node cluster (no index pipeline: indexes stay deferred or
BUILDING here; ``test_console_index_build.py`` builds one to ACTIVE), driven in headless
Chromium: the login, the cluster map, keyspaces, indexes, the query workbench (rows as a
table and as JSON, EXPLAIN as a tree of fragments, cancelling a long query) and the
charts. What each page shows is checked against the cluster itself."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_helpers import Console
from data_helpers import running_cluster
from n1ql_http import basic, call, http_port

from shardex.client import Client, connect_local

pytestmark = pytest.mark.cluster

KS = "people"
PARTS = 12
DOCS = 30
# ~400 million rows to count: minutes of work, stopped by the test's cancel long before
LONG = "SELECT COUNT(*) AS n FROM (ARRAY_RANGE(0, 20000)) AS a UNNEST ARRAY_RANGE(0, 20000) AS b"


class Env:
    def __init__(self, path: Path, admin: Client, console: Console, password: str) -> None:
        self.path = path
        self.admin = admin
        self.console = console
        self.password = password
        self.port = http_port(path, 1)
        self.auth = basic("admin", password)

    def api(self, path: str, **kw: Any) -> Any:
        return call(f"http://127.0.0.1:{self.port}{path}", headers=self.auth, **kw).body


@pytest.fixture(scope="module")
def env(chrome: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with (
        running_cluster(tmp_path_factory.mktemp("console")) as c,
        connect_local(Path(c.path)) as admin,
    ):
        admin.create_keyspace(KS, PARTS, num_replicas=1)
        people = admin.keyspace(KS)
        for i in range(DOCS):
            people.upsert(f"p{i:02}", {"n": i, "city": ["Oslo", "Lima", "Pune"][i % 3]})
        path = Path(c.path)
        password = (path / "admin-password").read_text().strip()
        console = Console(chrome, f"http://127.0.0.1:{http_port(path, 1)}")
        console.login("admin", password)  # each test starts logged in (the tab keeps it)
        console.wait(lambda: console.find("#top").is_displayed(), "the console after login")
        yield Env(path, admin, console, password)


def test_login_and_the_cluster_map(env: Env) -> None:
    ui = env.console
    ui.open()
    ui.wait(lambda: ui.find("#logout").is_displayed(), "the logout button")
    ui.find("#logout").click()
    ui.wait(lambda: "Logged out" in ui.find("#login-error").text, "the login form again")
    ui.login("admin", "not-the-password")
    ui.wait(lambda: "wrong password" in ui.find("#login-error").text, "the refused login")
    assert ui.find("#login").is_displayed() and not ui.find("#top").is_displayed()
    # the refused request is the browser's only error (reading the log empties it)
    assert [e.split(" - ")[1] for e in ui.errors()] == [
        "Failed to load resource: the server responded with a status of 401 (Unauthorized)"
    ]
    assert ui.driver.get_cookies() == []  # the logout made the browser drop it
    ui.login("admin", env.password)
    ui.wait(lambda: ui.find("#top").is_displayed(), "the console after login")
    # the session is an HttpOnly, SameSite=Strict cookie the page cannot read; the tab keeps
    # no password, and a reload stays logged in
    (cookie,) = ui.driver.get_cookies()
    assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"]) == (
        "shardex_session",
        True,
        "Strict",
    )
    assert ui.driver.execute_script("return document.cookie + sessionStorage.length") == "0"
    ui.open()
    ui.wait(lambda: ui.find("#who").text == "admin", "the user after a reload")
    cards = ui.wait(lambda: len(ui.all(".card.node")) == 3 and ui.all(".card.node"), "3 nodes")
    assert sorted(c.get_attribute("data-node") for c in cards) == ["node1", "node2", "node3"]
    status = env.admin.cluster_status()
    for m in status.members:
        card = ui.find(f"#node-{m.name}")
        assert m.address in card.text
        assert sorted(
            b.text for b in card.find_elements("css selector", ".badge.service")
        ) == sorted(m.services)
    # partitions per node: the active and replica counts are the keyspace's map
    (desc,) = [d for d in env.admin.list_keyspaces() if d.name == KS]

    def counts() -> dict[str, tuple[int, int]] | None:
        got = {}
        for m in status.members:
            held = ui.find(f"#node-{m.name} .held")
            got[m.name] = (
                int(held.find_element("css selector", ".n-active").text),
                int(held.find_element("css selector", ".n-replica").text),
            )
        return got

    want = {
        m.name: (
            sum(1 for n in desc.assignment.values() if n == m.name),
            sum(1 for rs in desc.replicas.values() for n in rs if n == m.name),
        )
        for m in status.members
    }
    assert ui.wait(lambda: counts() == want and counts(), "the partitions per node") == want
    assert sum(a for a, _ in want.values()) == PARTS
    assert len(ui.all("#node-node1 .strip .cell.active")) == want["node1"][0]
    ui.shot("cluster")
    assert ui.errors() == []


def test_keyspaces_page(env: Env) -> None:
    ui = env.console
    ui.open("keyspaces")
    row = ui.wait(lambda: ui.find(f'tr[data-keyspace="{KS}"]'), "the keyspace row")
    assert row.text.split()[:3] == [KS, str(PARTS), "1"]
    form = ui.find("#keyspace-create")
    form.find_element("name", "name").send_keys("made_in_browser")
    partitions = form.find_element("name", "partitions")
    partitions.clear()
    partitions.send_keys("4")
    form.find_element("css selector", "button").click()
    ui.wait(lambda: ui.all('tr[data-keyspace="made_in_browser"]'), "the created keyspace")
    (made,) = [d for d in env.admin.list_keyspaces() if d.name == "made_in_browser"]
    assert made.num_partitions == 4
    ui.find(f'tr[data-keyspace="{KS}"] a').click()
    detail = ui.wait(lambda: ui.find("#keyspace-detail table"), "the partition map")
    rows = detail.find_elements("css selector", "tbody tr")
    (desc,) = [d for d in env.admin.list_keyspaces() if d.name == KS]
    assert {int(r.text.split()[0]): r.text.split()[1] for r in rows} == desc.assignment
    ui.shot("keyspaces")
    env.admin.drop_keyspace("made_in_browser")


def test_indexes_page_creates_and_builds_a_deferred_index(env: Env) -> None:
    ui = env.console
    ui.open("indexes")
    ui.find("#index-statement").send_keys(
        f'CREATE INDEX by_city ON {KS}(city) WITH {{"defer_build": true}}'
    )
    ui.find("#index-create button").click()
    row = f'tr[data-index="{KS}/by_city"]'
    ui.wait(lambda: ui.find(f"{row} .index-state").text == "READY", "by_city READY")
    assert [i["state"] for i in env.admin.list_indexes(KS) if i["name"] == "by_city"] == ["READY"]
    ui.find(f"{row} button.build").click()
    # no pipeline runs on this cluster: the build starts and stays BUILDING
    ui.wait(lambda: ui.find(f"{row} .index-state").text == "BUILDING", "by_city BUILDING")
    assert env.admin.list_indexes(KS)[0]["state"] == "BUILDING"
    assert ui.find(f"{row} .bar").get_attribute("title") == "0%"
    ui.shot("indexes")


def _run(ui: Console, statement: str, button: str = "#query-run") -> None:
    editor = ui.find("#query-editor")
    editor.clear()
    editor.send_keys(statement)
    ui.find(button).click()


def test_query_workbench_reads_rows_and_draws_the_plan(env: Env) -> None:
    ui = env.console
    ui.open("query")
    keys = json.dumps([f"p{i:02}" for i in (3, 1, 2)])
    _run(ui, f"SELECT META().id AS id, n, city FROM {KS} USE KEYS {keys} ORDER BY n")
    ui.wait(lambda: ui.find("#query-status").get_attribute("data-status") == "success", "success")
    head = [th.text for th in ui.all("#query-table thead th")]
    rows = [
        [td.text for td in tr.find_elements("css selector", "td")]
        for tr in ui.all("#query-table tbody tr")
    ]
    got = [dict(zip(head, r, strict=True)) for r in rows]
    assert got == [
        {"id": f"p0{i}", "n": str(i), "city": ["Oslo", "Lima", "Pune"][i % 3]} for i in (1, 2, 3)
    ]
    assert "resultCount 3" in ui.find("#query-metrics").text
    ui.find('.tab[data-view="json"]').click()
    assert json.loads(ui.find("#view-json").text) == [
        {"id": f"p0{i}", "n": i, "city": ["Oslo", "Lima", "Pune"][i % 3]} for i in (1, 2, 3)
    ]
    ui.shot("query")
    _run(ui, f"SELECT n FROM {KS} USE KEYS {keys}", "#query-explain")
    ui.wait(lambda: ui.all("#view-plan .fragment.root"), "the plan's root fragment")
    root = ui.find("#view-plan .fragment.root .fragment-title").text
    assert root.startswith("fragment 0") and "initiator" in root
    ops = [
        li.find_element("css selector", "strong").text for li in ui.all("#view-plan .operators li")
    ]
    assert ops[0] == "KeyspaceScan" and "Project" in ops
    ui.shot("query-explain")
    _run(ui, "SELECT nothing FROM")
    ui.wait(lambda: ui.find("#query-status").get_attribute("data-status") == "fatal", "fatal")
    assert ui.find("#query-errors").text.startswith("3000:")
    assert [e.split(" - ")[1] for e in ui.errors()] == [
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"
    ]


def test_cancel_a_long_query(env: Env) -> None:
    ui = env.console
    ui.open("query")
    _run(ui, LONG)
    cancel = ui.find("#query-cancel")
    ui.wait(lambda: cancel.is_enabled(), "the cancel button")

    def listed() -> list[dict[str, Any]]:
        return [r for r in env.api("/admin/active_requests") if r["statement"] == LONG]

    (running,) = ui.wait(listed, "the long query in /admin/active_requests")
    assert running["clientContextID"].startswith("console-") and running["state"] == "running"
    cancel.click()
    ui.wait(lambda: ui.find("#query-status").get_attribute("data-status") == "stopped", "stopped")
    assert "1181" in ui.find("#query-errors").text
    ui.wait(lambda: not listed() or None, "the stopped query to leave the active requests")
    assert not ui.find("#query-cancel").is_enabled()


def test_charts_show_every_node(env: Env) -> None:
    ui = env.console
    ui.open("charts")
    people = env.admin.keyspace(KS)
    nodes = ["node1", "node2", "node3"]

    def busiest() -> dict[str, float]:
        """The KV chart's lines: series -> the largest value it shows."""
        return {
            t.get_attribute("data-series"): float(t.get_attribute("data-max"))
            for t in ui.all("#chart-kv_ops svg text.legend")
        }

    def every_node_busy() -> bool:
        for i in range(DOCS):  # every node owns some of them: each node's line rises
            people.get(f"p{i:02}")
        lines = busiest()
        return list(lines) == [*nodes, "total"] and all(lines[n] > 0 for n in nodes)

    ui.wait(every_node_busy, "KV operations of all 3 nodes in the ops/s chart")
    lines = busiest()
    assert lines["total"] >= max(lines[n] for n in nodes)
    assert ui.find("#charts-nodes").text.endswith("node1, node2, node3")
    titles = [f.text.split("\n")[0] for f in ui.all(".chart-box figcaption")]
    assert [t.split(" (")[0] for t in titles] == [
        "KV operations per second",
        "SQL statements per second",
        "Index freshness",
        "Scan latency",
    ]
    for chart in ("sql_statements", "scan_latency_ms"):  # a line per node that did some
        assert set(ui.all(f"#chart-{chart} svg")) and all(
            t.get_attribute("data-series") in [*nodes, "total"]
            for t in ui.all(f"#chart-{chart} svg text.legend")
        )
    ui.shot("charts")
    assert ui.errors() == []


def test_fail_a_node_over_and_recover_it(env: Env) -> None:
    ui = env.console
    ui.open("cluster")
    card = "#node-node3"
    ui.wait(lambda: ui.find(f"{card} .card-head").text == "node3 up", "node3 up")
    ui.find(f"{card} button.danger").click()
    ui.driver.switch_to.alert.accept()  # "Fail node3 over? ..."
    ui.wait(lambda: "failed over" in ui.find(f"{card} .card-head").text, "node3 failed over")
    assert env.admin.failed_over().keys() == {"node3"}
    # its active partitions went to their replicas: node3 holds none active
    ui.wait(lambda: ui.find(f"{card} .n-active").text == "0", "no active partition on node3")
    ui.shot("cluster-failed-over")
    ui.find(f"{card} .actions button").click()  # Recover (delta)
    ui.wait(lambda: "recovering (delta)" in ui.find(f"{card} .card-head").text, "recovering")
    assert env.admin.failed_over() == {}
    # it holds nothing until a rebalance places partitions on it again
    ui.find("#rebalance-start").click()
    ui.wait(lambda: ui.find(f"{card} .card-head").text == "node3 up", "node3 up again", 120)
    ui.wait(lambda: ui.find("#rebalance .badge").text == "done", "the rebalance done", 120)
    assert ui.find("#rebalance .bar").get_attribute("title") == "100%"
    (desc,) = [d for d in env.admin.list_keyspaces() if d.name == KS]
    active = sum(1 for n in desc.assignment.values() if n == "node3")
    assert active > 0
    ui.wait(lambda: ui.find(f"{card} .n-active").text == str(active), "node3's partitions")
    ui.shot("cluster-rebalanced")
