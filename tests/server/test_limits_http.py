"""HTTP limits of a real node on 127.0.0.1, driven by raw sockets: oversized headers, slow
headers and bodies (slowloris), idle connections and too many connections are refused at
the transport while key lookups on another connection keep answering quickly.

The node runs with short timeouts (``SPARKIQ_HTTP_*`` variables) so that the tests wait
about a second, not the defaults' ten or thirty.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from sparkiq.errors import ConfigError
from sparkiq.limits import HttpLimits
from sparkiq.serving.config import NodeConfig
from tests import http_calls
from tests.cluster.cluster_helpers import start_http_cluster
from tests.server.test_hostile import PROBE_PATH, PROBE_ROW, TOKEN, Hostile, Probe, auth
from tests.sql.tables import build_world

pytestmark = pytest.mark.timeout(120)

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
KEEP_ALIVE_TIMEOUT = 2.0  # whole seconds: uvicorn takes an int
MAX_CONNECTIONS = 24
MAX_HEADER_BYTES = 16 * 1024
# A refusal must come after the limit and well before anything else would end the
# connection; the slack is for a loaded machine, not for the server.
SLACK = 5.0


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    state_dir = str(tmp_path_factory.mktemp("limits"))
    build_world(state_dir)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKIQ_HTTP_HEADER_TIMEOUT", str(HEADER_TIMEOUT))
        env.setenv("SPARKIQ_HTTP_BODY_TIMEOUT", str(BODY_TIMEOUT))
        env.setenv("SPARKIQ_HTTP_KEEP_ALIVE_TIMEOUT", str(KEEP_ALIVE_TIMEOUT))
        env.setenv("SPARKIQ_HTTP_MAX_CONNECTIONS", str(MAX_CONNECTIONS))
        env.setenv("SPARKIQ_HTTP_MAX_HEADER_BYTES", str(MAX_HEADER_BYTES))
        (node,) = start_http_cluster(state_dir, 1, token=TOKEN)
    yield Hostile(node, state_dir)
    node.stop()


def connect(h: Hostile) -> socket.socket:
    host, port = h.node.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def status_of(response: bytes) -> int:
    assert response.startswith(b"HTTP/1.1 "), response[:200]
    return int(response.split(b" ", 2)[1])


def request_head(path: str = PROBE_PATH, method: str = "GET", extra: str = "") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {TOKEN}\r\n{extra}"
    ).encode()


def test_limits_come_from_keywords_then_environment() -> None:
    env = {"SPARKIQ_HTTP_HEADER_TIMEOUT": "2.5", "SPARKIQ_HTTP_MAX_CONNECTIONS": "7"}
    limits = NodeConfig.resolve("/s", environ=env, http_limits={"max_connections": 9}).http_limits
    assert (limits.header_timeout, limits.max_connections) == (2.5, 9)
    assert limits.body_timeout == HttpLimits().body_timeout
    with pytest.raises(ConfigError, match="SPARKIQ_HTTP_BODY_TIMEOUT"):
        NodeConfig.resolve("/s", environ={"SPARKIQ_HTTP_BODY_TIMEOUT": "soon"})
    with pytest.raises(ConfigError, match="max_header_bytes"):
        HttpLimits(max_header_bytes=0)


def test_headers_within_the_limit_are_served(limited: Hostile) -> None:
    padding = "x" * (MAX_HEADER_BYTES // 2)
    response = http_calls.get(
        limited.url(PROBE_PATH), headers=auth() | {"x-padding": padding}, timeout=10
    )
    assert response.status_code == 200
    assert response.json()["row"] == PROBE_ROW


def test_oversized_headers_are_refused_with_431(limited: Hostile) -> None:
    with Probe(limited), connect(limited) as sock:
        started = time.monotonic()
        sock.sendall(request_head(extra="x-big: " + "y" * (MAX_HEADER_BYTES * 4)))
        response = read_all(sock)
        elapsed = time.monotonic() - started
    assert status_of(response) == 431
    assert b"headers_too_large" in response
    assert elapsed < SLACK


def test_a_128_mib_header_is_cut_off_without_stalling_lookups(limited: Hostile) -> None:
    """The server stops reading (and resets) long before the client has sent 128 MiB: it
    never buffers the header, and lookups on another connection stay fast meanwhile."""
    chunk = b"y" * (1 << 20)
    sent = 0
    with Probe(limited), connect(limited) as sock:
        sock.sendall(request_head(extra="x-big: "))
        started = time.monotonic()
        try:
            while sent < 128 << 20:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        elapsed = time.monotonic() - started
        try:
            response = read_all(sock)
        except OSError:
            response = b""
    assert sent < 32 << 20, f"the server read {sent} header bytes"
    assert elapsed < SLACK
    if response:  # the answer may be lost to the reset; when it arrives it is a 431
        assert status_of(response) == 431


def _headers_slowly(sock: socket.socket) -> bytes:
    """A request's head, then one more header line every 0.2 s until the server answers
    (or closes), for up to the header timeout and its slack: what the server answered."""
    sock.sendall(request_head())
    sock.settimeout(0.2)
    for i in range(int((HEADER_TIMEOUT + SLACK) / 0.2)):
        try:
            sock.sendall(f"x-slow-{i}: 1\r\n".encode())
            response = sock.recv(65536)
            if response:
                return response
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    return b""


def test_slow_headers_are_timed_out(limited: Hostile) -> None:
    """A slowloris client sending one header line every 0.2 s gets a 408 after the header
    timeout, although it never stops sending."""
    with Probe(limited), connect(limited) as sock:
        started = time.monotonic()
        response = _headers_slowly(sock)
        elapsed = time.monotonic() - started
    assert status_of(response) == 408
    assert b"request_timeout" in response
    assert HEADER_TIMEOUT * 0.9 <= elapsed < HEADER_TIMEOUT + SLACK


def read_answer(sock: socket.socket) -> bytes:
    """One answer with a Content-Length, read whole, the connection left open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_slow_headers_after_an_answer_on_a_kept_alive_connection_are_timed_out(
    limited: Hostile,
) -> None:
    """A request whose headers come slowly, sent on a connection that answered one before,
    gets its 408 one header timeout after its first byte: the timer left from the request
    before (due when the connection's first deadline was) moves on to it."""
    with Probe(limited), connect(limited) as sock:
        sock.sendall(request_head() + b"\r\n")
        assert status_of(read_answer(sock)) == 200
        time.sleep(HEADER_TIMEOUT * 0.6)  # the next deadline is after the timer's
        started = time.monotonic()
        response = _headers_slowly(sock)
        elapsed = time.monotonic() - started
    assert status_of(response) == 408
    assert b"request_timeout" in response
    assert HEADER_TIMEOUT * 0.9 <= elapsed < HEADER_TIMEOUT + SLACK


def test_a_slow_body_is_timed_out(limited: Hostile) -> None:
    with Probe(limited), connect(limited) as sock:
        started = time.monotonic()
        sock.sendall(
            request_head("/query", "POST", "content-type: application/json\r\n")
            + b"content-length: 1000\r\n\r\n"
            + b'{"sql": "SELECT'
        )
        response = read_all(sock)
        elapsed = time.monotonic() - started
    assert status_of(response) == 408
    assert BODY_TIMEOUT * 0.9 <= elapsed < BODY_TIMEOUT + SLACK


def test_an_idle_connection_is_closed(limited: Hostile) -> None:
    with connect(limited) as sock:
        started = time.monotonic()
        assert read_all(sock) == b""
        elapsed = time.monotonic() - started
    assert HEADER_TIMEOUT * 0.9 <= elapsed < HEADER_TIMEOUT + SLACK


def test_a_connection_idle_after_an_answer_is_closed_after_the_keep_alive_timeout(
    limited: Hostile,
) -> None:
    """Each answer starts the keep-alive deadline again; a connection that asks nothing
    more within it is closed when it passes (not at a request's header deadline)."""
    request = request_head() + b"\r\n"
    with connect(limited) as sock:
        for _ in range(3):  # within the deadline each time: served on the same connection
            sock.sendall(request)
            head, _, body = read_answer(sock).partition(b"\r\n\r\n")
            assert status_of(head) == 200, head
            assert orjson.loads(body)["row"] == PROBE_ROW
            time.sleep(KEEP_ALIVE_TIMEOUT / 2)
        started = time.monotonic()
        assert read_all(sock) == b""
        elapsed = time.monotonic() - started
    # KEEP_ALIVE_TIMEOUT / 2 of it was slept already
    assert KEEP_ALIVE_TIMEOUT * 0.4 <= elapsed < KEEP_ALIVE_TIMEOUT + SLACK


def test_connections_beyond_the_limit_are_refused_with_503(limited: Hostile) -> None:
    """Connections past the limit get a 503 at once; when the idle ones time out, lookups
    are served again."""
    socks = [connect(limited) for _ in range(MAX_CONNECTIONS + 8)]
    try:
        refused = 0
        for sock in socks:
            sock.settimeout(0.3)
            try:
                head = sock.recv(65536)
            except TimeoutError:
                continue
            if head:
                assert status_of(head) == 503
                assert b"too_many_connections" in head
                refused += 1
        assert refused >= 8
    finally:
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + HEADER_TIMEOUT + SLACK
    while True:
        try:
            response = http_calls.get(limited.url(PROBE_PATH), headers=auth(), timeout=10)
            if response.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "lookups were not served again"
        time.sleep(0.1)
    assert response.json()["row"] == PROBE_ROW


def test_requests_on_a_kept_alive_connection_still_work(limited: Hostile) -> None:
    """The per-request deadlines restart with each request: ten requests spread over more
    than the header timeout on one connection all answer."""
    with http_calls.new_client(headers=auth(), timeout=10) as client:
        for _ in range(6):
            response = client.get(limited.url(PROBE_PATH))
            assert response.status_code == 200
            assert response.json()["row"] == PROBE_ROW
            time.sleep(HEADER_TIMEOUT / 4)
        response = client.post(limited.url("/query"), json={"sql": "SELECT count(*) AS n FROM ik"})
        assert response.status_code == 200
        assert response.json()["rows"] == [{"n": 67}]
