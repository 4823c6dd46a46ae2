"""Keep-alive HTTP/1.1 connections to nodes, on the standard library: the one HTTP stack of
routers (the node protocol) and of :class:`sparkiq.Client` (the node protocol and the REST
API).

Routers make one small request per partition they forward, so the client's per-request
cost is the remote hop's cost. httpx spent about 1.1 ms per request here against 0.3 ms for
``http.client`` on the same keep-alive connection (docs/design.md).

A connection is reused only after its response was read to the end; a response closed
early closes its connection. Requests through this pool are reads (queries, heartbeats), so
one that fails on a reused connection (the server closed it while idle) is retried once on a
new one, and the server's other idle connections are dropped: what closed one (a restart, a
network fault) closed them all. :meth:`HttpPool.close` also cuts the connections requests
are still waiting on, and a request whose caller stopped waiting (a router's sub-request
another replica answered first: :mod:`sparkiq.cancel`) has its connection cut, so the other
node sees its caller leave and stops too. Thread-safe.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from sparkiq.cancel import CancelSignal, cancel_signal
from sparkiq.errors import NodeUnreachableError

__all__ = ["HttpPool", "NodeTimeoutError", "PooledResponse"]

_CHUNK = 65536


class NodeTimeoutError(NodeUnreachableError):
    """The member accepted the request but did not answer within the read timeout: it may
    be paused or overloaded rather than gone, so callers leave the verdict to the failure
    detector instead of marking it suspect."""


def _unreachable(what: str, exc: BaseException) -> NodeUnreachableError:
    if isinstance(exc, TimeoutError):
        return NodeTimeoutError(f"{what} did not answer in time: {exc!r}")
    return NodeUnreachableError(f"{what}: {exc!r}")


class _Connection(http.client.HTTPConnection):
    """Connects within ``connect_timeout`` (and, with ``tls``, completes a verified TLS
    handshake within it), then reads with ``timeout``."""

    def __init__(
        self,
        host: str,
        port: int,
        connect_timeout: float,
        timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._connect_timeout = connect_timeout
        self._tls = tls

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self._connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
        sock.settimeout(self.timeout)
        self.sock = sock


class PooledResponse:
    """A response whose connection goes back to the pool once the body was read."""

    def __init__(
        self, pool: HttpPool, key: str, conn: _Connection, response: http.client.HTTPResponse
    ) -> None:
        self._pool, self._key, self._conn, self._response = pool, key, conn, response
        self.status = response.status
        self._done = False

    def header(self, name: str) -> str | None:
        return self._response.getheader(name)

    def read(self, limit: int | None = None) -> bytes:
        """The whole body; with ``limit``, a body longer than ``limit`` bytes is not read
        on (the connection is dropped) and raises :class:`NodeUnreachableError`."""
        try:
            data = self._response.read() if limit is None else self._response.read(limit + 1)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise _unreachable(f"{self._key} went away mid-response", exc) from None
        except BaseException:  # interrupted mid-body: the rest will never be read
            self.close()
            raise
        if limit is not None and len(data) > limit:
            self.close()
            raise NodeUnreachableError(
                f"{self._key} answered with more than {limit} bytes: not a sparkiq node's reply"
            )
        self._check_whole()
        self._finish()
        return data

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives (what has arrived, up to 64 KiB a piece, never waiting
        to fill one: a push stream's change is handed on when it comes); the connection is
        released at its end."""
        try:
            while True:
                data = self._response.read1(_CHUNK)
                if not data:
                    self._check_whole()
                    # the body is done; read1 leaves a sized response open at its end,
                    # and http.client reuses a connection only once it is closed
                    self._response.close()
                    break
                yield data
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise _unreachable(f"{self._key} went away mid-response", exc) from None
        except BaseException:  # interrupted, or the reader stopped early (GeneratorExit)
            self.close()
            raise
        self._finish()

    def _check_whole(self) -> None:
        """Raise if the connection ended before the body's ``Content-Length`` did.

        ``http.client`` raises for a chunked body cut short, but a sized body read with
        ``read1`` or ``read(n)`` just ends early: a node cut off after its headers (a
        network partition dropping the connection) would look like an empty answer."""
        missing = self._response.length
        if missing:
            self.close()
            raise NodeUnreachableError(
                f"{self._key} went away mid-response: the connection closed "
                f"{missing} bytes before the end of the body"
            )

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            if self._response.will_close:
                self._pool._drop(self._conn)
            else:
                self._pool._release(self._key, self._conn)

    def close(self) -> None:
        """Give up on the rest of the body (closes the connection unless it was read)."""
        if not self._done:
            self._done = True
            self._pool._drop(self._conn)


class HttpPool:
    """``tls`` (a callable giving the client context to verify members with now) lets the
    pool reach ``https://`` URLs; without it only ``http://`` ones."""

    def __init__(
        self,
        *,
        connect_timeout: float = 1.0,
        timeout: float = 30.0,
        max_idle: int = 32,
        tls: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        self.connect_timeout, self.timeout, self.max_idle = connect_timeout, timeout, max_idle
        self._tls = tls
        self._idle: dict[str, list[_Connection]] = {}
        self._busy: set[_Connection] = set()  # sending or answering: shut down by close()
        self._lock = threading.Lock()  # guards _idle, _busy and _closed
        self._closed = False

    def request(
        self,
        url: str,
        method: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        *,
        timeout: float | None = None,
    ) -> PooledResponse:
        """Send one request to ``url`` (``http://host:port``); raise
        :class:`NodeUnreachableError` when no connection can be made or the server went
        away, :class:`NodeTimeoutError` when it does not answer within ``timeout`` (default:
        the pool's) seconds of a read."""
        signal = cancel_signal()
        wait = self.timeout if timeout is None else timeout
        for attempt in (0, 1):
            if signal is not None and signal.is_set():
                raise _abandoned(url)
            conn, reused = self._take(url)
            conn.timeout = wait  # a new connection's socket takes it at connect
            if conn.sock is not None:
                conn.sock.settimeout(wait)
            try:
                with _cut_on(signal, conn):
                    conn.request(method, path, body=body, headers=headers)
                    response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                if signal is not None and signal.is_set():
                    raise _abandoned(url) from None  # cut by us: nothing wrong with the server
                if reused and attempt == 0 and not isinstance(exc, TimeoutError):
                    # The server closed the idle connection (it restarted, or a network
                    # fault cut it): its other idle ones are as stale. Once more, on a new one.
                    self._forget(url)
                    continue
                raise _unreachable(f"{url} is unreachable", exc) from None
            except BaseException:
                # interrupted (Ctrl-C in a shell): the connection is unusable, and closing
                # it tells the node its caller left, so it stops the work (sparkiq.cancel)
                self._drop(conn)
                raise
            return PooledResponse(self, url, conn, response)
        raise AssertionError("unreachable")

    def _take(self, url: str) -> tuple[_Connection, bool]:
        with self._lock:
            if self._closed:
                raise NodeUnreachableError("the connection pool is closed")
            idle = self._idle.get(url)
            if idle:
                conn = idle.pop()
                self._busy.add(conn)
                return conn, True
        parts = urllib.parse.urlsplit(url)
        scheme = "http" if self._tls is None else "https"
        if parts.scheme != scheme or not parts.hostname:
            raise NodeUnreachableError(f"{url!r} is not an {scheme}://host:port address")
        tls = None if self._tls is None else self._tls()
        port = parts.port or (80 if tls is None else 443)
        conn = _Connection(parts.hostname, port, self.connect_timeout, self.timeout, tls)
        with self._lock:
            self._busy.add(conn)
        return conn, False

    def _release(self, url: str, conn: _Connection) -> None:
        with self._lock:
            self._busy.discard(conn)
            idle = self._idle.setdefault(url, [])
            if self._closed or len(idle) >= self.max_idle:
                conn.close()
            else:
                idle.append(conn)

    def _drop(self, conn: _Connection) -> None:
        with self._lock:
            self._busy.discard(conn)
        conn.close()

    def _forget(self, url: str) -> None:
        with self._lock:
            stale = self._idle.pop(url, [])
        for conn in stale:
            conn.close()

    def close(self) -> None:
        """Close every connection, including those a request is still waiting on: their
        callers get :class:`NodeUnreachableError` at once instead of waiting out the read
        timeout (a hedged read still out to a silent node must not hold up the process)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
            busy, self._busy = self._busy, set()
        for conns in idle.values():
            for conn in conns:
                conn.close()
        for conn in busy:
            _cut(conn)


def _cut(conn: _Connection) -> None:
    """Shut ``conn`` down under the thread blocked reading it (which then gets an error)."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _cut_on(signal: CancelSignal | None, conn: _Connection) -> AbstractContextManager[None]:
    if signal is None:
        return contextlib.nullcontext()
    return signal.on_cancel(lambda: _cut(conn))


def _abandoned(url: str) -> NodeUnreachableError:
    return NodeUnreachableError(f"the request to {url} was abandoned: its caller stopped waiting")
