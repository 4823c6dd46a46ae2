"""The Postgres endpoint's listener: accepts connections and runs each in its own thread.

Connections are bounded (``max_connections``; one more is told SQLSTATE 53300
``too_many_connections`` and closed) and must finish startup and authentication within
``startup_timeout`` seconds. :meth:`PgServer.stop` closes the listener and every open
connection and joins their threads.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

from pygwire import messages as m

from sparkiq._version import __version__
from sparkiq.server.pg.catalog import Catalog, server_parameters
from sparkiq.server.pg.session import PgSession, SessionRules
from sparkiq.server.served import ServedNode

__all__ = ["PgServer"]

log = logging.getLogger("sparkiq.server.pg")


class PgServer:
    """Serves the Postgres wire protocol on a bound socket until :meth:`stop`."""

    def __init__(
        self,
        node: ServedNode,
        sock: socket.socket,
        *,
        token: str | None,
        max_connections: int = 64,
        startup_timeout: float = 10.0,
    ) -> None:
        self.sock = sock
        self.max_connections = max_connections
        parameters = server_parameters(__version__)
        self.catalog = Catalog(node, parameters)
        self.rules = SessionRules(self.catalog, token, startup_timeout, parameters, self._cancel)
        self.address: tuple[str, int] = sock.getsockname()[:2]
        self._lock = threading.Lock()  # guards _sessions, _by_process_id, _stopped
        self._sessions: dict[PgSession, threading.Thread] = {}
        self._by_process_id: dict[int, PgSession] = {}
        self._next_process_id = 1
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, name="sparkiq-pg", daemon=True)

    def start(self) -> PgServer:
        self.sock.setblocking(True)
        self._thread.start()
        log.info("serving the Postgres protocol on %s:%d", *self.address)
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # the listener was closed by stop()
            with self._lock:
                if self._stopped:
                    conn.close()
                    return
                if len(self._sessions) >= self.max_connections:
                    _refuse(conn, self.max_connections)
                    continue
                session = PgSession(conn, self.rules, self._next_process_id)
                self._by_process_id[session.process_id] = session
                self._next_process_id += 1
                thread = threading.Thread(
                    target=self._serve, args=(session,), name="sparkiq-pg-conn", daemon=True
                )
                self._sessions[session] = thread
            thread.start()

    def _serve(self, session: PgSession) -> None:
        try:
            session.run()
        finally:
            with self._lock:
                self._sessions.pop(session, None)
                self._by_process_id.pop(session.process_id, None)

    def _cancel(self, process_id: int, secret: bytes) -> None:
        """A CancelRequest: cancel the statement of the session it names, if the secret is
        that session's (a wrong one is ignored, as Postgres does, and logged)."""
        with self._lock:
            session = self._by_process_id.get(process_id)
        if session is None or not session.cancel(secret):
            log.info("ignored a cancel request for an unknown Postgres session")

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._sessions)

    @property
    def statements_running(self) -> int:
        """How many connections are running a statement now (a cancel request cancels
        only those)."""
        with self._lock:
            sessions = list(self._sessions)
        return sum(session.busy for session in sessions)

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every connection; wait for their threads."""
        with self._lock:
            self._stopped = True
            sessions = dict(self._sessions)
        with contextlib.suppress(OSError):  # never connected, or already shut
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for session in sessions:
            session.close()
        self._thread.join(timeout)
        for thread in sessions.values():
            thread.join(timeout)
        self.catalog.close()


def _refuse(conn: socket.socket, limit: int) -> None:
    """Answer a connection over the limit with an error (before startup, as Postgres does)."""
    fields = {
        "S": "FATAL",
        "V": "FATAL",
        "C": "53300",
        "M": f"sorry, too many clients already (this node serves {limit} Postgres connections)",
    }
    try:
        conn.settimeout(1.0)
        conn.sendall(m.ErrorResponse(fields=fields).to_wire())
    except OSError:
        pass
    finally:
        conn.close()
