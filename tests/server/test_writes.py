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
