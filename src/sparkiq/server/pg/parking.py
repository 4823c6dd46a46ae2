"""A Postgres session's life while parked: between rounds its connection waits in the
listener's :class:`~sparkiq.server.pg.reactor.Reactor`, which answers what it can at hand
on the reactor's thread, and hands the session back to its own thread for the rest.

What the reactor answers (:meth:`Parking.serve_parked`): ``Parse``, ``Bind``, ``Close``,
``Sync``, ``Flush``, and a ``Describe`` of a portal, ``Execute`` or one-statement ``Query``
whose statement is a pull query answered from a cached plan at the newest batch
(:meth:`~sparkiq.server.pg.answers.Answers.pull_here`: a key lookup, no DuckDB). Anything
else, or a statement that turns out not to be at hand (:class:`NotAtHand`, raised before
the message changed anything), is given back unread with every message after it, as are
answers the socket would not take without blocking: the session's thread then serves them
exactly as it serves a connection that was never parked. Only plain-text connections park
(a TLS socket's reads and writes are not split as cleanly). A connection gets at most
``_TURN`` messages answered per turn: one that streams more goes back to its thread.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING, Any

from pygwire import messages as m
from pygwire.exceptions import ProtocolError

from sparkiq.principals import Principal
from sparkiq.principals import current as current_principal
from sparkiq.server.pg.running import Running
from sparkiq.server.pg.statements import split_statements
from sparkiq.server.pg.wire import Frames, decode

if TYPE_CHECKING:
    from sparkiq.server.pg.client_socket import ClientSocket
    from sparkiq.server.pg.reactor import Reactor

__all__ = ["NotAtHand", "Parking"]

log = logging.getLogger("sparkiq.server.pg")

_RECV = 65536
# Messages the reactor answers for one connection per turn: a client that streams lookups
# without waiting goes back to its thread (time-sliced with the others on the interpreter
# lock, as before the reactor) instead of holding up every parked connection.
_TURN = 128
# Messages the reactor may take on (a Describe of a statement may plan one in DuckDB).
_AT_HAND = (m.Parse, m.Bind, m.Close, m.Sync, m.Flush, m.Execute)


class NotAtHand(Exception):
    """The message needs the session's thread (raised before it changed anything)."""


class Parking:
    """The parked half of :class:`~sparkiq.server.pg.session.PgSession` (a mixin: the
    attributes below are the session's)."""

    io: ClientSocket
    frames: Frames
    out: list[bytes]
    running: Running
    reactor: Reactor | None
    principal: Principal | None
    here: bool  # the reactor is serving the session: answer at hand or raise NotAtHand
    _resumed: threading.Event

    def _handle(self, msg: Any) -> bool:
        """The session's: answer one message; False to end the connection."""
        raise NotImplementedError

    def _flush(self) -> None:
        """The session's: send what was answered."""
        raise NotImplementedError

    @property
    def parked_socket(self) -> socket.socket:
        return self.io.sock

    def _park(self) -> None:
        """From the session's thread: hand the connection to the reactor and sleep until
        it is handed back."""
        reactor = self.reactor
        assert reactor is not None
        self._resumed.clear()
        self.io.sock.setblocking(False)
        if reactor.park(self):
            self._resumed.wait()
        self.io.sock.setblocking(True)
        self.running.enter()  # the reactor may have replaced the signal
        self._flush()  # what the reactor could not write without blocking

    def resume(self) -> None:
        """From the reactor: the session's thread owns the connection again."""
        self._resumed.set()

    def serve_parked(self) -> bool:
        """From the reactor: read what the client sent and answer what is at hand. False
        when the session needs its thread (the reactor then hands it back)."""
        try:
            data = self.io.sock.recv(_RECV)
        except BlockingIOError:
            return True
        except OSError:
            return False  # the thread meets the error and ends the connection
        if not data:
            return False
        self.frames.feed(data)
        current_principal.set(self.principal)
        self.running.enter()
        self.here = True
        try:
            return self._serve_here()
        except Exception:  # a fault: the thread serves what is left, and meets it there
            log.debug("a parked Postgres session goes back to its thread", exc_info=True)
            return False
        finally:
            self.here = False

    def _serve_here(self) -> bool:
        for _ in range(_TURN):
            try:
                taken = self.frames.ready()
            except ProtocolError:  # the thread reads it again and ends the connection
                return False
            if taken is None:
                break
            try:
                msg = decode(*taken)
            except ProtocolError:
                self.frames.push_back()
                return False
            if not _at_hand(msg):
                self.frames.push_back()
                return False
            try:
                self._handle(msg)
            except NotAtHand:
                self.frames.push_back()
                return False
        else:  # a turn's worth answered: the thread serves the rest it was sent
            self._write_here()  # what it cannot write, the thread does
            return False
        return self._write_here()

    def _write_here(self) -> bool:
        """Send the answers without blocking; False if the socket took only part."""
        if not self.out:
            return True
        data, self.out = b"".join(self.out), []
        try:
            sent = self.io.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            return False
        if sent < len(data):
            self.out = [data[sent:]]
            return False
        return True


def _at_hand(msg: Any) -> bool:
    """Whether the reactor may take ``msg`` on (it may still raise :class:`NotAtHand`)."""
    if isinstance(msg, _AT_HAND):
        return True
    if isinstance(msg, m.Describe):
        return msg.kind != "S"
    if isinstance(msg, m.Query):
        return len(split_statements(msg.query_string)) == 1
    return False
