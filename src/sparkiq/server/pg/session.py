"""One Postgres client connection: startup, password, then simple and extended queries.

Messages are framed by :mod:`~sparkiq.server.pg.wire` and decoded and encoded by
``pygwire`` (a sans-I/O codec of the protocol), its state machine only while the client
logs in; this module decides what to answer. A connection runs in its own thread on a
blocking socket: a key lookup is answered without a hop to another thread.

Protocol notes (PostgreSQL's "Frontend/Backend Protocol", version 3.0):

- Encryption is negotiated before the startup message by the connection's socket
  (:mod:`~sparkiq.server.pg.client_socket`: ``SSLRequest``, a direct TLS handshake, and
  the login's deadline and byte budget). With ``rules.require_tls`` a startup message sent
  in plain text is refused (SQLSTATE 28000); a ``CancelRequest`` is honoured either way, as
  in Postgres (it carries the secret, never a password).
- With a node token or principals the client proves it knows its password (the token,
  or one of its principal's: :mod:`~sparkiq.server.pg.logins`) with SCRAM-SHA-256
  (:mod:`~sparkiq.server.pg.scram`): the password never crosses the wire, and a client
  that offers it in clear text is refused. A wrong one ends the connection with SQLSTATE
  28P01 and counts against the client's address (``AuthFailures``: after a few, logins
  from there are refused unchecked for a while, 28000). The connection's statements run as
  its principal, within its grants. Without a token every client is trusted.
- Extended protocol: ``Parse`` keeps the text; ``Bind`` substitutes the parameters as SQL
  literals (:func:`~sparkiq.server.pg.parameters.bind_parameters`, within ``PgLimits``:
  a Bind over them fails with SQLSTATE 54000 naming the parameter); ``Describe`` of a portal
  runs it (the rows are then sent by ``Execute``); ``Describe`` of a statement types its
  untyped parameters after the columns they are compared with
  (:meth:`~sparkiq.server.pg.answers.Answers.parameter_types`) and runs it with NULL
  parameters to learn the columns. After an error every message up to ``Sync`` is skipped,
  as a server must.
- Cancel requests: each session has its own key (``BackendKeyData``: a process id unique in
  the server and a random secret); a ``CancelRequest`` naming it, on a new connection,
  cancels the statement running then (:meth:`PgSession.cancel`).
- ``BEGIN``/``COMMIT``/``ROLLBACK`` are accepted and only change the transaction status
  reported; every statement reads at its own position.

About 600 lines because it is one connection's state machine (login, then the simple and
extended protocols, its statements and portals). What stands alone lives beside it: the
socket (``client_socket.py``), framing (``wire.py``), SCRAM (``scram.py``), users and the
password exchange (``logins.py``), Bind (``parameters.py``), limits (``limits.py``),
statement splitting (``statements.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pygwire import BackendConnection
from pygwire import messages as m
from pygwire.exceptions import ProtocolError

from sparkiq.error_codes import ErrorCode
from sparkiq.limits import PgLimits
from sparkiq.principals import Principal
from sparkiq.principals import current as current_principal
from sparkiq.server.audit import AuditLog
from sparkiq.server.auth_failures import AuthFailures, peer_of
from sparkiq.server.pg.answers import Answer, Answers
from sparkiq.server.pg.client_socket import ClientGone, ClientSocket, Refused
from sparkiq.server.pg.copy import copy_rows
from sparkiq.server.pg.errors import (
    error_fields,
    fatal_fields,
    throttled_fields,
)
from sparkiq.server.pg.errors import sqlstate as sqlstate_of
from sparkiq.server.pg.logins import PgLogins, password_exchange
from sparkiq.server.pg.parameters import bind_parameters
from sparkiq.server.pg.parking import NotAtHand, Parking
from sparkiq.server.pg.prepared import Portal, Statement, fields
from sparkiq.server.pg.reactor import Reactor
from sparkiq.server.pg.running import Running
from sparkiq.server.pg.statements import is_blank, parameter_count, split_statements
from sparkiq.server.pg.types import PgColumn
from sparkiq.server.pg.wire import (
    BIND_COMPLETE,
    CLOSE_COMPLETE,
    EMPTY_QUERY,
    NO_DATA,
    PARSE_COMPLETE,
    PORTAL_SUSPENDED,
    Frames,
    command_complete,
    data_row,
    decode,
    ready_for_query,
    row_description,
)
from sparkiq.sql.errors import SqlLimitError, SqlUnknownNameError
from sparkiq.tls import TlsContexts

__all__ = ["PgSession", "SessionRules"]

log = logging.getLogger("sparkiq.server.pg")

_RECV = 65536


@dataclass(frozen=True)
class SessionRules:
    """What every session of one server shares: what answers its statements
    (:class:`~sparkiq.server.pg.answers.Answers`), the password (the node's token, kept as
    a SCRAM-SHA-256 verifier; None trusts everyone) and its failures (slowed per client
    address), the limits (how long a client may take to start up and log in, how many bytes
    it may send meanwhile, what a Bind may hold), the parameters reported to it after login,
    where a cancel request goes, whom to tell that a session logged in (False: it was
    evicted meanwhile and must end), the node's TLS contexts (None: ``SSLRequest`` is
    declined) and whether a client must use them (only with ``tls``)."""

    answers: Answers
    logins: PgLogins  # users (the node's principals), their passwords as SCRAM verifiers
    limits: PgLimits
    auth_failures: AuthFailures  # wrong passwords, slowed per client address
    parameters: dict[str, str]
    cancel: Callable[[int, bytes], None]  # a CancelRequest's process id and secret
    logged_in: Callable[[PgSession], bool]
    audit: AuditLog | None = None  # one line per statement, when the node keeps the log
    reactor: Reactor | None = None  # serves idle plain-text connections (pg/reactor.py)
    tls: TlsContexts | None = None
    require_tls: bool = False


class PgSession(Parking):
    """Serves one connection on ``sock`` under ``rules`` until the client leaves or
    :meth:`close`."""

    def __init__(self, sock: socket.socket, rules: SessionRules, process_id: int) -> None:
        self.io = ClientSocket(sock, rules.limits)  # plain or TLS; bounded until login
        self.rules = rules
        # BackendKeyData: a client's CancelRequest names this session by both.
        self.process_id = process_id
        self.secret = os.urandom(4)
        self.running = Running(self.secret)
        self.reactor = rules.reactor
        self.principal: Principal | None = None
        self.here = False
        self.idle = False
        self._resumed = threading.Event()
        self.answers = rules.answers
        self.limits = rules.limits
        self.parameters = rules.parameters
        self.conn = BackendConnection()  # the login's state machine (see pg/wire.py)
        self.frames = Frames(self._recv)
        self.serving = False
        self.out: list[bytes] = []
        self.in_transaction = False
        self.failed = False  # extended protocol: an error was sent, skip until Sync
        self.statements: dict[str, Statement] = {}
        self.portals: dict[str, Portal] = {}
        self.settings: dict[str, str] = {}
        self.user = ""
        try:
            self.peer = peer_of(sock.getpeername()[0])
        except OSError:  # already gone
            self.peer = peer_of(None)

    # -- I/O ---------------------------------------------------------------------------------

    def _send(self, msg: Any) -> None:
        self.out.append(msg.to_wire() if self.serving else self.conn.send(msg))

    def _say(self, msg: Any, flush: bool) -> None:
        self._send(msg)
        if flush:
            self._flush()

    def _recv(self) -> bytes:
        return self.io.recv(_RECV)

    def _flush(self) -> None:
        if self.out and not self.here:  # the reactor writes when it is done (parking.py)
            data = b"".join(self.out)
            self.out.clear()  # in place: _rows appends to it by another name
            self.io.sendall(data)

    def _login_messages(self) -> Iterator[Any]:
        """The login's messages, each handed to pygwire whole (so it holds no byte of the
        next), read after what negotiating encryption read ahead."""
        self.frames = Frames(self._recv, self.io.head)
        self.io.head = b""
        yield from self.conn.receive(self.frames.startup())
        while True:
            yield from self.conn.receive(self.frames.whole())

    @property
    def busy(self) -> bool:
        """Whether a statement (or an extended-protocol message) is running."""
        return self.running.busy

    def cancel(self, secret: bytes) -> bool:
        """See :meth:`Running.cancel`."""
        return self.running.cancel(secret)

    def close(self) -> None:
        """End the connection from another thread (the node stops, or a newer login needs
        the slot)."""
        self.io.shut_down()

    # -- the connection ----------------------------------------------------------------------

    def run(self) -> None:
        self.running.enter()
        try:
            self.io.start_login()
            self.io.negotiate(self.rules.tls)
            if not self._startup():
                return
            self.io.logged_in()
            self._serve()
        except ssl.SSLError as exc:  # a client that does not trust the node says so here
            log.info("pg TLS handshake failed: %s", exc)
        except (ClientGone, TimeoutError, ConnectionError, OSError):
            pass
        except (ProtocolError, Refused) as exc:
            # A message that cannot be read (or not now), or too much of them: the client is
            # broken or hostile, so tell it, as Postgres does, and end the connection
            # without a traceback.
            log.info("pg connection refused: %s", exc)
            if isinstance(exc, Refused):
                fields = fatal_fields(exc.sqlstate, str(exc))
            else:
                fields = fatal_fields("08P01", f"protocol violation: {exc}")
            self.out.clear()
            with contextlib.suppress(ProtocolError):  # an error may not be sendable now
                self._send(m.ErrorResponse(fields=fields))
        except Exception:
            log.exception("pg connection failed")
        finally:
            with contextlib.suppress(OSError):
                self._flush()
            self.io.close()

    def _startup(self) -> bool:
        messages = self._login_messages()
        for msg in messages:
            if isinstance(msg, m.SSLRequest | m.GSSEncRequest):
                # _negotiate took the first of each: a second is a broken client
                raise Refused("08P01", f"{type(msg).__name__} sent twice")
            elif isinstance(msg, m.CancelRequest):
                # Sent on a new connection; Postgres answers nothing and closes it.
                secret = msg.secret_key
                if isinstance(secret, int):
                    secret = secret.to_bytes(4, "big")
                self.rules.cancel(msg.process_id, bytes(secret))
                return False
            elif isinstance(msg, m.StartupMessage):
                self.user = msg.params.get("user", "")
                if self.rules.require_tls and not self.io.encrypted:
                    # Refused before the password exchange: SCRAM never sends the password,
                    # but its rows, and who logs in, would cross the network in clear text.
                    raise Refused(
                        "28000",
                        "this node accepts Postgres connections over TLS only: connect with "
                        "sslmode=require or stronger (sslmode=verify-full with the node's CA "
                        "as sslrootcert also checks that it is the node)",
                    )
                if self.rules.logins.required:
                    failures = self.rules.auth_failures
                    wait = failures.admit(self.peer, "pg")
                    if wait > 0:  # refused before any password is looked at
                        self._send(m.ErrorResponse(fields=throttled_fields(self.peer, wait)))
                        return False
                    verdict = None
                    principal, verifiers = self.rules.logins.login(self.user)
                    try:
                        verdict = password_exchange(
                            verifiers, messages, self._say, failures, self.peer, self.user
                        )
                    finally:
                        if verdict is None:  # the client left (or broke the exchange)
                            failures.abandoned(self.peer)
                    if not verdict:
                        return False
                    # every statement of this connection (its thread) runs as that principal
                    current_principal.set(principal)
                    self.principal = principal
                if not self.rules.logged_in(self):
                    return False  # evicted while logging in: the socket is shut already
                self._send(m.AuthenticationOk())
                for name, value in self.parameters.items():
                    self._send(m.ParameterStatus(name=name, value=value))
                self._send(m.BackendKeyData(process_id=self.process_id, secret_key=self.secret))
                self.serving = True
                self._ready()
                return True
        return False

    def _ready(self) -> None:
        self.out.append(ready_for_query(self.in_transaction))
        self._flush()
        self.idle = True  # a round is answered: the connection may park

    def _serve(self) -> None:
        """Answer the client's messages until it leaves; between rounds, park the
        connection with the reactor (pg/parking.py) when there is one."""
        parks = self.reactor is not None and not self.io.encrypted
        while True:
            for ident, payload in self.frames:
                if not self._handle(decode(ident, payload)):
                    return
                if parks and self.idle and not self.frames.buffered:
                    break
            self._park()

    def _handle(self, msg: Any) -> bool:
        """Answer one message (or skip it); False: the client said goodbye."""
        self.idle = False
        if isinstance(msg, m.Terminate):
            return False
        if isinstance(msg, m.Query):
            self.running.begin()
            try:
                self._simple(msg.query_string)
            finally:
                self.running.end()
            self._ready()  # after the statement stopped counting as running
        elif isinstance(msg, m.Sync):
            self.failed = False
            self._ready()
        elif isinstance(msg, m.Flush):
            self._flush()
        elif not self.failed:
            self.running.begin()
            try:
                self._extended(msg)
            except NotAtHand:
                raise
            except Exception as exc:
                self.failed = True
                self._send(m.ErrorResponse(fields=error_fields(exc, _text_of(msg, self))))
            finally:
                self.running.end()
        return True

    # -- simple query protocol ---------------------------------------------------------------

    def _simple(self, query: str) -> None:
        for text in split_statements(query):
            if is_blank(text):
                self.out.append(EMPTY_QUERY)
                continue
            try:
                answer = self._run(text)
                if answer.copy is not None:
                    self._copy_out(answer)
                elif answer.columns is not None:
                    self.out.append(row_description(fields(answer.columns, [])))
                    self._rows(answer, [c.encoder(False) for c in answer.columns], 0, None)
            except NotAtHand:
                raise
            except Exception as exc:
                # After RowDescription too: Postgres may end a result with an error.
                self._send(m.ErrorResponse(fields=error_fields(exc, text)))
                break  # the rest of a multi-statement query is not run, as in Postgres
            self.out.append(command_complete(answer.tag))

    def _run(self, text: str, pull: bool = False) -> Answer:
        """The answer to ``text``; ``pull``: known to be a pull query (a prepared one's)."""
        self.running.check()
        started = time.perf_counter()
        audited = self.rules.audit is not None
        try:
            if self.here:  # the reactor's: a pull query at hand, or the thread's work
                if not (pull or self.answers.is_pull(text)):
                    raise NotAtHand
                here = self.answers.pull_here(text, self.settings, tables=audited)
                if here is None:
                    raise NotAtHand
                answer = here
            elif pull:
                answer = self.answers.pull(text, self.settings, tables=audited)
            else:
                answer = self.answers.answer(text, self.settings, self.user)
        except NotAtHand:
            raise
        except Exception as exc:
            self._audit(started, sqlstate_of(exc), ())
            self.running.check()  # a statement canceled while it ran fails as canceled
            raise
        self._audit(started, "00000", answer.tables, len(answer.rows))
        self.running.check()
        if answer.tag in ("BEGIN", "START TRANSACTION"):
            self.in_transaction = True
        elif answer.tag in ("COMMIT", "ROLLBACK"):
            self.in_transaction = False
        return answer

    def _audit(
        self, started: float, status: str, tables: tuple[str, ...], rows: int | None = None
    ) -> None:
        audit = self.rules.audit
        if audit is not None:
            principal = current_principal.get()
            audit.record(
                listener="pg",
                principal=None if principal is None else principal.name,
                peer=self.peer,
                kind="statement",
                tables=tables,
                status=status,
                seconds=time.perf_counter() - started,
                rows=rows,
            )

    def _rows(
        self,
        answer: Answer,
        encoders: Sequence[Callable[[Any], bytes]],
        start: int,
        count: int | None,
    ) -> int:
        rows = answer.rows
        end = len(rows) if count is None else min(len(rows), start + count)
        names = [c.name for c in answer.columns or ()]
        pairs = list(zip(names, encoders, strict=True))
        out = self.out
        for row in rows[start:end]:
            values = [None if (v := row.get(n)) is None else enc(v) for n, enc in pairs]
            out.append(data_row(values))
            if len(out) >= 256:
                self.running.check()
                self._flush()
        return end - start

    def _copy_out(self, answer: Answer) -> None:
        """Send ``answer``'s rows as ``COPY ... TO STDOUT`` data (see pg/copy.py).

        Around the copy messages the state is that of a statement answered with
        ``CommandComplete``, which it is."""
        copy = answer.copy
        assert copy is not None
        columns = answer.columns or []
        overall = 1 if copy.binary else 0
        formats = [overall] * len(columns)
        self.out.append(m.CopyOutResponse(overall_format=overall, col_formats=formats).to_wire())
        for sent, data in enumerate(copy_rows(copy, columns, answer.rows)):
            self.out.append(m.CopyData(data=data).to_wire())
            if sent % 256 == 255:
                self.running.check()
                self._flush()
        self.out.append(m.CopyDone().to_wire())

    # -- extended query protocol -------------------------------------------------------------

    def _extended(self, msg: Any) -> None:
        if isinstance(msg, m.Parse):
            self.answers.limits.check_statement(msg.query)  # before anything scans it
            oids = list(msg.param_types)
            count = max(len(oids), parameter_count(msg.query))
            if count > self.limits.max_parameters:  # "$99999999" would be a list that long
                raise SqlLimitError(
                    f"the statement has {count} parameters, more than "
                    f"SPARKIQ_PG_MAX_PARAMETERS={self.limits.max_parameters}",
                    code=ErrorCode.TOO_MANY_PARAMETERS,
                )
            oids += [0] * (count - len(oids))
            self.statements[msg.statement] = Statement.parse(msg.query, oids, self.answers)
            self.out.append(PARSE_COMPLETE)
        elif isinstance(msg, m.Bind):
            statement = self._statement(msg.statement)
            text = bind_parameters(
                statement.text,
                msg.param_values,
                msg.param_formats,
                statement.param_oids,
                limits=self.limits,
                max_chars=self.answers.limits.max_statement_chars,
                slots=statement.slots,
            )
            self.portals[msg.portal] = Portal(statement, text, list(msg.result_formats))
            self.out.append(BIND_COMPLETE)
        elif isinstance(msg, m.Describe):
            if msg.kind == "S":
                statement = self._statement(msg.name)
                # Told to the client, which then sends values of these types (asyncpg).
                statement.param_oids = self.answers.parameter_types(
                    statement.text, statement.param_oids
                )
                self._send(m.ParameterDescription(type_oids=statement.param_oids))
                if statement.columns is None:
                    nulls: list[bytes | None] = [None] * len(statement.param_oids)
                    text = bind_parameters(
                        statement.text,
                        nulls,
                        [],
                        statement.param_oids,
                        limits=self.limits,
                        max_chars=self.answers.limits.max_statement_chars,
                        slots=statement.slots,
                    )
                    described = None if statement.blank else self._run(text, statement.pull)
                    # COPY sends its rows as copy data, described by no RowDescription
                    statement.columns = (
                        None if described is None or described.copy else described.columns
                    )
                self._describe(statement, statement.columns, [])
            else:
                portal = self._portal(msg.name)
                answer = self._answer(portal)
                columns = None if answer.copy is not None else portal.columns
                self._describe(portal.statement, columns, portal.result_formats)
        elif isinstance(msg, m.Execute):
            self._execute(self._portal(msg.portal), msg.max_rows)
        elif isinstance(msg, m.Close):
            (self.statements if msg.kind == "S" else self.portals).pop(msg.name, None)
            self.out.append(CLOSE_COMPLETE)
        else:
            raise ClientGone  # a message this endpoint does not speak (COPY, function calls)

    def _statement(self, name: str) -> Statement:
        statement = self.statements.get(name)
        if statement is None:
            raise _unknown("prepared statement", name)
        return statement

    def _portal(self, name: str) -> Portal:
        portal = self.portals.get(name)
        if portal is None:
            raise _unknown("portal", name)
        return portal

    def _answer(self, portal: Portal) -> Answer:
        if portal.answer is None:
            statement = portal.statement
            if statement.blank:
                portal.answer = Answer(None, [], "")
            else:
                answer = self._run(portal.text, statement.pull)
                portal.columns = statement.columns_of(answer.columns)
                portal.answer = answer
            if portal.columns:
                portal.encoders = statement.encoding(portal.columns, portal.result_formats)[1]
        return portal.answer

    def _describe(
        self, statement: Statement, columns: list[PgColumn] | None, formats: list[int]
    ) -> None:
        if columns is None:
            self.out.append(NO_DATA)
        else:
            self.out.append(statement.encoding(columns, formats)[0])

    def _execute(self, portal: Portal, max_rows: int) -> None:
        answer = self._answer(portal)
        if not answer.tag and answer.columns is None:
            self.out.append(EMPTY_QUERY)
            return
        if answer.copy is not None:
            self._copy_out(answer)
        elif answer.columns is not None:
            count = max_rows if max_rows > 0 else None
            portal.sent += self._rows(answer, portal.encoders, portal.sent, count)
            if portal.sent < len(answer.rows):
                self.out.append(PORTAL_SUSPENDED)
                return
        self.out.append(command_complete(answer.tag))


def _unknown(what: str, name: str) -> Exception:
    return SqlUnknownNameError(f"{what} {name!r} does not exist", code=ErrorCode.UNKNOWN_STATEMENT)


def _text_of(msg: Any, session: PgSession) -> str | None:
    if isinstance(msg, m.Parse):
        return str(msg.query)
    portal = session.portals.get(getattr(msg, "portal", getattr(msg, "name", "")))
    return portal.text if portal is not None else None
