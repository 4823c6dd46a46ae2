"""What a web page can make a node do, against a real node without a token (as ``sparkiq
demo`` runs) on 127.0.0.1: a rebound DNS name reads nothing (Host check), and a
cross-origin page's POSTs are refused (content type and Origin).

Requests are sent as a browser would send them (httpx with the headers Chromium puts on
them): a DNS rebinding page's requests are plain same-origin requests whose Host is the
attacker's name; a no-cors POST carries a safelisted content type and the page's Origin.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sparkiq import Client, Node
from sparkiq.query.queries import RangeQuery
from sparkiq.query.request import StateQueryRequest
from sparkiq.wire.values import pack
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import start_http_cluster
from tests.cluster.serve_processes import ServeProcess, free_port
from tests.cluster.test_membership import beat

pytestmark = pytest.mark.timeout(180)

ROW = {"k": "a", "n": 1}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    state_dir = str(tmp_path_factory.mktemp("browser"))
    write_batch(make_table(state_dir, partitions=2), 0, {"a": 1, "b": 2})
    (node,) = start_http_cluster(state_dir, 1, allowed_hosts="sparkiq.test, *.corp.test")
    yield node
    node.stop()


def port_of(node: Node) -> int:
    assert node.url is not None
    return int(node.url.rsplit(":", 1)[1])


def get(node: Node, path: str, host: str, **headers: str) -> httpx.Response:
    return http_calls.get(f"{node.url}{path}", headers={"host": host, **headers}, timeout=30)


def test_a_rebound_dns_name_reads_nothing(node: Node) -> None:
    port = port_of(node)
    assert get(node, "/stores/t/keys/a", f"127.0.0.1:{port}").json()["row"] == ROW
    for path in ("/stores/t/keys/a", "/stores", "/metadata", "/", "/readyz", "/healthz"):
        response = get(node, path, f"evil.example:{port}")
        assert response.status_code == 421, (path, response.text)
        error = response.json()["error"]
        assert error["code"] == "host_not_allowed" and error["field"] == "host"
        assert "'evil.example:" in error["message"] and "allowed_hosts" in error["message"]
        assert "SPARKIQ_ALLOWED_HOSTS" in error["message"]
        assert '"n":1' not in response.text and "sparkiq console" not in response.text
    # the node protocol too: a rebound page is same-origin, it may send any content type
    heartbeat = http_calls.post(
        f"{node.url}/internal/heartbeat",
        content=b"\x80",
        headers={"host": "evil.example", "content-type": "application/x-sparkiq-v1"},
    )
    assert heartbeat.status_code == 421
    # malformed Host values are no host this node answers
    for host in ("", "evil.example:x", "[::1", "a:1:2"):
        assert get(node, "/stores/t/keys/a", host).status_code == 421, host


def test_a_request_without_a_host_header_is_answered(node: Node) -> None:
    """HTTP/1.0 needs no Host, and no browser omits it: nothing to guard against."""
    with socket.create_connection(("127.0.0.1", port_of(node)), timeout=30) as conn:
        conn.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b'"status":"ok"' in answer


def test_loopback_addresses_own_names_and_configured_names_are_answered(node: Node) -> None:
    port = port_of(node)
    hosts = [
        f"localhost:{port}",
        "localhost",
        "LOCALHOST.:1",  # any port, any case, a trailing dot
        f"127.0.0.1:{port}",
        "[::1]:8081",
        "10.1.2.3:8081",  # an address (what a Kubernetes probe sends: the pod's IP)
        "sparkiq.test",  # allowed_hosts
        "a.corp.test:443",  # *.corp.test
        "x.y.corp.test",
    ]
    for host in hosts:
        response = get(node, "/stores/t/keys/a", host)
        assert response.status_code == 200, (host, response.text)
        assert response.json()["row"] == ROW
    for host in ("corp.test", "sparkiq.test.evil.example", "evilcorp.test"):
        assert get(node, "/stores/t/keys/a", host).status_code == 421, host


def test_a_star_answers_every_name(tmp_path: Path) -> None:
    write_batch(make_table(str(tmp_path), partitions=1), 0, {"a": 1})
    with Node(str(tmp_path), listen="127.0.0.1:0", allowed_hosts=["*"]) as node:
        node.poll_once()
        response = get(node, "/stores/t/keys/a", "anything.example:1")
        assert response.status_code == 200 and response.json()["row"] == ROW


def test_the_advertised_host_is_answered(tmp_path: Path) -> None:
    write_batch(make_table(str(tmp_path), partitions=1), 0, {"a": 1})
    port = free_port()
    node = Node(
        str(tmp_path),
        listen=f"127.0.0.1:{port}",
        advertise=f"http://node-7.sparkiq.internal:{port}",
        peers=[],
    )
    with node:
        url = f"http://127.0.0.1:{port}"
        answered = http_calls.get(
            f"{url}/healthz", headers={"host": f"node-7.sparkiq.internal:{port}"}, timeout=30
        )
        assert answered.status_code == 200 and answered.json()["status"] == "ok"
        refused = http_calls.get(f"{url}/healthz", headers={"host": "node-8.sparkiq.internal"})
        assert refused.status_code == 421


def test_sparkiq_serve_takes_allowed_hosts_from_its_flag_then_its_variable(
    tmp_path: Path,
) -> None:
    write_batch(make_table(str(tmp_path), partitions=1), 0, {"a": 1})
    logs = tmp_path / "logs"
    logs.mkdir()
    served = []
    for extra, env in (
        (["--allowed-host", "flag.test", "--allowed-host", "*.flags.test"], "env.test"),
        ([], "env.test,*.envs.test"),
    ):
        process = ServeProcess(
            str(tmp_path),
            f"n{len(served)}",
            free_port(),
            [],
            str(logs),
            extra=extra,
            SPARKIQ_ALLOWED_HOSTS=env,
        )
        served.append(process)
        process.start()
    try:
        by_flag, by_variable = served
        for process in served:
            process.wait_up()

        def status(process: ServeProcess, host: str) -> int:
            return http_calls.get(f"{process.url}/healthz", headers={"host": host}).status_code

        # a flag wins over the variable, as for every option
        assert [status(by_flag, h) for h in ("flag.test", "a.flags.test", "env.test")] == [
            200,
            200,
            421,
        ]
        assert [status(by_variable, h) for h in ("env.test", "a.envs.test", "flag.test")] == [
            200,
            200,
            421,
        ]
    finally:
        for process in served:
            process.stop()


def test_a_bad_allowed_host_is_refused_with_what_to_give(tmp_path: Path) -> None:
    from sparkiq.errors import ConfigError

    for bad in ("http://sparkiq.test", "sparkiq.test:8081", "a/b", "*.*"):
        with pytest.raises(ConfigError, match=r"not a host name.*without scheme or port"):
            Node(str(tmp_path), allowed_hosts=[bad])


# --- cross-origin POSTs ----------------------------------------------------------------------

#: what a page on another site can POST without a preflight ("" is no content-type at all)
SIMPLE_TYPES = (
    "text/plain",
    "text/plain;charset=UTF-8",  # what fetch() sends for a string body
    "application/x-www-form-urlencoded",  # a <form>, and curl -d
    "multipart/form-data; boundary=x",
    "Text/Plain ; charset=utf-8",
    "",
)
SQL = b'{"sql": "SELECT k, n FROM t WHERE k = \'a\'"}'


def post(node: Node, path: str, body: bytes, content_type: str, **headers: str) -> httpx.Response:
    sent = dict(headers)
    if content_type:
        sent["content-type"] = content_type
    return http_calls.post(f"{node.url}{path}", content=body, headers=sent, timeout=30)


def test_a_post_a_page_can_send_without_a_preflight_is_refused(node: Node) -> None:
    assert node.coordinator is not None
    members = node.coordinator.membership.members()
    rogue = pack(beat(node_id="rogue", url="http://127.0.0.1:9"))
    bodies = {
        "/query": SQL,
        "/stores/t/query": b'{"query": {"type": "range"}}',
        "/internal/heartbeat": rogue,  # a no-cors POST joined a rogue member
        "/internal/probe": rogue,  # the same through gossip's route
        "/internal/query": b"\x80",
    }
    for path, body in bodies.items():
        for content_type in SIMPLE_TYPES:
            response = post(node, path, body, content_type, origin="http://evil.example")
            assert response.status_code == 415, (path, content_type, response.text)
            error = response.json()["error"]
            assert error["code"] == "unsupported_content_type", error
            assert error["field"] == "content-type"
            assert "content-type: application/json" in error["message"]
            assert '"n":1' not in response.text
    assert node.coordinator.membership.members() == members  # nobody joined


def test_a_post_from_another_origin_is_refused(node: Node) -> None:
    port = port_of(node)
    for origin in ("http://evil.example", f"http://localhost:{port + 1}", "null", "http://[x"):
        response = post(node, "/query", SQL, "application/json", origin=origin)
        assert response.status_code == 403, (origin, response.text)
        error = response.json()["error"]
        assert error["code"] == "cross_origin" and error["field"] == "origin"
        assert repr(origin) in error["message"]
    # the console posts same-origin, under whichever name it was loaded
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "sparkiq.test"):
        response = post(node, "/query", SQL, "application/json", origin=f"http://{host}", host=host)
        assert response.status_code == 200, (host, response.text)
        assert response.json()["rows"] == [ROW]


def test_every_caller_of_a_node_still_posts(tmp_path: Path) -> None:
    """sparkiq.Client (JSON, its binary SQL answers, the node protocol, push), nodes among
    themselves (heartbeats, routed sub-requests), and a program's plain JSON POST."""
    changelog = make_table(str(tmp_path), partitions=4)
    write_batch(changelog, 0, {f"k{i}": i for i in range(20)})
    nodes = start_http_cluster(str(tmp_path), 2, standbys=0)  # settles if heartbeats pass
    try:
        hosted = [len(n.status()) for n in nodes]
        assert sum(hosted) == 4 and all(hosted), hosted  # each hosts a share: queries route
        with Client(nodes[0].url) as client:
            rows = client.sql("SELECT k, n FROM t ORDER BY n").rows
            assert [r["n"] for r in rows] == list(range(20))
            assert client.sql("SELECT count(*) AS c FROM t", format="arrow").rows == [{"c": 20}]
            assert [client.get("t", f"k{i}") for i in (3, 17)] == [
                {"k": "k3", "n": 3},
                {"k": "k17", "n": 17},
            ]
            ranged = client.query(
                StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds())
            )
            assert sorted(
                r["n"] for p in ranged.partition_results.values() for _, r in p.result
            ) == (list(range(20)))
            with client.stream("SELECT k, n FROM t EMIT CHANGES", snapshot=True) as changes:
                first = next(iter(changes))
                assert first.row is not None and first.row["k"].startswith("k")
        answer = http_calls.post(
            f"{nodes[1].url}/stores/t/query", json={"query": {"type": "range"}}
        )
        assert answer.status_code == 200
        assert sum(len(p["rows"]) for p in answer.json()["partitions"].values()) == 20
    finally:
        for n in nodes:
            n.stop()
