"""Running the ASGI app: uvicorn on a socket the node already bound, in a thread."""

from __future__ import annotations

import importlib.util
import logging
import socket
import threading
import time
from typing import Any

import uvicorn

from sparkiq.errors import ConfigError
from sparkiq.server.served import ServedNode

__all__ = ["RunningServer", "bind_socket", "start_server"]

log = logging.getLogger("sparkiq.server")


class RunningServer:
    """A uvicorn server running in a daemon thread; :meth:`stop` shuts it down."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, app: Any) -> None:
        self._server = server
        self._thread = thread
        self.app = app

    def stop(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        self.app.close()


def start_server(
    node: ServedNode, sock: socket.socket, *, max_body_bytes: int = 1 << 20
) -> RunningServer:
    """Serve ``node``'s REST API and node protocol on ``sock`` until ``stop()``."""
    from sparkiq.server.app import RestApp

    app = RestApp(node, max_body_bytes=max_body_bytes)
    config = uvicorn.Config(
        app,
        lifespan="off",
        access_log=False,
        log_level="warning",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="sparkiq-http", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the HTTP server did not start on {sock.getsockname()}")
        time.sleep(0.005)
    log.info("serving on %s", sock.getsockname())
    return RunningServer(server, thread, app)


def bind_socket(listen: str) -> socket.socket:
    """A listening, non-blocking socket on ``listen`` (``"host:port"``; port 0 picks a free
    one; an empty host means every interface). Bound before the server starts so that the
    node knows its own URL first."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"listen must be 'host:port' (port 0 picks a free one), got {listen!r}")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {listen!r}: {exc}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock
