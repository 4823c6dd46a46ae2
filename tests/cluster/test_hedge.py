"""The hedge delay learned from latencies, the copies of a hedged read, and the client's
hedged reads that use them."""

from __future__ import annotations

import contextlib
import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import pytest

from sparkiq import Client, KeyQuery, Node, RangeQuery, StateQueryRequest, UnknownStoreError
from sparkiq.cancel import cancel_signal
from sparkiq.cluster.hedge import MIN_SAMPLES, Copies, HedgeDelay
from sparkiq.cluster.httppool import HttpPool
from tests.changelog.helpers import expected_rows, make_table, write_batch
from tests.cluster.cluster_helpers import start_http_cluster

ROWS = {f"k{i:03d}": i for i in range(200)}


def test_the_ceiling_before_enough_latencies() -> None:
    delays = HedgeDelay(floor=0.1, ceiling=1.0)
    assert delays.delay("KeyQuery") == 1.0  # nothing known: the most patient bounded wait
    for _ in range(MIN_SAMPLES - 1):
        delays.record("KeyQuery", 0.01)
    assert delays.delay("KeyQuery") == 1.0
    delays.record("KeyQuery", 0.01)
    assert delays.delay("KeyQuery") == 0.1


def test_three_times_p99_within_floor_and_ceiling() -> None:
    delays = HedgeDelay(floor=0.1, ceiling=1.0)
    latencies = [0.001 * i for i in range(1, 101)]  # p99 of these is 0.1 s
    for seconds in latencies:
        delays.record("fast", seconds)
        delays.record("faster", seconds / 100)
    ordered = sorted(latencies)
    # 100 samples: recomputed at the 96th (every 16), so the p99 is of the first 96
    p99 = sorted(ordered[:96])[int(0.99 * 96)]
    assert delays.delay("fast") == pytest.approx(3 * p99)
    assert delays.delay("faster") == 0.1  # the floor


def test_the_ceiling_bounds_a_fast_kind_with_a_slow_tail() -> None:
    delays = HedgeDelay(floor=0.1, ceiling=1.0)
    for i in range(32):
        delays.record("k", 2.0 if i % 10 == 0 else 0.01)
    assert delays.delay("k") == 1.0


def test_a_heavy_kind_gets_no_delay_and_a_cold_kind_the_ceiling() -> None:
    delays = HedgeDelay(floor=0.1, ceiling=1.0)
    for _ in range(32):
        delays.record("sql", 3.0)  # median above the ceiling: cannot tell dead from busy
        delays.record("get", 0.01)
        delays.record("get", 0.01)
    assert delays.delay("sql") is None
    assert delays.delay("range") == 1.0  # never seen; the kinds together are fast


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="floor <= ceiling"):
        HedgeDelay(floor=2.0, ceiling=1.0)


def test_copies_answer_first_come_and_let_go_of_the_others() -> None:
    """The first copy to finish is returned; one abandoned while working sees its cancel
    signal set (its connection would be cut), and one abandoned that still answers has its
    answer released, never dropped unclosed."""
    released: list[str] = []
    cut = threading.Event()
    finish_late = threading.Event()

    def answer(value: str) -> str:
        return value

    def until_cut(value: str) -> str:
        signal = cancel_signal()
        assert signal is not None
        with signal.on_cancel(cut.set):
            assert cut.wait(30)
        raise ConnectionAbortedError(value)

    def late(value: str) -> str:
        assert finish_late.wait(30)
        return value

    with ThreadPoolExecutor(4) as pool:
        copies: Copies[str] = Copies(pool, release=released.append)
        assert copies.all_overdue(lambda _: False)  # none out: time to send
        copies.send("a", until_cut, "a")
        copies.send("b", late, "b")
        assert not copies.all_overdue(lambda c: c.target == "a")
        copies.send("c", answer, "c")
        done = []
        while not done:
            done = copies.wait(30)
        assert [(c.target, c.future.result()) for c in done] == [("c", "c")]
        assert sorted(c.target for c in copies) == ["a", "b"]
        copies.abandon_all()
        assert not copies
        assert cut.wait(30)  # the working copy was told to stop
        finish_late.set()
        pool.shutdown(wait=True)
    assert released == ["b"]  # the late answer was released; the failed copy needs nothing


class Silent:
    """A server that accepts connections and answers nothing for ``answer_after`` seconds
    (forever if None), then a 500: a blackholed node, or a node stuck on something."""

    def __init__(self, answer_after: float | None = None) -> None:
        self.answer_after = answer_after
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.accepted.append(conn)
            if self.answer_after is not None:
                threading.Thread(target=self._answer_late, args=(conn,), daemon=True).start()

    def _answer_late(self, conn: socket.socket) -> None:
        assert self.answer_after is not None
        if not self.stopped.wait(self.answer_after):
            body = b'{"error": {"code": "internal", "message": "too late to matter"}}'
            head = f"HTTP/1.1 500 Internal Server Error\r\ncontent-length: {len(body)}\r\n\r\n"
            with contextlib.suppress(OSError):
                conn.sendall(head.encode() + body)

    def close(self) -> None:
        self.stopped.set()
        self.server.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    state_dir = str(tmp_path_factory.mktemp("hedge"))
    write_batch(make_table(state_dir, partitions=4), 0, ROWS)
    (started,) = start_http_cluster(state_dir, 1)
    yield started
    started.stop()


def key_request(key: str) -> StateQueryRequest:
    return StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(key))


@pytest.mark.parametrize("answer_after", [None, 1.5])
def test_a_new_client_whose_first_node_is_silent_is_answered_by_the_next(
    node: Node, answer_after: float | None
) -> None:
    """A client with no latencies yet hedges after ``hedge_ceiling``, not its 30 s timeout;
    a silent node that answers (with an error) after the other has is not heard: the first
    answer won. (How often the silent node is asked again is not asserted: a read that the
    live node answers slower than the delay is hedged to it, legitimately.)"""
    silent = Silent(answer_after)
    expected = expected_rows([ROWS])
    try:
        with Client([silent.url, node.url], timeout=30.0, hedge_ceiling=0.3) as client:
            started = time.monotonic()
            assert client.get("t", "k007") == expected["k007"]
            assert time.monotonic() - started < 10.0  # a hang bound, far below the timeout
            for key in ("k001", "k150", "k199"):  # no longer asked first
                assert client.get("t", key) == expected[key]
            result = client.sql("SELECT count(*) AS c, sum(n) AS s FROM t")
            assert result.rows == [{"c": 200, "s": sum(ROWS.values())}]
            if answer_after is not None:
                time.sleep(answer_after)  # its late 500 arrives: nobody is waiting for it
            assert client.get("t", "k042") == expected["k042"]
    finally:
        silent.close()


def test_a_streamed_range_that_loses_the_race_is_closed(node: Node) -> None:
    """Two live nodes race (a delay of 0 hedges at once): exactly one answer is read, the
    other's rows are released, and the answer is the table."""
    expected = expected_rows([ROWS])
    fast = {"hedge_floor": 0.0001, "hedge_ceiling": 0.0001}
    with Client([node.url, node.url + "/"], timeout=30.0, **fast) as client:
        for _ in range(20):
            request = StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds())
            answer = client.query(request)
            rows = {}
            for result in answer.partition_results.values():
                with result.result as stream:
                    rows.update((k, row) for k, row in stream)
            assert rows == expected


def test_a_request_refused_by_the_node_is_not_retried_elsewhere(node: Node) -> None:
    """A 4xx is the node's verdict on the request, not on the node: raised as it comes,
    without waiting for the silent node asked before it."""
    silent = Silent()
    try:
        client = Client([silent.url, node.url], timeout=30.0, hedge_ceiling=0.3)
        with client, pytest.raises(UnknownStoreError, match="nope"):
            client.query(StateQueryRequest.in_store("nope").with_query(KeyQuery.with_key("a")))
    finally:
        silent.close()


def test_closing_the_client_ends_a_copy_still_out_to_a_silent_node(node: Node) -> None:
    """The losing copy of a hedged read waits on a node that never answers; closing the
    client cuts it, so no thread is left waiting out the 30 s timeout (a script would hang
    at exit)."""
    silent = Silent()
    try:
        with Client([silent.url, node.url], timeout=30.0, hedge_ceiling=0.3) as client:
            assert client.get("t", "k003") == expected_rows([ROWS])["k003"]
        deadline = time.monotonic() + 10.0  # a hang bound, far below the timeout
        while any(t.name.startswith("sparkiq-client") for t in threading.enumerate()):
            assert time.monotonic() < deadline, "a hedged copy outlived its client"
            time.sleep(0.05)
    finally:
        silent.close()


class KeepAlive(http.server.BaseHTTPRequestHandler):
    """Answers every POST with 200 "ok" on a keep-alive HTTP/1.1 connection."""

    protocol_version = "HTTP/1.1"
    open_sockets: ClassVar[list[socket.socket]] = []

    def setup(self) -> None:
        super().setup()
        KeepAlive.open_sockets.append(self.connection)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_that_dropped_its_idle_connections_is_reached_on_a_new_one() -> None:
    """Three idle connections the server has since closed (a restart, a dropped link): the
    next request does not fail on the second stale one it would otherwise take for its
    retry."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    pool = HttpPool(timeout=10.0)
    try:
        held = [pool.request(url, "POST", "/", b"x", {}) for _ in range(3)]
        for response in held:
            assert response.read() == b"ok"  # three connections, back in the pool
        for sock in KeepAlive.open_sockets:
            sock.shutdown(socket.SHUT_RDWR)
        time.sleep(0.2)  # the FINs arrive
        assert pool.request(url, "POST", "/", b"x", {}).read() == b"ok"
    finally:
        pool.close()
        server.shutdown()
        server.server_close()


def test_a_script_that_never_closes_its_client_exits_at_once(node: Node) -> None:
    """The losing copy of a hedged read still waits on a silent node when the script ends;
    the interpreter does not wait for it (30 s) before exiting."""
    silent = Silent()
    script = (
        "from sparkiq import Client\n"
        f"client = Client([{silent.url!r}, {node.url!r}], timeout=30.0, hedge_ceiling=0.3)\n"
        "print(client.get('t', 'k005')['n'])\n"
    )
    try:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
        took = time.monotonic() - started
    finally:
        silent.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "5"
    assert took < 25.0, f"the script took {took:.1f} s: it waited for the hedged copy"
