"""The pooled HTTP client against a real socket server that misbehaves on purpose: a body
cut short is a node gone away, never a short answer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from sparkiq.cluster.httppool import HttpPool
from sparkiq.errors import NodeUnreachableError

BODY = b"0123456789" * 10


@pytest.fixture
def server() -> Iterator[tuple[str, list[bytes]]]:
    """An HTTP server on 127.0.0.1 that answers each connection with the next scripted
    reply (raw bytes) and then closes it."""
    replies: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)  # the request (small, one read)
                conn.sendall(replies.pop(0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", replies
    stop.set()
    thread.join()
    listener.close()


def sized(body: bytes, length: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length + body


@pytest.mark.parametrize("sent", [0, 1, 60])
@pytest.mark.parametrize("how", ["chunks", "read", "read with limit"])
def test_a_sized_body_cut_short_is_unreachable(
    server: tuple[str, list[bytes]], sent: int, how: str
) -> None:
    url, replies = server
    replies.append(sized(BODY[:sent], len(BODY)))
    pool = HttpPool(timeout=5.0)
    try:
        response = pool.request(url, "GET", "/", b"", {})
        with pytest.raises(NodeUnreachableError, match="went away mid-response"):
            if how == "chunks":
                b"".join(response.chunks())
            elif how == "read":
                response.read()
            else:
                response.read(limit=1000)
    finally:
        pool.close()


@pytest.mark.parametrize("how", ["chunks", "read", "read with limit"])
def test_a_whole_sized_body_reads_as_itself(server: tuple[str, list[bytes]], how: str) -> None:
    url, replies = server
    replies.append(sized(BODY, len(BODY)))
    pool = HttpPool(timeout=5.0)
    try:
        response = pool.request(url, "GET", "/", b"", {})
        if how == "chunks":
            assert b"".join(response.chunks()) == BODY
        elif how == "read":
            assert response.read() == BODY
        else:
            assert response.read(limit=len(BODY)) == BODY
    finally:
        pool.close()
