"""Principals and grants over a real two-node cluster: a principal reads its granted tables
and is refused the others on every path -- typed queries, key lookups, SQL with joins and
subqueries, Arrow, push, the client, listings, a member's routed sub-request -- tokens
rotate without a restart, and the audit log says who read what."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from sparkiq import Client, ForbiddenError, KeyQuery, Node, StateQueryRequest
from sparkiq.cluster.nodeauth import REQUEST_HEADER, NodeKey
from sparkiq.testing import wait_until
from sparkiq.wire import protocol
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import FAST, settle

SECRET = "the-nodes-own-secret"
ANALYST = "analyst-token-0001"
ADMIN = "admin-token-000001"
ROWS = {f"k{i}": i for i in range(12)}

PRINCIPALS = f"""
[principals.analyst]
tokens = ["{ANALYST}"]
tables = ["sales*"]

[principals.admin]
tokens = ["{ADMIN}"]
tables = ["*"]
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Node], Path]]:
    where = tmp_path_factory.mktemp("grants")
    state_dir = str(where / "state")
    for table in ("sales", "payroll"):
        write_batch(make_table(state_dir, table, partitions=4), 0, ROWS)
    principals = where / "principals.toml"
    principals.write_text(PRINCIPALS)
    settings: dict[str, Any] = FAST | {
        "cluster_secret": SECRET,
        "principals": str(principals),
        "standbys": 0,
    }
    n0 = Node(
        state_dir, node_id="n0", listen="127.0.0.1:0", peers=[], pg_listen="127.0.0.1:0",
        audit_log=str(where / "audit.log"), **settings,
    ).start()  # fmt: skip
    n1 = Node(state_dir, node_id="n1", listen="127.0.0.1:0", peers=[n0.url or ""], **settings)
    n1.start()
    settle([n0, n1])
    yield [n0, n1], where
    n1.stop()
    n0.stop()


def http(token: str) -> httpx.Client:
    return http_calls.new_client(headers={"authorization": f"Bearer {token}"}, timeout=30)


def test_every_path_refuses_what_is_not_granted(cluster: tuple[list[Node], Path]) -> None:
    nodes, _ = cluster
    for node in nodes:
        url = node.url
        with http(ANALYST) as analyst, http(ADMIN) as admin:
            for client, allowed in ((analyst, False), (admin, True)):
                key = client.get(f"{url}/stores/payroll/keys/k3")
                typed = client.post(
                    f"{url}/stores/payroll/query", json={"query": {"type": "range"}}
                )
                chart = client.get(f"{url}/charts/payroll/queries")
                for answer in (key, typed, chart):
                    assert answer.status_code == (200 if allowed else 403), answer.text
                statements = [
                    "SELECT k, n FROM payroll",
                    "SELECT s.k FROM sales s JOIN payroll p ON s.k = p.k",
                    "SELECT k FROM sales WHERE k IN (SELECT k FROM payroll)",
                    "EXPLAIN SELECT k FROM payroll",
                ]
                for text in statements:
                    answer = client.post(f"{url}/query", json={"sql": text})
                    assert answer.status_code == (200 if allowed else 403), (text, answer.text)
                    if not allowed:
                        error = answer.json()["error"]
                        assert error["code"] == "forbidden" and "'payroll'" in error["message"]
                arrow = client.post(
                    f"{url}/query",
                    json={"sql": "SELECT * FROM payroll"},
                    headers={"accept": "application/vnd.apache.arrow.stream"},
                )
                assert arrow.status_code == (200 if allowed else 403)
                if not allowed:
                    push = client.post(
                        f"{url}/query", json={"sql": "SELECT * FROM payroll EMIT CHANGES"}
                    )
                    assert push.status_code == 403, push.text
            # what is granted reads as always, whichever node holds each key
            granted = analyst.post(f"{url}/query", json={"sql": "SELECT k, n FROM sales"})
            rows = granted.json()["rows"]
            assert sorted((r["k"], r["n"]) for r in rows) == sorted(ROWS.items())
            for key, n in ROWS.items():
                assert analyst.get(f"{url}/stores/sales/keys/{key}").json()["row"]["n"] == n
            listed = [s["name"] for s in analyst.get(f"{url}/stores").json()["stores"]]
            assert listed == ["sales"]
            stats = analyst.get(f"{url}/stats").json()
            assert {p["store"] for p in stats["partitions"]} <= {"sales"}
            assert set(stats["gauges"]) == set(stats["queries"]) == {"sales"}  # payroll: queried
            assert analyst.get(f"{url}/charts/sales/lag").status_code == 200
            assert sorted(s["name"] for s in admin.get(f"{url}/stores").json()["stores"]) == [
                "payroll",
                "sales",
            ]


def test_the_client_is_refused_as_its_principal(cluster: tuple[list[Node], Path]) -> None:
    nodes, _ = cluster
    with Client([n.url or "" for n in nodes], token=ANALYST) as client:
        assert client.get("sales", "k2") == {"k": "k2", "n": 2}
        with pytest.raises(ForbiddenError, match="'analyst' may not read 'payroll'"):
            client.get("payroll", "k2")
        with pytest.raises(ForbiddenError):
            client.sql("SELECT count(*) FROM payroll")
        request = StateQueryRequest.in_store("payroll").with_query(KeyQuery.with_key("k1"))
        with pytest.raises(ForbiddenError):
            client.query(request)


def test_a_member_applies_the_grants_of_the_caller_it_routes_for(
    cluster: tuple[list[Node], Path],
) -> None:
    """A sub-request signed by a member for principal 'analyst' reads 'sales' and is
    refused 'payroll'; one for a principal the node does not know is refused too."""
    nodes, _ = cluster
    key = NodeKey(SECRET)

    def sub_request(store: str, principal: str) -> httpx.Response:
        request = StateQueryRequest.in_store(store).with_query(KeyQuery.with_key("k1"))
        body = protocol.encode_request(request, local=True)
        signed = key.sign_request("n1", "POST", "/internal/query", body, principal)
        headers = {"content-type": protocol.CONTENT_TYPE, REQUEST_HEADER: signed.header}
        return http_calls.post(f"{nodes[0].url}/internal/query", content=body, headers=headers)

    assert sub_request("sales", "analyst").status_code == 200
    refused = sub_request("payroll", "analyst")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    stranger = sub_request("sales", "nobody")
    assert stranger.status_code == 403 and "does not know" in stranger.text


def test_tokens_rotate_without_a_restart(cluster: tuple[list[Node], Path]) -> None:
    nodes, where = cluster
    path = where / "principals.toml"
    rotated = "analyst-token-0002"
    try:
        text = PRINCIPALS.replace(f'tokens = ["{ANALYST}"]', f'tokens = ["{ANALYST}", "{rotated}"]')
        path.write_text(text)
        stamp = time.time_ns() + 2_000_000_000
        os.utime(path, ns=(stamp, stamp))
        deadline = time.monotonic() + 30
        with http(rotated) as client:
            while client.get(f"{nodes[0].url}/stores").status_code != 200:
                assert time.monotonic() < deadline, "the new token was never accepted"
                time.sleep(0.2)
        with http(ANALYST) as client:  # both are valid while clients move over
            assert client.get(f"{nodes[0].url}/stores").status_code == 200
    finally:
        path.write_text(PRINCIPALS)
        stamp = time.time_ns() + 4_000_000_000
        os.utime(path, ns=(stamp, stamp))


def test_the_audit_log_says_who_read_what(cluster: tuple[list[Node], Path]) -> None:
    nodes, where = cluster
    with http(ANALYST) as analyst:
        analyst.post(f"{nodes[0].url}/query", json={"sql": "SELECT k FROM sales WHERE n < 3"})
        analyst.post(f"{nodes[0].url}/query", json={"sql": "SELECT k FROM payroll"})
    with http("not-a-token-at-all") as stranger:
        stranger.get(f"{nodes[0].url}/stores/sales/keys/k1")

    def lines_read() -> list[dict[str, Any]]:
        return [json.loads(line) for line in (where / "audit.log").read_text().splitlines()]

    # A request's line is written once its answer is sent (its size and status are known
    # then), on the server's thread: the client can hold the last answer before its line is
    # in the file. The requests before it are logged by then: one event loop serves them.
    wait_until(
        lambda: any(e["status"] == 401 for e in lines_read()),
        timeout=30,
        message="the refused request's line never reached the audit log",
    )
    lines = lines_read()
    assert {line["node"] for line in lines} == {"n0"}  # members' sub-requests are not logged
    read = [e for e in lines if e["kind"] == "/query" and e["status"] == 200]
    assert any(
        e["principal"] == "analyst" and e["tables"] == ["sales"] and e["rows"] == 3 for e in read
    )
    assert any(e["principal"] == "analyst" and e["status"] == 403 for e in lines)
    assert any(e["principal"] is None and e["status"] == 401 for e in lines)
    assert all({"ts", "peer", "ms"} <= set(e) for e in lines)


def test_postgres_users_are_principals_with_their_grants(
    cluster: tuple[list[Node], Path],
) -> None:
    """psycopg logs in with SCRAM as a principal; its statements and the catalogs it reads
    (information_schema, pg_class, psql's \\dt query) know only its tables."""
    nodes, where = cluster
    host, port = nodes[0].pg_address or ("", 0)

    def connect(user: str, password: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host=host, port=port, user=user, password=password, dbname="sparkiq",
            autocommit=True, require_auth="scram-sha-256",
        )  # fmt: skip

    with connect("analyst", ANALYST) as analyst:
        rows = analyst.execute("SELECT k, n FROM sales ORDER BY n").fetchall()
        assert rows == sorted(ROWS.items(), key=lambda item: item[1])
        for text in ("SELECT k FROM payroll", "SELECT s.k FROM sales s, payroll p"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="'payroll'"):
                analyst.execute(text)
        listed = analyst.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
        assert listed == [("sales",)]
        classes = analyst.execute(
            "SELECT relname FROM pg_catalog.pg_class WHERE relkind = 'r'"
        ).fetchall()
        assert "payroll" not in {r[0] for r in classes} and "sales" in {r[0] for r in classes}
    with connect("admin", ADMIN) as admin:
        listed = admin.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
            "ORDER BY 1"
        ).fetchall()
        assert listed == [("payroll",), ("sales",)]
        assert admin.execute("SELECT count(*) FROM payroll").fetchone() == (len(ROWS),)
    for user, password in (("analyst", ADMIN), ("nobody", ANALYST)):
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            connect(user, password)
    audit = [json.loads(line) for line in (where / "audit.log").read_text().splitlines()]
    statements = [e for e in audit if e["listener"] == "pg"]
    assert any(
        e["principal"] == "analyst" and e["tables"] == ["sales"] and e["status"] == "00000"
        for e in statements
    ), statements
    assert any(e["principal"] == "analyst" and e["status"] == "42501" for e in statements)
