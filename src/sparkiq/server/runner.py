"""Running the ASGI app: uvicorn on a socket the node already bound, in a thread, behind
HTTP limits that hold before the app sees a request.

uvicorn bounds neither the size of a request's headers (httptools buffers a header value
whole, by repeated concatenation: a 128 MiB header held the event loop for seconds) nor
how long a client may take to send them or its body, nor how many connections it holds
open. :class:`~sparkiq.limits.HttpLimits` (a node's ``http_limits``) says how much of each
a node accepts, and
:class:`_LimitedProtocol` (uvicorn's httptools protocol with four checks added) enforces
them at the transport, at a cost bounded per received chunk:

- **header bytes**: at most ``max_header_bytes`` from a request's first byte to the end of
  its headers; beyond, ``431`` and the connection is closed. The parser is fed only up to
  the limit, so no oversized header is ever buffered.
- **header time**: the headers must be complete ``header_timeout`` seconds after the
  connection opened or the request's first byte arrived (a slowloris sends a byte every
  few seconds forever); beyond, ``408`` and close.
- **body time**: the body must be complete ``body_timeout`` seconds after the headers;
  beyond, ``408`` and close, and the app's ``receive()`` reports a disconnect.
- **connections**: at most ``max_connections`` open at once; one more is answered ``503``
  and closed at once. Idle keep-alive connections close after ``keep_alive_timeout``.

``max_body_bytes`` is enforced by the app while it reads (``413``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
)

from sparkiq.error_codes import ErrorCode
from sparkiq.errors import ConfigError
from sparkiq.limits import HttpLimits
from sparkiq.server.asgi import WHOLE_ANSWER, send_in_two
from sparkiq.server.served import ServedNode
from sparkiq.server.writes import CoalescingTransport, WriteFlusher
from sparkiq.serving.config import node_url
from sparkiq.tls import TlsContexts

__all__ = ["RunningServer", "bind_advertised", "bind_socket", "start_server"]

log = logging.getLogger("sparkiq.server")


_LINGER_SECONDS = 1.0
_LINGER_BYTES = 4 << 20


class _LimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`HttpLimits` enforced (one instance per
    connection; everything runs on the server's event loop, so no lock is needed)."""

    limits: ClassVar[HttpLimits] = HttpLimits()
    #: held writes of all the server's connections (one per server: see start_server)
    flusher: ClassVar[WriteFlusher] = WriteFlusher()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # an answer's head and body in one write (sparkiq.server.writes); flow control
        # (pause and resume reading) was bound to the transport itself above
        self.transport = CoalescingTransport(  # type: ignore[assignment]
            transport, self.loop, self.flusher
        )
        self._awaiting_headers = True  # from a request's first byte to its headers' end
        self._header_bytes = 0
        self._received_any = False
        # the deadline of the headers (awaiting them) or of the body (else), None between
        # requests; one timer watches it, moved only when a deadline comes before it
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._idle = False  # between an answer and the next request: the deadline is idle's
        self._discarding: int | None = None  # bytes still dropped after a refusal
        self._whole = self._answer_whole  # every request's scope[WHOLE_ANSWER]: bound once
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"this node accepts at most {self.limits.max_connections} connections",
            )
            return
        self._watch(self.loop.time() + self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._discarding is not None:  # refused: drop what still arrives (see _refuse)
            self._discarding -= len(data)
            if self._discarding < 0:
                self.transport.abort()
            return
        self._received_any = True
        if self._idle:  # the next request begins: its header deadline replaces the idle one
            self._idle = False
            self._deadline = None
        if self._awaiting_headers:
            room = self.limits.max_header_bytes - self._header_bytes
            if len(data) > room:
                # feed what fits: the headers may end within it, the rest is then body
                super().data_received(data[: max(room, 0)])
                if self._awaiting_headers:
                    self._refuse(
                        ErrorCode.HEADERS_TOO_LARGE,
                        f"request headers exceed {self.limits.max_header_bytes} bytes",
                    )
                    return
                data = data[max(room, 0) :]
                if self.transport.is_closing() or not data:
                    return
            else:
                self._header_bytes += len(data)
        super().data_received(data)

    # -- parser callbacks (called from within feed_data) ----------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_headers = True
        # a deadline already running (set when the connection opened) is not extended
        if self._deadline is None:
            self._watch(self.loop.time() + self.limits.header_timeout)

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._watch(self.loop.time() + self.limits.body_timeout)
        super().on_headers_complete()
        cycle = self.cycle  # the request's, unless uvicorn made none (an upgrade)
        if cycle is not None and cycle.scope is self.scope:
            scope: dict[str, Any] = self.scope  # type: ignore[assignment]
            scope[WHOLE_ANSWER] = self._whole

    def on_message_complete(self) -> None:
        self._deadline = None
        self._awaiting_headers = True
        self._header_bytes = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        """uvicorn's, but for the keep-alive deadline: uvicorn armed a timer after every
        answer and canceled it when the next request came, two timer operations a request;
        the connection's one timer watches it instead (with the requests' deadlines)."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()  # reading paused while the answer was pending
        if self.pipeline:  # a pipelined request waits: it starts now
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self._deadline is None:  # no request under way: the connection idles
            self._idle = True
            self._watch(self.loop.time() + self.timeout_keep_alive)

    async def _answer_whole(
        self,
        scope: dict[str, Any],
        send: Any,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> None:
        """A request's ``scope[WHOLE_ANSWER]`` (sparkiq.server.asgi): a whole answer, head
        and body, written at once.

        uvicorn's ``send`` takes an answer as two messages, head then body, and checks each
        header against its patterns: two calls and their checks, 2 us of a key lookup's 30
        (closed loop of ``bench.http``). The app's headers are its own constants; this
        writes them, uvicorn's default headers (``date``) and the length in one ``write``
        and keeps uvicorn's account of the request as its ``send`` would (response started,
        then complete, the keep-alive deadline armed). Anything out of the ordinary takes
        ``send``, uvicorn's: a request other than the connection's current one (pipelined),
        an answer already started, a connection closing or to be closed after this answer,
        a HEAD request, writes paused by flow control, an access log.
        """
        cycle = self.cycle
        if (
            cycle is None
            or cycle.scope is not scope
            or cycle.response_started
            or cycle.disconnected
            or not cycle.keep_alive
            or cycle.flow.write_paused
            or cycle.access_log
            or scope["method"] == "HEAD"
        ):
            await send_in_two(send, status, headers, body)
            return
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        head = [STATUS_LINE[status]]
        for name, value in cycle.default_headers:
            head += (name, b": ", value, b"\r\n")
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        head.append(body)
        transport = cycle.transport
        if isinstance(transport, CoalescingTransport):  # whole: nothing to wait for
            transport.write_now(b"".join(head))
        else:
            transport.write(b"".join(head))
        cycle.response_complete = True
        cycle.message_event.set()
        cycle.on_response()

    # -- limits ----------------------------------------------------------------------------

    def _watch(self, deadline: float) -> None:
        """Make ``deadline`` (loop time) the current one. A request costs no timer (arming
        and canceling two a request was a tenth of a key lookup's time): the one armed
        stays while it fires no later than the new deadline (as a later request's header
        deadline, and a body deadline with the default limits), and when it fires it is
        moved on to the deadline then current, if any."""
        self._deadline = deadline
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_at(deadline, self._on_timer)
            self._timer_at = deadline

    def _on_timer(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:  # between requests: the next one arms a timer again
            return
        if self.loop.time() < deadline:
            self._watch(deadline)
        elif self._idle:  # no request since the last answer: uvicorn's keep-alive timeout
            self._deadline = None
            self.timeout_keep_alive_handler()
        elif self._awaiting_headers:
            self._headers_too_slow()
        else:
            self._body_too_slow()

    def _cancel_timers(self) -> None:
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if not self._received_any:  # an idle connection that never asked anything
            self.transport.close()
            return
        self._refuse(
            ErrorCode.REQUEST_TIMEOUT,
            f"request headers not received within {self.limits.header_timeout} s",
        )

    def _body_too_slow(self) -> None:
        self._deadline = None
        if self.cycle is not None and not self.cycle.response_started:
            self._refuse(
                ErrorCode.REQUEST_TIMEOUT,
                f"request body not received within {self.limits.body_timeout} s",
            )
        else:
            self.transport.close()

    def _refuse(self, code: ErrorCode, message: str) -> None:
        """Answer ``code`` (its status) with a JSON error (as the app's errors) and close the
        connection; the app's task, if one runs, sees a disconnect and its sends are
        dropped."""
        self._cancel_timers()
        if self.transport.is_closing():
            return
        status = code.status
        body = b'{"error":{"code":"%s","message":"%s","field":null}}' % (
            code.wire.encode(),
            message.encode(),
        )
        reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
        head = b"HTTP/1.1 %d %s\r\n" % (status, reason.get(status, b"Service Unavailable"))
        self.transport.write(
            head
            + b"content-type: application/json\r\nconnection: close\r\n"
            + b"content-length: %d\r\n\r\n" % len(body)
            + body
        )
        if self.cycle is not None:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        # A close with unread bytes queued makes the kernel reset the connection, and the
        # client may then lose the answer: end our side, read and drop what the client is
        # still sending, and close when it has read the answer (or soon after, or once it
        # sent too much).
        self._discarding = _LINGER_BYTES
        try:
            self.transport.write_eof()
        except (NotImplementedError, OSError, RuntimeError):
            self.transport.close()
            return
        self.loop.call_later(_LINGER_SECONDS, self.transport.close)


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
    node: ServedNode,
    sock: socket.socket,
    *,
    max_body_bytes: int | None = None,
    limits: HttpLimits | None = None,
    tls: TlsContexts | None = None,
) -> RunningServer:
    """Serve ``node``'s REST API and node protocol on ``sock`` until ``stop()``, within
    ``limits`` (default: :class:`~sparkiq.limits.HttpLimits`' defaults; a node passes its
    ``http_limits``; ``max_body_bytes`` overrides that field); over TLS only with ``tls``,
    whose certificates may change while it runs."""
    from sparkiq.server.app import RestApp

    if limits is None:
        limits = HttpLimits()
    app = RestApp(node, max_body_bytes=max_body_bytes or limits.max_body_bytes)
    protocol = type(
        "LimitedProtocol", (_LimitedProtocol,), {"limits": limits, "flusher": WriteFlusher()}
    )
    config = uvicorn.Config(
        app,
        lifespan="off",
        access_log=False,
        log_level="warning",
        http=protocol,
        loop="uvloop" if _has_uvloop() else "asyncio",
        timeout_keep_alive=int(max(1, limits.keep_alive_timeout)),
        # the caller is the connection's address, never a header's: X-Forwarded-For from a
        # local process would otherwise name any address it likes to the auth throttle
        # (docs/rest.md: callers behind one proxy share an address)
        proxy_headers=False,
        server_header=False,  # no banner naming the server software
        timeout_graceful_shutdown=2,
        ssl_context_factory=None if tls is None else (lambda _config, _default: tls.listener),
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


def _has_uvloop() -> bool:
    import importlib.util

    return importlib.util.find_spec("uvloop") is not None


def bind_advertised(
    listen: str, advertise: str | None, scheme: str = "http"
) -> tuple[socket.socket, str]:
    """A socket bound to ``listen`` and the URL other nodes reach it at: ``advertise``, else
    the address bound (the host's name for a wildcard address)."""
    sock = bind_socket(listen)
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return sock, node_url(advertise or f"{host}:{port}", scheme)


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
