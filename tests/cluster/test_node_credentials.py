"""Who may join a cluster: members prove the cluster secret, never send it, and what a
member claims is checked against what a node can see itself.

Each test plays an attacker who can reach the nodes' ports (a real HTTP server on 127.0.0.1
standing in for a rogue process) against real nodes, and checks what the attacker got and
what clients read afterwards against the table's ground truth."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pyarrow as pa
import pytest

from sparkiq import KeyQuery, Node, StateQueryRequest
from sparkiq.cluster.nodeauth import REQUEST_HEADER, NodeKey, RequestVerifier
from sparkiq.errors import AuthenticationError
from sparkiq.wire.values import pack, unpack
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import FAST, settle
from tests.cluster.serve_processes import ServeProcess, free_port
from tests.server.test_hostile import bound

TOKEN = "clients-token"
SECRET = "the-nodes-own-secret"
FORGED_BATCH = 10**15
ROWS = {f"k{i}": i for i in range(40)}


class Rogue:
    """A process that speaks the node protocol without the cluster secret: it records every
    request it receives and answers heartbeats with a forged one claiming every partition of
    ``t`` live at batch 10^15."""

    def __init__(self, partitions: int = 4) -> None:
        self.received: list[tuple[str, dict[str, str], bytes]] = []
        rogue = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                rogue.received.append((self.path, dict(self.headers.items()), body))
                reply = pack(rogue.heartbeat())
                self.send_response(200)
                self.send_header("content-type", "application/x-sparkiq-v1")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.partitions = partitions
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def heartbeat(self) -> dict[str, Any]:
        live = [FORGED_BATCH, "live", 0]
        return {
            "node_id": "rogue",
            "url": self.url,
            "started_at": time.time(),
            "members": {},
            "hosted": {"t": {str(p): live for p in range(self.partitions)}},
        }

    def announce(self, node_url: str, headers: dict[str, str]) -> httpx.Response:
        """Send the forged heartbeat to ``node_url`` as a member would."""
        headers = {"content-type": "application/x-sparkiq-v1", **headers}
        body = pack(self.heartbeat())
        return http_calls.post(f"{node_url}/internal/heartbeat", content=body, headers=headers)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def rogue() -> Iterator[Rogue]:
    server = Rogue()
    yield server
    server.close()


@pytest.fixture
def table(tmp_path: Path) -> str:
    changelog = make_table(str(tmp_path), partitions=4)
    write_batch(changelog, 0, ROWS)
    return str(tmp_path)


def _values(node: Node) -> dict[str, Any]:
    out = {}
    for key in ROWS:
        result = node.query(StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(key)))
        only = result.only_partition_result()
        assert only.is_success, only.failure_message
        out[key] = only.result["n"]
        for batches in only.position.to_map().values():
            assert max(batches.values()) < FORGED_BATCH
    return out


@pytest.mark.parametrize("membership", ["gossip", "heartbeats"])
def test_a_process_without_the_secret_cannot_join_and_gets_no_credential(
    table: str, rogue: Rogue, membership: str
) -> None:
    """A rogue at a seed address: the node's heartbeats (gossip: its join probes) reach it
    but carry neither the token nor the secret, its forged replies are dropped, and it never
    becomes a member; its own heartbeats, with the clients' token or another secret, are
    refused."""
    settings = FAST | {
        "token": TOKEN,
        "cluster_secret": SECRET,
        "standbys": 0,
        "membership": membership,
    }
    route, contacts = (
        ("/internal/heartbeat", 3) if membership == "heartbeats" else ("/internal/probe", 1)
    )  # heartbeats keep calling a seed; gossip only until a seed's ack lets it in
    n0 = Node(table, node_id="n0", listen="127.0.0.1:0", peers=[], **settings).start()
    n1 = Node(table, node_id="n1", listen="127.0.0.1:0", peers=[rogue.url, n0.url], **settings)
    try:
        n1.start()
        settle([n0, n1])
        bearer = {"authorization": f"Bearer {TOKEN}"}
        assert rogue.announce(n0.url or "", bearer).status_code == 401
        guessed = NodeKey("not-the-cluster-secret").sign_request(
            "rogue", "POST", "/internal/heartbeat", pack(rogue.heartbeat())
        )
        assert rogue.announce(n0.url or "", {REQUEST_HEADER: guessed.header}).status_code == 401
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline or len(rogue.received) < contacts:
            time.sleep(0.05)
        for node in (n0, n1):
            assert node.coordinator is not None
            assert "rogue" not in node.coordinator.membership.members()
            assert node.coordinator.membership.live() == ("n0", "n1")
        assert rogue.received, "n1 never contacted its seed"
        for path, headers, body in rogue.received:
            assert path == route
            assert "authorization" not in {h.lower() for h in headers}
            seen = repr(headers).encode() + body
            assert TOKEN.encode() not in seen and SECRET.encode() not in seen
        assert _values(n0) == _values(n1) == ROWS
    finally:
        n1.stop()
        n0.stop()


def test_an_owner_keeps_what_a_member_claims_beyond_the_changelog(table: str, rogue: Rogue) -> None:
    """Without a secret, a process on the same host may join (nothing can prove otherwise),
    but its claims are checked: a replica at a batch never committed is not caught up, so
    the owner never releases a partition to it and keeps answering from its own."""
    node = Node(
        table,
        node_id="n0",
        listen="127.0.0.1:0",
        peers=[],
        standbys=0,
        membership="heartbeats",  # the rogue speaks heartbeats
        **FAST,
    ).start()
    try:
        assert rogue.announce(node.url or "", {}).status_code == 200
        coordinator = node.coordinator
        assert coordinator is not None
        given = [
            p for p in range(4) if coordinator.assignment.active("t", p) == "rogue"
        ]  # rendezvous gives the rogue some of the partitions
        assert given, coordinator.assignment
        time.sleep(10 * FAST["release_grace"])  # many rounds, each free to release
        assert "rogue" in coordinator.membership.live()
        hosted = node._hosting.hosted_state()["t"]
        assert sorted(hosted) == [0, 1, 2, 3], hosted
        assert {p: s[0] for p, s in hosted.items()} == dict.fromkeys(range(4), 0)
    finally:
        node.stop()


def test_hearsay_cannot_fill_the_member_table_or_split_the_cluster(table: str) -> None:
    """One heartbeat naming 1,024 members, 256 of them at addresses that accept a connection
    and never answer: the names are held as hearsay (a bounded number, contacted on a lane
    of their own), so the members' own heartbeats are not held up behind them -- nobody is
    declared gone -- and a node that joins afterwards is admitted by everyone. Heartbeats
    only: gossip believes what a member says of others, as SWIM does (see docs/design.md,
    "Gossip made the default")."""
    hb = FAST | {"membership": "heartbeats"}
    n0 = Node(table, node_id="n0", listen="127.0.0.1:0", peers=[], **hb).start()
    n1 = Node(table, node_id="n1", listen="127.0.0.1:0", peers=[n0.url or ""], **hb).start()
    n2 = None
    holes = [socket.create_server(("127.0.0.1", 0), backlog=64) for _ in range(256)]
    try:
        settle([n0, n1])
        silent = [f"http://127.0.0.1:{hole.getsockname()[1]}" for hole in holes]
        dead = [f"http://127.0.0.1:{free_port()}" for _ in range(1024 - len(silent))]
        flood = {
            "node_id": "x",
            "url": f"http://127.0.0.1:{free_port()}",
            "members": {f"ghost{i}": url for i, url in enumerate(silent + dead)},
            "hosted": {},
        }
        response = http_calls.post(
            f"{n0.url}/internal/heartbeat",
            content=pack(flood),
            headers={"content-type": "application/x-sparkiq-v1"},
        )
        assert response.status_code == 200, response.text
        assert n0.coordinator is not None
        ghosts = [m for m in n0.coordinator.membership.members() if m.startswith("ghost")]
        assert len(ghosts) == 64, len(ghosts)  # the rest are not taken in
        deadline = time.monotonic() + 5.0  # two heartbeat timeouts of the silent ones
        while time.monotonic() < deadline:
            for node in (n0, n1):
                assert node.coordinator is not None
                live = node.coordinator.membership.live()
                assert {"n0", "n1"} <= set(live), f"{node.node_id} sees only {live}"
            time.sleep(0.1)
        n2 = Node(table, node_id="n2", listen="127.0.0.1:0", peers=[n0.url or ""], **hb)
        n2.start()
        settle([n0, n1, n2], timeout=30.0)
        members = n0.coordinator.membership.members()
        assert len([m for m in members if m.startswith("ghost")]) <= 64
    finally:
        for node in (n2, n1, n0):
            if node is not None:
                node.stop()
        for hole in holes:
            hole.close()


def test_arrow_in_node_protocol_bodies_is_refused_before_decoding(
    table: str, tmp_path: Path
) -> None:
    """A 256 MiB Arrow column compressed to a few KB, in a heartbeat and in a query
    sub-request to a node without a token: both are refused as malformed and the node's
    memory does not grow by what decompressing it would have cost."""
    bomb = pa.table({"x": pa.array([bytes(256 << 20)], pa.binary())})
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, bomb.schema, options=options) as writer:
        writer.write_table(bomb)
    compressed = sink.getvalue().to_pybytes()
    assert len(compressed) < 1 << 20
    del bomb
    table_ext = msgspec.msgpack.Ext(5, compressed)  # how the wire carries an Arrow table
    assert unpack(msgspec.msgpack.encode([table_ext]))[0].num_rows == 1  # it decodes in full
    heartbeat = msgspec.msgpack.encode(
        {"node_id": "x", "url": "http://127.0.0.1:1", "members": table_ext}
    )
    query = msgspec.msgpack.encode(
        {"v": 1, "store": "t", "query": {"type": "KeyQuery", "fields": {"key": table_ext}}}
    )
    port = free_port()
    node = ServeProcess(table, "n0", port, [], str(tmp_path)).start()
    stop = threading.Event()
    worst = [0.0]

    def probe() -> None:  # another caller, answered on the same event loop
        with http_calls.new_client(timeout=120) as client:
            while not stop.is_set():
                started = time.monotonic()
                assert client.get(f"{node.url}/healthz").status_code == 200
                worst[0] = max(worst[0], time.monotonic() - started)
                time.sleep(0.02)

    prober = threading.Thread(target=probe)
    try:
        node.wait_up()
        before = _peak_rss(node)
        prober.start()
        headers = {"content-type": "application/x-sparkiq-v1"}
        for path, body in (
            ("/internal/heartbeat", heartbeat),
            ("/internal/probe", heartbeat),
            ("/internal/query", query),
        ):
            answer = http_calls.post(f"{node.url}{path}", content=body, headers=headers, timeout=60)
            assert answer.status_code == 400, answer.text
        time.sleep(0.2)
        stop.set()
        prober.join()
        grown = _peak_rss(node) - before
        assert grown < 100 << 20, f"the node's peak memory grew by {grown >> 20} MiB"
        limit = bound()
        assert worst[0] < limit, f"another caller waited {worst[0]:.2f} s (bound {limit:.2f})"
    finally:
        stop.set()
        if prober.is_alive():
            prober.join()
        node.stop()


def _peak_rss(node: ServeProcess) -> int:
    assert node.process is not None
    with open(f"/proc/{node.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_signed_requests_are_bound_to_path_body_time_and_use() -> None:
    key = NodeKey(SECRET)
    verifier = RequestVerifier(key)
    body = pack({"node_id": "n1"})
    signed = key.sign_request("n 1", "POST", "/internal/heartbeat", body)
    assert verifier.verify(signed.header, "POST", "/internal/heartbeat", body).node_id == "n 1"
    with pytest.raises(AuthenticationError, match="replays"):
        verifier.verify(signed.header, "POST", "/internal/heartbeat", body)
    fresh = key.sign_request("n1", "POST", "/internal/heartbeat", body)
    for header, path, sent in (
        (fresh.header, "/internal/query", body),  # another path
        (fresh.header, "/internal/heartbeat", body + b"\x00"),  # another body
        (None, "/internal/heartbeat", body),
        ("v1 n1 1 2 3", "/internal/heartbeat", body),
    ):
        with pytest.raises(AuthenticationError, match="cluster secret"):
            verifier.verify(header, "POST", path, sent)
    stale = RequestVerifier(key, max_skew=-1.0)  # every timestamp is out of its window
    with pytest.raises(AuthenticationError, match="clocks"):
        stale.verify(fresh.header, "POST", "/internal/heartbeat", body)
    reply = pack({"node_id": "n0"})
    key.check_reply(fresh, key.sign_reply(fresh.mac, reply), reply)
    with pytest.raises(AuthenticationError, match="not a member"):
        key.check_reply(fresh, NodeKey("other-secret-here").sign_reply(fresh.mac, reply), reply)
    with pytest.raises(AuthenticationError, match="not a member"):
        key.check_reply(fresh, None, reply)
