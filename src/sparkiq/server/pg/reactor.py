"""One thread that serves every idle Postgres connection's next messages, so that
connection threads do not take turns on the interpreter lock.

Each connection still has its own thread (login, TLS, and anything that may block: a
statement DuckDB runs, a catalog query, a COPY, a wait for the client). Between rounds,
once a round has been answered and nothing more was read, a plain-text connection's thread
*parks* it here (:meth:`Reactor.park`) and sleeps. The reactor waits for any parked
connection to become readable (one ``epoll``), reads what came and lets the session answer
what it can at hand (:meth:`Parked.serve_parked`: a key lookup answered from a cached plan,
``Bind``/``Sync``/``Close``...), writing its answers without blocking. When a message
needs more (a statement to plan or run in DuckDB, a write the socket would not take whole,
the client leaving), the session is *handed back*: unregistered here and its thread woken
(:meth:`Parked.resume`), which serves it as before and parks it again after the round.

Why: with a thread per connection, 32 connections sending key lookups are 32 threads that
each wake on their socket and wait for the interpreter lock; every lock hand-off between
them is a futex wake and a context switch, and throughput with 32 connections fell below
that of one. Here one thread serves them one after another, as the REST API's event loop
does.

Ownership: a parked session belongs to the reactor until it is handed back; its thread
touches neither its socket nor its state meanwhile. :meth:`Reactor.stop` hands every
session back (their sockets are shut by then, so their threads end).
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from typing import Protocol

__all__ = ["Parked", "Reactor"]

log = logging.getLogger("sparkiq.server.pg")


class Parked(Protocol):
    """What the reactor needs of a session."""

    @property
    def parked_socket(self) -> socket.socket: ...

    def serve_parked(self) -> bool:
        """Read and answer what can be answered at hand; False: hand the session back."""
        ...

    def resume(self) -> None:
        """Wake the session's thread: it owns the session again."""
        ...


class Reactor:
    """The reactor of one Postgres listener (see the module docstring)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        # A byte on _wake tells the reactor thread that sessions wait in _parking or that
        # it must stop (the selector is only touched by that thread).
        self._wake_read, self._wake = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._lock = threading.Lock()  # guards _parking and _stopped
        self._parking: list[Parked] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="sparkiq-pg-reactor", daemon=True)

    def start(self) -> Reactor:
        self._thread.start()
        return self

    def park(self, session: Parked) -> bool:
        """Serve ``session`` here until it needs its thread (then :meth:`Parked.resume`).
        False if the reactor has stopped: the thread keeps the session."""
        with self._lock:
            if self._stopped:
                return False
            self._parking.append(session)
        self._nudge()
        return True

    def _nudge(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # a byte is pending already
            self._wake.send(b"\x00")

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except Exception:  # a bug: hand every session back rather than strand it
            log.exception("the Postgres reactor failed; connections go on in their threads")
        finally:
            with self._lock:
                self._stopped = True
                parking, self._parking = self._parking, []
            for key in list(self._selector.get_map().values()):
                if key.data is not None:
                    self._selector.unregister(key.fileobj)
                    key.data.resume()
            for session in parking:
                session.resume()
            self._selector.close()
            self._wake_read.close()

    def _step(self) -> bool:
        """Serve what is ready once; False once stopped."""
        for key, _ in self._selector.select():
            session: Parked | None = key.data
            if session is None:
                with contextlib.suppress(BlockingIOError):
                    while self._wake_read.recv(4096):
                        pass
                with self._lock:
                    if self._stopped:
                        return False
                    parking, self._parking = self._parking, []
                for parked in parking:
                    self._selector.register(parked.parked_socket, selectors.EVENT_READ, parked)
                continue
            if not session.serve_parked():
                self._selector.unregister(key.fileobj)
                session.resume()
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """Hand every session back and end the reactor's thread."""
        with self._lock:
            self._stopped = True
        self._nudge()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._wake.close()
