"""A slow network link for the CLI's tests: a TCP proxy in front of a node whose answers
arrive ``delay`` seconds after the request.

What a user sees while a pull query runs (the spinner after a second, nothing when piped)
depends on how long the answer takes, not on why: a node far away is as slow as a statement
that computes for seconds, and costs the machine nothing while it waits. Requests go through
at once, so the node runs them as it would without the link; a client that leaves closes
the node's side too (the node then cancels its statement, as it does for a direct client).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class SlowLink:
    """Listens on 127.0.0.1 (``url``), forwards each connection to ``target_port``. An answer
    is held until ``delay`` seconds after the last bytes of the request it answers; ``delay``
    may change while connections are open (it is read per answer)."""

    def __init__(self, target_port: int, delay: float = 0.0) -> None:
        self.delay = delay
        self._target = ("127.0.0.1", target_port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="slow-link", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:  # closed
                return
            node = socket.create_connection(self._target)
            with self._lock:
                self._open += [client, node]
            asked = [0.0]  # when the request now answered last sent bytes
            threading.Thread(target=self._requests, args=(client, node, asked), daemon=True).start()
            threading.Thread(target=self._answers, args=(node, client, asked), daemon=True).start()

    def _requests(self, client: socket.socket, node: socket.socket, asked: list[float]) -> None:
        try:
            while data := client.recv(65536):
                asked[0] = time.monotonic()
                node.sendall(data)
        except OSError:
            pass
        _hang_up(client, node)

    def _answers(self, node: socket.socket, client: socket.socket, asked: list[float]) -> None:
        try:
            while data := node.recv(65536):
                time.sleep(max(0.0, asked[0] + self.delay - time.monotonic()))
                client.sendall(data)
        except OSError:
            pass
        _hang_up(client, node)

    def close(self) -> None:
        # shutdown wakes the accepting thread (close alone may leave it blocked)
        _hang_up(self._server)
        self._server.close()
        with self._lock:
            _hang_up(*self._open)
            for sock in self._open:
                sock.close()


def _hang_up(*socks: socket.socket) -> None:
    """Both directions of each socket shut: the thread reading its peer sees the end."""
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
