"""TLS for a node's listeners and for its calls to other nodes, with certificates that can
be replaced on disk while the node runs.

One :class:`TlsFiles` per node: ``cert`` (PEM, the node's certificate and its chain),
``key`` (PEM) and ``ca`` (PEM bundle of the authorities that sign the other nodes'
certificates; default: the system's). :class:`TlsContexts` builds from them the server
context every listener presents (REST and console, the node protocol, Postgres after
``SSLRequest``) and the client context the node verifies members with, and rebuilds both
when a file's modification time changes (looked at every ``reload_every`` seconds): a
renewed certificate is presented from the next handshake on, with no restart, and
connections already open keep theirs. Files caught half-written fail to load and the
previous contexts stay in use (logged) until the next look.

Handshakes pick up the newest server context through the server context's SNI callback,
which OpenSSL calls at every handshake (with or without a server name): it hands the
connection the current context, so the context a handshake uses is never modified while in
use -- contexts are replaced, not changed.

The Postgres endpoint has contexts of its own (:attr:`TlsContexts.pg_listener`), the same
certificate offering the ALPN protocol ``postgresql``: Postgres 17 clients connecting with
``sslnegotiation=direct`` need the server to select it (and the endpoint refuses a direct
handshake that did not, as Postgres does, so that a client of another protocol cannot be
mistaken for a Postgres client).
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass

from sparkiq.errors import ConfigError

__all__ = ["PG_ALPN", "TlsContexts", "TlsFiles"]

#: The ALPN protocol name of the Postgres protocol (IANA registered, used since Postgres 17).
PG_ALPN = "postgresql"

log = logging.getLogger("sparkiq.tls")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where a node's certificate, key and the authorities it trusts are."""

    cert: str
    key: str
    ca: str | None = None


class TlsContexts:
    """The node's server and client contexts, kept current with the files (see the module
    docstring). Thread-safe: readers take whichever context is current."""

    def __init__(self, files: TlsFiles, *, reload_every: float = 5.0) -> None:
        self.files = files
        self.reload_every = reload_every
        self._lock = threading.Lock()  # guards _stamps, _server, _pg, _client (replaced whole)
        self._stamps = self._mtimes()
        # ConfigError: the node does not start
        self._server, self._pg, self._client = self._load()
        # The contexts listeners are built with; each handshake is moved to the newest one.
        self.listener = self._server_context()
        self.listener.sni_callback = self._pick
        self.pg_listener = self._server_context(alpn=PG_ALPN)
        self.pg_listener.sni_callback = self._pick_pg
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- contexts ----------------------------------------------------------------------------

    def _server_context(self, alpn: str | None = None) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.files.cert, self.files.key)
        if alpn is not None:  # selected when the client offers it; no ALPN otherwise
            context.set_alpn_protocols([alpn])
        return context

    def _client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.files.ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    def _load(self) -> tuple[ssl.SSLContext, ssl.SSLContext, ssl.SSLContext]:
        try:
            return self._server_context(), self._server_context(PG_ALPN), self._client_context()
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"cannot load TLS files (cert {self.files.cert!r}, key {self.files.key!r}, "
                f"ca {self.files.ca!r}): {exc}"
            ) from None

    def _pick(self, connection: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: object) -> None:
        connection.context = self.server()

    def _pick_pg(
        self, connection: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: object
    ) -> None:
        with self._lock:
            connection.context = self._pg

    def server(self) -> ssl.SSLContext:
        """The context a handshake accepting a connection uses now."""
        with self._lock:
            return self._server

    def client(self) -> ssl.SSLContext:
        """The context to verify another node with now."""
        with self._lock:
            return self._client

    # -- reloading ---------------------------------------------------------------------------

    def _mtimes(self) -> tuple[float | None, ...]:
        stamps: list[float | None] = []
        for path in (self.files.cert, self.files.key, self.files.ca):
            try:
                stamps.append(None if path is None else os.stat(path).st_mtime_ns)
            except OSError:
                stamps.append(None)
        return tuple(stamps)

    def reload_if_changed(self) -> bool:
        """Rebuild the contexts if a file changed since they were built; whether they were.
        A file that fails to load leaves the current contexts in place."""
        stamps = self._mtimes()
        with self._lock:
            if stamps == self._stamps:
                return False
        try:
            server, pg, client = self._load()
        except ConfigError as exc:
            log.warning("keeping the current TLS certificates: %s", exc)
            return False
        with self._lock:
            self._server, self._pg, self._client, self._stamps = server, pg, client, stamps
        log.info("TLS certificates reloaded from %s", self.files.cert)
        return True

    def start(self) -> TlsContexts:
        """Look at the files every ``reload_every`` seconds until :meth:`stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="sparkiq-tls", daemon=True)
            self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.reload_every):
            try:
                self.reload_if_changed()
            except Exception:  # never let the watcher die: the next look may succeed
                log.exception("looking at the TLS files failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
