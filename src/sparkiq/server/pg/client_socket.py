"""One Postgres client's connection as bytes: plain, or TLS once negotiated, and bounded
until the client has logged in.

Encryption is negotiated before the startup message (PostgreSQL's "Frontend/Backend
Protocol", version 3.0), by this module rather than the codec (:meth:`ClientSocket.negotiate`):
an ``SSLRequest`` is answered ``S`` when the node has TLS (without it ``N``, and the client
goes on in plain text or gives up, as its ``sslmode`` says), and the connection is then
wrapped in the node's server context for Postgres
(:attr:`sparkiq.tls.TlsContexts.pg_listener`: each handshake gets the newest certificate).
A ``GSSEncRequest`` is declined (``N``). Each may come once, in either order. A client may
also start with the TLS handshake itself, with no ``SSLRequest`` (Postgres 17's
``sslnegotiation=direct``; told apart by its first byte, 0x16, which no startup-phase message
starts with); it must then have negotiated the ALPN protocol ``postgresql``, or it is refused
(08P01) as Postgres refuses it. The negotiation is read 8 bytes at a time so that no
plain-text byte a client (or someone between it and the node) sent after its ``SSLRequest``
is ever taken as part of the encrypted session (CVE-2021-23214 in Postgres).

Until login ends, every read counts against one deadline for the whole login (a timeout per
read would let a client that sends a byte every few seconds hold the connection forever;
the TLS handshake counts too) and a byte budget (nothing a client needs to log in is long).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
import time

from sparkiq.limits import PgLimits
from sparkiq.tls import PG_ALPN, TlsContexts

__all__ = ["ClientGone", "ClientSocket", "Refused"]

# The request codes of the two 8-byte messages that may precede the startup message.
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_TLS_HANDSHAKE = b"\x16"  # the content type of the record a TLS ClientHello comes in


class ClientGone(Exception):
    """The client went away (or must be sent away): end the connection quietly."""


class Refused(Exception):
    """End the connection with a FATAL error: ``sqlstate`` and the message."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class ClientSocket:
    """The socket of one client connection (see the module docstring). ``sock`` becomes an
    :class:`ssl.SSLSocket` once TLS is negotiated; ``_lock`` guards that replacement against
    :meth:`close` from another thread."""

    def __init__(self, sock: socket.socket, limits: PgLimits) -> None:
        self.sock: socket.socket = sock
        self._lock = threading.Lock()
        self._closing = False
        self.limits = limits
        # Until login ends: when it must have ended (time.monotonic()), and how many more
        # bytes the client may send. None once logged in.
        self.deadline: float | None = None
        self._budget = limits.max_startup_bytes
        #: what negotiating encryption read past its messages: the codec's first bytes
        self.head = b""

    def start_login(self) -> None:
        """Start the login deadline and byte budget."""
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.deadline = time.monotonic() + self.limits.startup_timeout

    def logged_in(self) -> None:
        """End the login's bounds: from now on reads wait as long as the client does."""
        self.deadline = None
        self.sock.settimeout(None)

    @property
    def encrypted(self) -> bool:
        """Whether the connection runs over TLS."""
        return isinstance(self.sock, ssl.SSLSocket)

    def _left(self) -> float:
        """What is left of the login deadline, set as the socket's timeout."""
        assert self.deadline is not None
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.sock.settimeout(remaining)
        return remaining

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes from the client, within the login's bounds until it is
        logged in."""
        if self.deadline is not None:
            self._left()
        data = self.sock.recv(size)
        if not data:
            raise ClientGone
        if self.deadline is not None:
            self._budget -= len(data)
            if self._budget < 0:
                raise Refused(
                    "08P01",
                    f"the client sent more than SPARKIQ_PG_MAX_STARTUP_BYTES="
                    f"{self.limits.max_startup_bytes} bytes before logging in",
                )
        return data

    def read_exact(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            data += self.recv(size - len(data))
        return data

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def negotiate(self, tls: TlsContexts | None) -> None:
        """Answer the ``SSLRequest`` and ``GSSEncRequest`` that may come first, switching
        to TLS on the first, or take a direct TLS handshake; keep the bytes of the message
        after them in :attr:`head`. Reads exactly 8 bytes at a time (every startup-phase
        message is at least that long) and the first byte only by peeking: a TLS handshake
        must find the client's handshake bytes still in the socket."""
        ssl_done = gss_done = False
        if self._peek() == _TLS_HANDSHAKE:  # a direct TLS handshake, no SSLRequest
            if tls is None:
                raise Refused(
                    "08P01",
                    "a TLS handshake without SSLRequest (sslnegotiation=direct), but this "
                    "node has no TLS certificate",
                )
            self._start_tls(tls)
            assert isinstance(self.sock, ssl.SSLSocket)
            if self.sock.selected_alpn_protocol() != PG_ALPN:
                raise Refused(
                    "08P01",
                    f"a direct TLS connection (no SSLRequest) must negotiate the ALPN "
                    f"protocol {PG_ALPN!r}",
                )
            ssl_done = True
        while True:
            head = self.read_exact(8)
            length, code = struct.unpack("!ii", head)
            if length == 8 and code == _SSL_REQUEST and not ssl_done:
                ssl_done = True
                self.sock.sendall(b"N" if tls is None else b"S")
                if tls is not None:
                    self._start_tls(tls)
            elif length == 8 and code == _GSSENC_REQUEST and not gss_done:
                gss_done = True
                self.sock.sendall(b"N")
            else:  # the startup message (or a cancel request): the codec reads it
                self.head = head
                return

    def _peek(self) -> bytes:
        """The client's first byte, left in the socket (within the login deadline)."""
        self._left()
        first = self.sock.recv(1, socket.MSG_PEEK)
        if not first:
            raise ClientGone
        return first

    def _start_tls(self, tls: TlsContexts) -> None:
        """The TLS handshake, within what is left of the login deadline (the socket's
        timeout bounds the whole handshake, not each read)."""
        with self._lock:
            if self._closing:  # evicted while negotiating
                raise ClientGone
            self.sock = tls.pg_listener.wrap_socket(
                self.sock, server_side=True, do_handshake_on_connect=False
            )
        self._left()
        assert isinstance(self.sock, ssl.SSLSocket)
        self.sock.do_handshake()

    def shut_down(self) -> None:
        """End the connection from another thread (the session's thread then sees it
        closed)."""
        with self._lock:
            self._closing = True
            with contextlib.suppress(OSError):  # already closed by the client
                # The plain socket's shutdown, also under TLS: SSLSocket.shutdown() would
                # drop the TLS state the session's thread is using.
                socket.socket.shutdown(self.sock, socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the socket (the session's own thread, at its end)."""
        self.sock.close()
