"""The N1QL query service over HTTP on a real 3-node cluster, driven the way Couchbase's
documentation drives it with curl: a form body (``-d statement=...``), a JSON body with
positional ``args`` and ``$name`` parameters, basic auth with the cluster's users; its
errors (bad JSON, unknown parameter, SQL syntax, privileges, size caps) with their HTTP
statuses and N1QL codes; a long statement stopped mid-stream by its timeout and by a DELETE
of its request ID while its client reads nothing, the node answering others meanwhile.
Key lookups and FROM expressions need no index, so no Spark here (request_plus through an
index: ``tests/spark/test_query_service_index.py``)."""

from __future__ import annotations

import json
import re
import socket
import ssl
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import LocalCluster, free_base_port, kill_leftovers, run_cli, wait_for
from data_helpers import running_cluster
from metrics_http import samples, scrape, value
from n1ql_http import (
    Answer,
    KeepAlive,
    basic,
    call,
    form,
    http_port,
    open_stream,
    post_bytes,
    post_json,
)

from shardex.client import Client, connect, connect_local
from shardex.errors import ShardexError
from shardex.meta.cluster_dir import HTTP_PORT_OFFSET
from shardex.meta.partitioning import partition_of

pytestmark = pytest.mark.cluster

KS = "people"
DOCS = {f"p{i:03}": {"name": f"n{i}", "age": i % 50} for i in range(120)}
PW = "reader-password-1"
# A result far larger than the socket buffers between the node and a client that reads
# nothing: the node's writes wait, so the statement is still running when the test acts.
LONG = {
    "statement": "SELECT x, $2 AS pad FROM ($1) AS x",
    "args": [list(range(30_000)), "p" * 2000],
}


class Env:
    def __init__(self, cluster: LocalCluster, admin: Client) -> None:
        self.cluster = cluster
        self.admin = admin
        path = Path(cluster.path)
        self.port = http_port(path, 2)  # any node serves every statement
        self.url = f"http://127.0.0.1:{self.port}/query/service"
        self.active = f"http://127.0.0.1:{self.port}/admin/active_requests"
        self.auth = basic("admin", (path / "admin-password").read_text().strip())
        self.reader = basic("reader", PW)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with (
        running_cluster(tmp_path_factory.mktemp("query-service")) as c,
        connect_local(Path(c.path)) as admin,
    ):
        admin.create_keyspace(KS, 8)
        admin.create_keyspace("other", 2)
        admin.keyspace(KS).upsert_many(DOCS.items())
        pw_file = Path(c.path) / "reader.pw"
        pw_file.write_text(PW + "\n")
        d = ("--dir", str(c.path))
        run_cli(
            "user",
            "create",
            "reader",
            "query_select(other)",
            *d,
            "--password-file",
            str(pw_file),
        )
        yield Env(c, admin)


def _ok(a: Answer) -> list[Any]:
    assert a.status == 200 and a.body["status"] == "success", a.body
    m = a.body["metrics"]
    assert m["resultCount"] == len(a.body["results"])
    assert m["elapsedTime"] and m["executionTime"]
    return a.body["results"]


def test_curl_form_and_json_bodies_answer_couchbases_envelope(env: Env) -> None:
    # curl -u admin:PW http://node:port/query/service -d 'statement=SELECT ...'
    a = form(env.url, env.auth, statement=f"SELECT name, age FROM {KS} USE KEYS ['p001', 'p002']")
    assert _ok(a) == [{"name": "n1", "age": 1}, {"name": "n2", "age": 2}]
    assert a.body["signature"] == {"*": "*"} and len(a.body["requestID"]) == 36
    rows_rpc = list(env.admin.query(f"SELECT name, age FROM {KS} USE KEYS ['p001', 'p002']"))
    assert a.body["results"] == rows_rpc
    assert a.body["metrics"]["resultSize"] == sum(
        len(json.dumps(r, separators=(",", ":"))) for r in rows_rpc
    )
    # JSON body: positional args, then named parameters, and the client's context ID back
    a = post_json(
        env.url,
        env.auth,
        {
            "statement": f"SELECT RAW name FROM {KS} USE KEYS $1",
            "args": [["p003", "p004"]],
            "client_context_id": "ctx-1",
            "scan_consistency": "request_plus",
            "timeout": "10s",
        },
    )
    assert _ok(a) == ["n3", "n4"] and a.body["clientContextID"] == "ctx-1"
    a = post_json(
        env.url,
        env.auth,
        {
            "statement": f"SELECT RAW age FROM {KS} USE KEYS $k WHERE age > $min",
            "$k": ["p010", "p049", "p051"],
            "$min": 9,
        },
    )
    assert _ok(a) == [10, 49]
    # a form's args and $name values are JSON text; a GET carries them in the URL
    a = form(env.url, env.auth, statement="SELECT $x AS x, $y AS y", **{"$x": '"s"', "$y": "[1]"})
    assert _ok(a) == [{"x": "s", "y": [1]}]
    a = call(env.url + "?statement=SELECT%201%20AS%20one", headers=env.auth)
    assert _ok(a) == [{"one": 1}]


def test_now_is_one_time_per_statement_over_http(env: Env) -> None:
    # The node stamps the statement time into the params as for the RPC path: every row,
    # wherever it is read, sees one NOW_MILLIS (unstamped, each call reads the clock).
    keys = ", ".join(f"'p{i:03d}'" for i in range(1, 21))
    a = form(env.url, env.auth, statement=f"SELECT NOW_MILLIS() AS n FROM {KS} USE KEYS [{keys}]")
    rows = _ok(a)
    assert len(rows) == 20 and len({r["n"] for r in rows}) == 1, rows


def test_writes_report_mutations_and_are_read_back(env: Env) -> None:
    a = form(
        env.url,
        env.auth,
        statement=f"INSERT INTO {KS} (KEY, VALUE) VALUES ('w1', {{'name': 'w'}}) RETURNING name",
    )
    assert _ok(a) == [{"name": "w"}] and a.body["metrics"]["mutationCount"] == 1
    a = form(env.url, env.auth, statement=f"UPDATE {KS} USE KEYS 'w1' SET age = 7")
    assert _ok(a) == [] and a.body["metrics"]["mutationCount"] == 1
    a = form(env.url, env.auth, statement=f"SELECT name, age FROM {KS} USE KEYS 'w1'")
    assert _ok(a) == [{"name": "w", "age": 7}]
    assert env.admin.keyspace(KS).get("w1") == {"name": "w", "age": 7}
    # a read-only request refuses a write (1000), and a GET is read-only
    a = form(env.url, env.auth, statement=f"DELETE FROM {KS} USE KEYS 'w1'", readonly="true")
    assert (a.status, a.codes) == (400, [1000])
    query = urllib.parse.urlencode({"statement": f"DELETE FROM {KS} USE KEYS 'w1'"})
    a = call(f"{env.url}?{query}", headers=env.auth)
    assert (a.status, a.codes) == (400, [1000])
    assert env.admin.keyspace(KS).get("w1")["name"] == "w"


def test_key_lookups_carry_the_routing_hint_to_their_owner(env: Env) -> None:
    """A key lookup's answer names its keyspace and key parameter, and the REST lists every
    node's HTTP address beside its partition map, so a client with a cluster map finds the
    key's owner (which answers it too); other statements carry no key hint."""
    st = f"SELECT name FROM {KS} USE KEYS $1"
    a = post_json(env.url, env.auth, {"statement": st, "args": ["p007"]})
    assert _ok(a) == [{"name": "n7"}]
    assert (a.headers["X-Shardex-Route-Keyspace"], a.headers["X-Shardex-Route-Param"]) == (
        KS,
        "1",
    )
    base = f"http://127.0.0.1:{env.port}"
    nodes = call(f"{base}/api/nodes", headers=env.auth).body["nodes"]
    path = Path(env.cluster.path)
    assert {n["name"]: n["http_address"] for n in nodes} == {
        f"node{i}": f"127.0.0.1:{http_port(path, i)}" for i in (1, 2, 3)
    }
    ks = call(f"{base}/api/keyspaces/{KS}", headers=env.auth).body
    owner = ks["partitions"][str(partition_of("p007", ks["num_partitions"]))]["active"]
    (there,) = [n for n in nodes if n["name"] == owner]
    url = f"http://{there['http_address']}/query/service"
    b = post_json(url, env.auth, {"statement": st, "args": ["p007"]})
    assert _ok(b) == [{"name": "n7"}] and b.headers["X-Shardex-Route-Param"] == "1"
    c = post_json(env.url, env.auth, {"statement": "SELECT 1 AS one"})
    assert _ok(c) == [{"one": 1}]
    assert not {h for h in c.headers if h.lower().startswith("x-shardex-route")}


def _keys_of(env: Env, node: str, candidates: list[str]) -> list[str]:
    """The ``candidates`` whose partition ``node`` holds active (the keyspace's map)."""
    ks = call(f"http://127.0.0.1:{env.port}/api/keyspaces/{KS}", headers=env.auth).body
    n, parts = ks["num_partitions"], ks["partitions"]
    return [k for k in candidates if parts[str(partition_of(k, n))]["active"] == node]


def _served(env: Env) -> tuple[float, float]:
    """The node's query requests served in its receive callback and in a task."""
    s = scrape(env.port, env.auth)
    name = "shardex_http_query_requests_total"
    return value(s, name, served="receive"), value(s, name, served="task")


def _masked(lines: list[str], body: bytes) -> tuple[list[str], bytes]:
    """A response without what differs between two answers of one request: its ID, its
    timings (and so its length) and the Connection header."""
    body, ids = re.subn(rb'"requestID": "[0-9a-f-]{36}"', b'"requestID": "ID"', body)
    assert ids == 1, body
    body = re.sub(rb'"(elapsedTime|executionTime)": "[^"]+"', rb'"\1": "T"', body)
    return [x for x in lines if not x.startswith(("Connection: ", "Content-Length: "))], body


def _slow(env: Env, params: dict[str, Any]) -> tuple[list[str], bytes]:
    """``params`` answered by the connection's task: a request that closes its connection
    is never answered in the receive callback."""
    conn = KeepAlive(env.port)
    try:
        conn.send(post_bytes(env.port, env.auth, params, close=True))
        return conn.response()
    finally:
        conn.close()


def test_a_local_key_lookup_answered_on_receive_is_the_tasks_answer(env: Env) -> None:
    """On a keep-alive connection of a user logged in before, a key lookup of the node's own
    documents is answered in the receive callback once the task answered its text as a key
    lookup by a parameter: the same bytes as the task's answer but for its request ID and
    timings (status, headers with the routing hint, signature, results, context ID,
    metrics)."""
    mine = _keys_of(env, "node2", sorted(DOCS))
    absent = _keys_of(env, "node2", [f"absent{i}" for i in range(40)])[0]
    st = f"SELECT name, age FROM {KS} USE KEYS $1"
    cases: list[dict[str, Any]] = [
        {"statement": st, "args": [mine[0]]},
        {
            "statement": f"SELECT RAW name FROM {KS} WHERE META().id = $k",
            "$k": mine[1],
            "client_context_id": "ctx-quick",
            "scan_consistency": "request_plus",
            "readonly": True,
        },
        {"statement": f"SELECT * FROM {KS} USE KEYS $1", "args": [mine[:3]], "signature": False},
        {"statement": st, "args": [absent], "metrics": False},
        {"statement": f"SELECT META().id AS id, age FROM {KS} USE KEYS $ids", "$ids": [mine[2]]},
    ]
    conn = KeepAlive(env.port)
    try:
        conn.post(env.auth, cases[0])  # the login (a first one is checked in the task)
        for params in cases:
            before = _served(env)
            slow = _slow(env, params)  # a text's first answer: the task's, learnt from
            assert _served(env) == (before[0], before[1] + 1), params
            quick = conn.post(env.auth, params)
            assert _served(env) == (before[0] + 1, before[1] + 1), params
            assert quick[0][0] == "HTTP/1.1 200 OK", quick
            assert _masked(*quick) == _masked(*slow)
    finally:
        conn.close()
    assert json.loads(quick[1])["results"] == [{"id": mine[2], "age": DOCS[mine[2]]["age"]}]


def test_a_keep_alive_connection_serves_everything_else_as_before(env: Env) -> None:
    """On the connection where local key lookups are answered on receive, every other
    request is the task's: other nodes' keys, bad requests, privileges, logins, pipelined
    requests; each answered as before and in order."""
    theirs = _keys_of(env, "node1", sorted(DOCS))[0]
    mine = _keys_of(env, "node2", sorted(DOCS))
    st = f"SELECT RAW name FROM {KS} USE KEYS $1"
    conn = KeepAlive(env.port)
    try:
        before = _served(env)
        lines, body = conn.post(env.auth, {"statement": st, "args": [theirs]})
        assert json.loads(body)["results"] == [DOCS[theirs]["name"]]
        for params, status, code in (
            ({"statement": st}, 400, 1040),  # its parameter not given
            ({"statement": st, "args": [mine[0]], "bogus": 1}, 400, 1065),
            ({"statement": st, "args": [mine[0]], "scan_consistency": "at_plus"}, 400, 1050),
            ({"statement": f"SELECT RAW nme FRM {KS} USE KEYS $1", "args": ["a"]}, 400, 3000),
        ):
            lines, body = conn.post(env.auth, params)
            assert (lines[0].split(" ")[1], json.loads(body)["errors"][0]["code"]) == (
                str(status),
                code,
            ), body
        whole = post_bytes(env.port, env.auth, {"statement": "SELECT 1"})
        conn.send(whole[:-1] + b",")  # the body's last brace a comma: not JSON
        lines, body = conn.response()
        assert (lines[0], json.loads(body)["errors"][0]["code"]) == (
            "HTTP/1.1 400 Bad Request",
            1040,
        )
        for _ in range(2):  # a login, then a remembered one: refused by the same privilege check
            lines, body = conn.post(env.reader, {"statement": st, "args": [mine[0]]})
            assert (lines[0], json.loads(body)["errors"][0]["code"]) == (
                "HTTP/1.1 403 Forbidden",
                13014,
            )
        lines, body = conn.post(basic("admin", "wrong"), {"statement": st, "args": [mine[0]]})
        assert lines[0] == "HTTP/1.1 401 Unauthorized"
        # two requests in one write: both read by the task, answered in order
        conn.send(
            b"".join(
                post_bytes(env.port, env.auth, {"statement": st, "args": [k]}) for k in mine[:2]
            )
        )
        for k in mine[:2]:
            assert json.loads(conn.response()[1])["results"] == [DOCS[k]["name"]]
        # A local key lookup sent while the task still runs the one before (a long text:
        # parsed in a worker thread for a second or more, the loop free meanwhile): the
        # task's too, answered in order.
        slow = f"{st} WHERE name NOT IN [{', '.join(repr(f'x{i}') for i in range(20_000))}]"
        conn.send(post_bytes(env.port, env.auth, {"statement": slow, "args": [mine[0]]}))
        # the next one sent once the task has taken the first (its count moves as it starts)
        wait_for(lambda: _served(env)[1] == before[1] + 11, 30, what="the slow request taken")
        conn.send(post_bytes(env.port, env.auth, {"statement": st, "args": [mine[1]]}))
        for k in mine[:2]:
            assert json.loads(conn.response()[1])["results"] == [DOCS[k]["name"]]
        # every one of them the task's (the refused login never reached the query service)
        assert _served(env) == (before[0], before[1] + 12)
        lines, body = conn.post(env.auth, {"statement": st, "args": [mine[2]]})
        assert json.loads(body)["results"] == [DOCS[mine[2]]["name"]]
        assert _served(env) == (before[0] + 1, before[1] + 12)
    finally:
        conn.close()


def _read(conn: KeepAlive, env: Env) -> tuple[float, float]:
    """The node's HTTP requests read whole in the receive callback and by the reader,
    scraped on ``conn`` (the scrape is one of the first: it counts itself)."""
    conn.send(
        f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{env.port}\r\n"
        f"Authorization: {env.auth['Authorization']}\r\n\r\n".encode()
    )
    s = samples(conn.response()[1].decode())
    name = "shardex_http_requests_read_total"
    return value(s, name, by="receive"), value(s, name, by="reader")


def _bare_lf(request: bytes) -> bytes:
    """``request`` with its head's lines ended by a bare LF: read by the stream reader."""
    head, body = request.split(b"\r\n\r\n", 1)
    return head.replace(b"\r\n", b"\n") + b"\n\n" + body


def test_a_request_parsed_on_receive_is_answered_as_one_read_by_the_reader(env: Env) -> None:
    """A whole request taken in the receive callback and handed to the connection's task
    parsed (its parameters and remembered user) is answered as the same request read by the
    stream reader: statements that are not key lookups, another node's key, each kind of
    error, a login and a remembered one refused a privilege, an active-requests listing."""
    theirs = _keys_of(env, "node1", sorted(DOCS))[0]
    rows = [{"a": 2, "b": "x"}, {"a": 1, "b": "y"}]
    cases: list[tuple[dict[str, str], dict[str, Any]]] = [
        (env.auth, {"statement": "SELECT x.a, $2 AS c FROM ($1) AS x ORDER BY x.a",
                    "args": [rows, "z"], "client_context_id": "ctx-hand"}),
        (env.auth, {"statement": "SELECT RAW x FROM ($xs) AS x", "$xs": [3, 1], "metrics": False,
                    "signature": False, "timeout": "10s", "scan_consistency": "request_plus"}),
        (env.auth, {"statement": f"SELECT name FROM {KS} USE KEYS $1", "args": [theirs]}),
        (env.auth, {"statement": "SELECT 1", "bogus": 1}),
        (env.auth, {"statement": "SELEC 1"}),
        (env.auth, {"statement": "SELECT $1 AS a"}),
        (env.auth, {"statement": f"UPSERT INTO {KS} (KEY, VALUE) VALUES ('r', {{}})",
                    "readonly": True}),
        (env.reader, {"statement": f"SELECT name FROM {KS} USE KEYS $1", "args": [theirs]}),
        (env.reader, {"statement": f"SELECT name FROM {KS} USE KEYS $1", "args": [theirs]}),
    ]  # fmt: skip
    conn = KeepAlive(env.port)
    try:
        # a connection's first request can come before its task waits for one: the reader's
        conn.post(env.auth, {"statement": "SELECT 1"})
        for auth, params in cases:
            before = _read(conn, env)
            quick = conn.post(auth, params)
            slow_request = _bare_lf(post_bytes(env.port, auth, params))
            conn.send(slow_request)
            slow = conn.response()
            # this request (and the scrape) read whole on receive, the bare-LF one by the reader
            assert _read(conn, env) == (before[0] + 2, before[1] + 1), params
            assert quick[0][0] == slow[0][0], (params, quick, slow)
            assert _masked(*quick) == _masked(*slow), params
        listing = post_bytes(env.port, env.auth, {}).replace(
            b"POST /query/service", b"GET /admin/active_requests"
        )
        conn.send(listing)
        quick = conn.response()
        conn.send(_bare_lf(listing))
        slow = conn.response()
        assert quick[1] == slow[1] == b"[]"
        assert [x for x in quick[0] if not x.startswith("Connection")] == [
            x for x in slow[0] if not x.startswith("Connection")
        ]
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({}, 400, 1050),  # no statement
        ({"statement": "SELECT 1", "bogus": "1"}, 400, 1065),  # unknown parameter
        ({"statement": "SELECT 1", "args": "[1"}, 400, 1040),  # args not JSON text
        ({"statement": "SELECT 1", "timeout": "soon"}, 400, 1040),
        ({"statement": "SELECT 1", "scan_consistency": "statement_plus"}, 400, 1030),
        ({"statement": "SELECT 1", "scan_consistency": "at_plus"}, 400, 1050),  # no vector
        ({"statement": "SLECT name FROM people"}, 400, 3000),  # syntax
        ({"statement": "SELECT name FROM nowhere USE KEYS 'a'"}, 404, 12003),
        ({"statement": "SELECT $1 AS a"}, 400, 1040),  # a parameter not given
    ],
)
def test_request_errors_have_their_status_and_code(
    env: Env, params: dict[str, str], status: int, code: int
) -> None:
    a = form(env.url, env.auth, **params)
    assert (a.status, a.codes, a.body["status"]) == (status, [code], "fatal"), a.body
    assert a.body["metrics"]["errorCount"] == 1 and a.body["results"] == []


def test_http_level_errors(env: Env) -> None:
    bad_json = call(
        env.url,
        data=b'{"statement": "SELECT 1",',
        headers={**env.auth, "Content-Type": "application/json"},
    )
    assert (bad_json.status, bad_json.codes) == (400, [1040])
    assert "JSON" in bad_json.body["errors"][0]["msg"]
    big = call(env.url, data=b"statement=" + b"a" * (5 << 20), headers=env.auth)
    assert (big.status, big.codes) == (413, [1130])
    assert "over the limit" in big.body["errors"][0]["msg"]
    tall = call(env.url, data=b"statement=SELECT+1", headers={**env.auth, "X-Pad": "a" * 20_000})
    assert (tall.status, tall.codes) == (431, [1130])
    put = call(env.url, data=b"", headers=env.auth, method="PUT")
    assert (put.status, put.codes, put.headers["Allow"]) == (405, [1010], "GET, POST")
    nowhere = call(env.url.replace("/query/service", "/nowhere"), headers=env.auth)
    assert nowhere.status == 404


def test_logins_and_privileges_are_the_rpc_paths(env: Env) -> None:
    sql = f"SELECT name FROM {KS} USE KEYS 'p001'"
    for auth in ({}, basic("admin", "wrong-password"), basic("nobody", "x")):
        a = form(env.url, auth, statement=sql)
        assert (a.status, a.codes) == (401, [10000])
        assert a.headers["WWW-Authenticate"].startswith("Basic")
    # query_select on another keyspace only: the RPC path's refusal, word for word
    a = form(env.url, env.reader, statement=sql)
    assert (a.status, a.codes) == (403, [13014])
    addresses = [f"127.0.0.1:{env.cluster.base_port + i}" for i in range(3)]
    with connect(addresses, username="reader", password=PW) as c, pytest.raises(ShardexError) as e:
        list(c.query(sql))
    assert a.body["errors"][0]["msg"] == e.value.message
    assert _ok(form(env.url, env.reader, statement="SELECT name FROM other USE KEYS 'x'")) == []


def _request_id(head: bytes) -> str:
    """The envelope's first line: ``{"requestID": ..., ..., "signature": {...},``."""
    first = head.split(b"\n", 1)[0].rstrip(b",")
    return str(json.loads(first + b"}")["requestID"])


def _state(env: Env, request_id: str) -> str | None:
    listed = call(env.active, headers=env.auth).body
    assert isinstance(listed, list)
    return next((r["state"] for r in listed if r["requestID"] == request_id), None)


def test_a_delete_stops_a_statement_mid_stream(env: Env) -> None:
    conn, resp = open_stream(env.port, env.auth, {**LONG, "client_context_id": "long"})
    try:
        assert resp.status == 200 and resp.getheader("Transfer-Encoding") == "chunked"
        head = resp.read1(65536)  # the first rows arrived; nothing more is read for now
        rid = _request_id(head)
        listed = call(env.active, headers=env.auth).body
        mine = [r for r in listed if r["requestID"] == rid]
        assert mine and mine[0]["clientContextID"] == "long" and mine[0]["state"] == "running"
        # the stalled stream holds no one else up
        assert _ok(
            form(env.url, env.auth, statement=f"SELECT RAW age FROM {KS} USE KEYS 'p042'")
        ) == [42]
        # another user neither sees nor stops it
        assert call(env.active, headers=env.reader).body == []
        denied = call(f"{env.active}/{rid}", headers=env.reader, method="DELETE")
        assert denied.status == 404
        stopped = call(f"{env.active}/{rid}", headers=env.auth, method="DELETE")
        assert stopped.status == 200
        body = json.loads(head + resp.read())
    finally:
        conn.close()
    assert body["status"] == "stopped" and [e["code"] for e in body["errors"]] == [1181]
    assert body["metrics"]["resultCount"] == len(body["results"]) < len(LONG["args"][0])
    wait_for(lambda: _state(env, rid) is None, 30, what="the stopped request to end")


def test_a_timeout_stops_a_statement_mid_stream(env: Env) -> None:
    conn, resp = open_stream(env.port, env.auth, {**LONG, "timeout": "1s"})
    try:
        head = resp.read1(65536)
        rid = _request_id(head)
        wait_for(lambda: _state(env, rid) == "timeout", 30, what="the request's timeout")
        body = json.loads(head + resp.read())
    finally:
        conn.close()
    assert body["status"] == "timeout"
    assert body["errors"] == [{"code": 1080, "msg": "Timeout 1s exceeded"}]
    assert body["metrics"]["resultCount"] == len(body["results"]) < len(LONG["args"][0])


def test_a_client_that_leaves_mid_stream_stops_its_statement(env: Env) -> None:
    conn, resp = open_stream(env.port, env.auth, LONG)
    rid = _request_id(resp.read1(65536))
    conn.close()  # gone without reading the rest
    wait_for(lambda: _state(env, rid) is None, 60, what="the abandoned request to end")
    assert _ok(form(env.url, env.auth, statement="SELECT 1 AS one")) == [{"one": 1}]


def test_a_tls_cluster_serves_https_with_the_node_certificate(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "c", nodes=1, extra=("--tls",)) as c:
        path = Path(c.path)
        port = http_port(path)
        auth = basic("admin", (path / "admin-password").read_text().strip())
        ctx = ssl.create_default_context(cafile=str(path / "certs" / "ca.pem"))
        a = call(
            f"https://127.0.0.1:{port}/query/service",
            data=b"statement=SELECT+1+AS+one",
            headers=auth,
            context=ctx,
        )
        assert _ok(a) == [{"one": 1}]
        with pytest.raises(OSError):  # plain HTTP gets no answer from a TLS port
            call(f"http://127.0.0.1:{port}/query/service", data=b"statement=SELECT+1", headers=auth)


def test_cluster_start_gives_a_node_whose_http_port_is_taken_a_free_one(tmp_path: Path) -> None:
    base = free_base_port(1)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", base + HTTP_PORT_OFFSET))  # node1's HTTP port, someone else's
    blocker.listen()
    path = tmp_path / "c"
    try:
        proc = run_cli(
            "cluster", "start", "--no-pipeline", "--dir", str(path), "--nodes", "1",
            "--base-port", str(base),
        )  # fmt: skip
        port = http_port(path)
        assert port != base + HTTP_PORT_OFFSET and f"it serves on {port}" in proc.stderr
        assert f"http_port = {port}" in (path / "node1" / "node.toml").read_text()
        auth = basic("admin", (path / "admin-password").read_text().strip())
        url = f"http://127.0.0.1:{port}/query/service"
        assert _ok(form(url, auth, statement="SELECT 1 AS one")) == [{"one": 1}]
    finally:
        blocker.close()
        run_cli("cluster", "stop", "--dir", str(path), "--timeout", "5", check=False)
        kill_leftovers(path)
