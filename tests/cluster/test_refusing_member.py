"""A member that refuses this node's credential, and a node that cannot answer: the cluster's
healthy nodes and its clients go around them.

Three nodes over HTTP on 127.0.0.1 with a token and the cluster secret; ``n1`` checks node
credentials against a wall clock 400 s ahead (``RequestVerifier``'s clock: a host whose
clock was stepped past ``MAX_SKEW``, seen from the receiving side), so it refuses every
node-protocol request, "synchronize the nodes' clocks", while its own requests pass: its
heartbeats keep it live in the others' views, so they keep routing to it -- the steady form
of the window a skewed host opens before the detectors part the cluster. Values are checked
against the rows written to the table.

The nodes run ``membership="heartbeats"``: that premise is heartbeats'. Under gossip the
others' probes of ``n1`` are refused, so they suspect it, and it refutes when its own probes
tell it so: it goes in and out of their views (docs/design.md, "Gossip made the default").
A whole host skewed past the window is tests/hosts' case, under either protocol."""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from sparkiq import Client, KeyQuery, Node, StateQueryRequest
from sparkiq.cluster.nodeauth import RequestVerifier
from sparkiq.errors import AuthenticationError, ErrorCode
from sparkiq.query.result import FailureReason
from sparkiq.wire.protocol import RemoteError
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import start_http_cluster

TOKEN = "clients-token"
ROWS = {f"k{i}": i for i in range(40)}
PARTITIONS = 8
SKEW = 400.0  # past nodeauth.MAX_SKEW (300 s)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    state_dir = str(tmp_path_factory.mktemp("refusing"))
    write_batch(make_table(state_dir, partitions=PARTITIONS), 0, ROWS)
    nodes = start_http_cluster(state_dir, 3, token=TOKEN, standbys=1, membership="heartbeats")
    try:
        coordinator = nodes[1].coordinator
        assert coordinator is not None and coordinator.verifier is not None
        coordinator.verifier = RequestVerifier(
            coordinator.verifier.key, clock=lambda: time.time() + SKEW
        )
        yield nodes
    finally:
        for node in reversed(nodes):
            node.stop()


def key_request(key: str) -> StateQueryRequest:
    return StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(key))


def replicas(node: Node, key: str) -> tuple[str, ...]:
    coordinator = node.coordinator
    assert coordinator is not None
    return coordinator.assignment.replicas("t", node.partition_for_key("t", key))


def test_a_healthy_node_asks_another_replica_past_a_member_refusing_it(
    nodes: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    """(The module's first test: the first to route to n1.) n0 asks n1 first for the
    partitions n1 is active for and n0 hosts no replica of; refused, it asks n2 at once,
    says why once, and asks n1 last from then on."""
    n0 = nodes[0]
    past = [k for k in ROWS if replicas(n0, k) == ("n1", "n2")]
    assert past, "rendezvous gave n1 no partition that only n1 and n2 host"
    with caplog.at_level(logging.WARNING, logger="sparkiq.router"):
        for key, value in ROWS.items():
            result = n0.query(key_request(key)).only_partition_result()
            assert result.is_success, (key, result.failure_message)
            assert result.result is not None and result.result["n"] == value
    said = [r.getMessage() for r in caplog.records if "refuses this node" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("n1 refuses")
    assert "+400 s off this node's clock" in said[0] and "synchronize the nodes' clocks" in said[0]
    router = n0.coordinator.router  # type: ignore[union-attr]
    for key in past:
        assert router.candidates("t", n0.partition_for_key("t", key), False)[-1] == "n1"


def test_a_partition_nobody_answers_names_the_refusal(nodes: list[Node]) -> None:
    """require_active() leaves n0 one candidate for n1's partitions, n1 itself: the
    partition's failure says n1 refused n0, and why, instead of a bare NOT_PRESENT."""
    n0 = nodes[0]
    key = next(k for k in ROWS if replicas(n0, k)[0] == "n1")
    result = n0.query(key_request(key).require_active()).only_partition_result()
    assert result.failure_reason is FailureReason.NOT_PRESENT
    message = result.failure_message or ""
    assert "n1 refused it" in message and "off this node's clock" in message, message


def test_a_client_with_both_urls_reads_every_key(nodes: list[Node]) -> None:
    """A client whose first node cannot reach the only replica a request allows (n0, for
    n1's partitions read require_active) asks its next node; plain reads are answered by
    either. Every value is the table's."""
    urls = [nodes[0].url or "", nodes[1].url or ""]
    with Client(urls, TOKEN) as client:
        for key, value in ROWS.items():
            assert client.get("t", key) == {"k": key, "n": value}
            active = client.query(key_request(key).require_active()).only_partition_result()
            assert active.is_success, (key, active.failure_message)
            assert active.result == {"k": key, "n": value}
        rows = client.sql("SELECT count(*) AS c, sum(n) AS s FROM t").rows
        assert rows == [{"c": len(ROWS), "s": sum(ROWS.values())}]


def test_a_bad_client_token_is_still_refused(nodes: list[Node]) -> None:
    """The caller's own token is judged by the node it asks, as before: 401, by any node."""
    urls = [node.url or "" for node in nodes[:2]]
    with Client(urls, "not-the-token") as client, pytest.raises(AuthenticationError) as raised:
        client.get("t", "k1")
    assert raised.value.code is ErrorCode.UNAUTHORIZED
    for node in nodes[:2]:
        answer = http_calls.get(f"{node.url}/stores", headers={"authorization": "Bearer nope"})
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "unauthorized"


class CannotAnswer:
    """An HTTP server on 127.0.0.1 that answers every request as a node that cannot answer
    now does: ``status`` with error ``code`` (it stands for a node whose peers refuse it)."""

    def __init__(self, status: int, code: str) -> None:
        self.asked = 0
        body = orjson.dumps({"error": {"code": code, "message": f"{code}: cannot answer now"}})
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                server.asked += 1
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def unavailable() -> Iterator[tuple[CannotAnswer, CannotAnswer]]:
    servers = (CannotAnswer(503, "unavailable"), CannotAnswer(502, "upstream_unavailable"))
    yield servers
    for server in servers:
        server.close()


def test_a_client_asks_its_next_node_when_one_cannot_answer(
    nodes: list[Node], unavailable: tuple[CannotAnswer, CannotAnswer], tmp_path: Path
) -> None:
    """``unavailable`` and ``upstream_unavailable`` answers send the client to its next node
    (typed reads, SQL and metadata); with every node failing, the first answer is raised with
    a note naming the others; a client with one URL raises that node's answer as it is."""
    down, cut_off = unavailable
    urls = [down.url, cut_off.url, nodes[2].url or ""]
    with Client(urls, TOKEN) as client:
        for key, value in list(ROWS.items())[:5]:
            assert client.get("t", key) == {"k": key, "n": value}
        assert client.sql("SELECT count(*) AS c FROM t").rows == [{"c": len(ROWS)}]
    assert down.asked >= 1 and cut_off.asked >= 1
    with Client([down.url, cut_off.url], TOKEN) as client, pytest.raises(RemoteError) as raised:
        client.get("t", "k1")
    assert raised.value.code is ErrorCode.UNAVAILABLE
    assert raised.value.message == "503: unavailable: cannot answer now"
    assert cut_off.url in "".join(raised.value.__notes__)
    for server, code in ((down, ErrorCode.UNAVAILABLE), (cut_off, ErrorCode.UPSTREAM_UNAVAILABLE)):
        with Client(server.url, TOKEN) as client, pytest.raises(RemoteError) as raised:
            client.sql("SELECT 1")
        assert raised.value.code is code
        assert not getattr(raised.value, "__notes__", None)
