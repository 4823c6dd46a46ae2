"""A key lookup's answer leaves a real ``sparkiq serve`` process in one socket write (head
and body joined, sparkiq.server.writes), counted by the kernel: ``syscw`` in
``/proc/<pid>/io`` is every write-family system call the process made. uvicorn alone makes
two an answer (head, then body)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator

import orjson
import pytest

from tests.changelog.helpers import make_table, write_batch
from tests.cluster.serve_processes import ServeProcess, free_port

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/io"),
]

KEYS = 50
LOOKUPS = 200


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    state_dir = tmp_path_factory.mktemp("writes")
    write_batch(make_table(str(state_dir), partitions=2), 0, {f"k{i}": i for i in range(KEYS)})
    process = ServeProcess(str(state_dir), "n0", free_port(), [], str(state_dir)).start()
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def _writes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("syscw:"))


def _answer(sock: socket.socket, buffer: bytearray) -> tuple[bytes, bytes]:
    """Head and body of the next answer on ``sock`` (by Content-Length); what was read
    beyond it stays in ``buffer``."""
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(65536)
    end = buffer.index(b"\r\n\r\n") + 4
    head = bytes(buffer[:end])
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(buffer) < end + length:
        buffer += sock.recv(65536)
    body = bytes(buffer[end : end + length])
    del buffer[: end + length]
    return head, body


def test_a_lookup_is_answered_in_one_write(node: ServeProcess) -> None:
    assert node.process is not None
    pid = node.process.pid
    host, port = node.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        buffer = bytearray()
        before = _writes(pid)
        for i in range(LOOKUPS):
            key = f"k{i % KEYS}"
            sock.sendall(f"GET /stores/t/keys/{key} HTTP/1.1\r\nhost: localhost\r\n\r\n".encode())
            head, body = _answer(sock, buffer)
            assert head.startswith(b"HTTP/1.1 200 "), head
            assert orjson.loads(body)["row"]["n"] == i % KEYS
        writes = _writes(pid) - before
    # one a lookup; the node's other threads (membership, tailing) may write now and then
    assert LOOKUPS <= writes < LOOKUPS * 1.5, writes


def test_answers_written_whole_are_the_answers_uvicorn_writes(node: ServeProcess) -> None:
    """A lookup's answer is written whole by sparkiq (sparkiq.server.runner); a request
    that closes its connection after the answer (HTTP/1.0) is answered by uvicorn's own
    ``send`` instead: the same head (``connection: close`` aside) and body. Pipelined
    requests are answered in order, each whole."""
    host, port = node.url.removeprefix("http://").rsplit(":", 1)

    def lookup(key: str, version: str = "1.1") -> bytes:
        return f"GET /stores/t/keys/{key} HTTP/{version}\r\nhost: localhost\r\n\r\n".encode()

    def without_date(head: bytes) -> list[bytes]:
        return [line for line in head.split(b"\r\n") if not line.startswith(b"date: ")]

    with socket.create_connection((host, int(port)), timeout=60) as sock:
        buffer = bytearray()
        sock.sendall(lookup("k7") + lookup("missing") + lookup("k8"))  # pipelined
        answers = [_answer(sock, buffer) for _ in range(3)]
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(lookup("k7", "1.0"))
        uvicorns = _answer(sock, bytearray())
    assert [orjson.loads(body)["key"] for _, body in answers] == ["k7", "missing", "k8"]
    assert [head.split(b" ", 2)[1] for head, _ in answers] == [b"200", b"404", b"200"]
    assert answers[0][1] == uvicorns[1]
    assert without_date(answers[0][0]) == [
        line for line in without_date(uvicorns[0]) if line != b"connection: close"
    ]
    assert b"connection: close" in uvicorns[0]
    assert any(line.startswith(b"date: ") for line in answers[0][0].split(b"\r\n"))
