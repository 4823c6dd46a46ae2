"""The Postgres endpoint's listener: accepts connections and runs each in its own thread
(between rounds an idle plain-text connection waits in the listener's reactor, which answers
key lookups at hand on one thread: :mod:`~sparkiq.server.pg.reactor`).

Connections are bounded (:class:`~sparkiq.limits.PgLimits`): at most
``max_connections`` open (one more is told SQLSTATE 53300 ``too_many_connections`` and
closed), and at most ``max_unauthenticated`` of them still logging in. A connection over
that second bound takes the slot of the oldest one that has been logging in for
``eviction_seconds`` (which is closed): a client that trickles its startup bytes holds a
thread and a slot only until a newer client needs it, never long enough to keep real
clients out, and never more than ``startup_timeout`` seconds in all (the session's
deadline). Logged-in connections are never evicted. :meth:`PgServer.stop` closes the
listener and every open connection and joins their threads.

With ``tls`` (the node's :class:`~sparkiq.tls.TlsContexts`) clients may switch to TLS
before their startup message, and with ``require_tls`` they must
(:mod:`~sparkiq.server.pg.session`); the handshake happens in the connection's thread,
within its login deadline, so it never holds up the accepting thread.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

from pygwire import messages as m

from sparkiq._version import __version__
from sparkiq.limits import PgLimits
from sparkiq.principals import Principals
from sparkiq.server.audit import AuditLog
from sparkiq.server.auth_failures import AuthFailures
from sparkiq.server.pg.answers import Answers, server_parameters
from sparkiq.server.pg.logins import PgLogins
from sparkiq.server.pg.reactor import Reactor
from sparkiq.server.pg.session import PgSession, SessionRules
from sparkiq.server.served import ServedNode
from sparkiq.sql.limits import SqlLimits
from sparkiq.tls import TlsContexts

__all__ = ["PgServer"]

log = logging.getLogger("sparkiq.server.pg")


class PgServer:
    """Serves the Postgres wire protocol on a bound socket until :meth:`stop`; over TLS
    when a client asks and ``tls`` is given, and only over TLS if ``require_tls`` too.
    ``limits`` bounds what a client may cost and ``sql_limits`` what a statement may (a node
    passes its ``pg_limits`` and ``sql_limits``; default: each group's defaults)."""

    def __init__(
        self,
        node: ServedNode,
        sock: socket.socket,
        *,
        principals: Principals,
        audit: AuditLog | None = None,
        limits: PgLimits | None = None,
        sql_limits: SqlLimits | None = None,
        auth_failures: AuthFailures | None = None,
        tls: TlsContexts | None = None,
        require_tls: bool = False,
    ) -> None:
        self.sock = sock
        self.limits = limits = limits if limits is not None else PgLimits()
        parameters = server_parameters(__version__)
        self.answers = Answers(node, parameters, sql_limits or SqlLimits())
        self.reactor = Reactor()
        self.rules = SessionRules(
            self.answers,
            PgLogins(principals),
            limits,
            auth_failures if auth_failures is not None else AuthFailures(),
            parameters,
            self._cancel,
            self._logged_in,
            audit,
            tls=tls,
            require_tls=require_tls and tls is not None,
            reactor=self.reactor,
        )
        self.address: tuple[str, int] = sock.getsockname()[:2]
        # guards _sessions, _starting, _evicted, _by_process_id, _stopped, accepted
        self._lock = threading.Lock()
        self._sessions: dict[PgSession, threading.Thread] = {}
        # sessions not logged in yet -> when they were accepted (time.monotonic())
        self._starting: dict[PgSession, float] = {}
        # sessions closed to free a slot whose threads have not ended yet: not counted
        self._evicted: set[PgSession] = set()
        self._by_process_id: dict[int, PgSession] = {}
        self._next_process_id = 1
        self._stopped = False
        #: Connections accepted since the server started (refused ones included).
        self.accepted = 0
        self._thread = threading.Thread(target=self._accept, name="sparkiq-pg", daemon=True)

    def start(self) -> PgServer:
        self.sock.setblocking(True)
        self.reactor.start()
        self._thread.start()
        rules = self.rules
        tls = "off" if rules.tls is None else "required" if rules.require_tls else "optional"
        log.info("serving the Postgres protocol on %s:%d (TLS %s)", *self.address, tls)
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
                self.accepted += 1
                refusal = self._make_room()
                if refusal is not None:
                    _refuse(conn, refusal)
                    continue
                session = PgSession(conn, self.rules, self._next_process_id)
                self._by_process_id[session.process_id] = session
                self._next_process_id += 1
                self._starting[session] = time.monotonic()
                thread = threading.Thread(
                    target=self._serve, args=(session,), name="sparkiq-pg-conn", daemon=True
                )
                self._sessions[session] = thread
            thread.start()

    def _make_room(self) -> str | None:
        """Under ``_lock``: evict what a new connection needs (see the module docstring), or
        say why it is refused."""
        limits = self.limits
        if len(self._starting) >= limits.max_unauthenticated and not self._evict_oldest():
            return (
                f"sorry, too many connections are logging in (this node lets "
                f"{limits.max_unauthenticated} log in at once); retry in a moment"
            )
        if len(self._sessions) - len(self._evicted) >= limits.max_connections and not (
            self._evict_oldest()
        ):
            return (
                f"sorry, too many clients already (this node serves {limits.max_connections}"
                " Postgres connections)"
            )
        return None

    def _evict_oldest(self) -> bool:
        """Under ``_lock``: close the connection that has been logging in longest, if that
        is ``eviction_seconds`` or more. Returns whether one was closed."""
        if not self._starting:
            return False
        session, accepted = min(self._starting.items(), key=lambda item: item[1])
        if time.monotonic() - accepted < self.limits.eviction_seconds:
            return False
        del self._starting[session]
        self._evicted.add(session)
        session.close()
        log.info("closed a Postgres connection still logging in to make room for a new one")
        return True

    def _logged_in(self, session: PgSession) -> bool:
        """A session finished logging in: it no longer counts against
        ``max_unauthenticated``. False if it was evicted meanwhile (it must end)."""
        with self._lock:
            return self._starting.pop(session, None) is not None

    def _serve(self, session: PgSession) -> None:
        try:
            session.run()
        finally:
            with self._lock:
                self._sessions.pop(session, None)
                self._starting.pop(session, None)
                self._evicted.discard(session)
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
        self.reactor.stop(timeout)  # hands parked sessions back: their threads then end
        self._thread.join(timeout)
        for thread in sessions.values():
            thread.join(timeout)
        self.answers.close()


def _refuse(conn: socket.socket, message: str) -> None:
    """Answer a connection over a limit with an error (before startup, as Postgres does)."""
    fields = {"S": "FATAL", "V": "FATAL", "C": "53300", "M": message}
    try:
        conn.settimeout(1.0)
        conn.sendall(m.ErrorResponse(fields=fields).to_wire())
    except OSError:
        pass
    finally:
        conn.close()
