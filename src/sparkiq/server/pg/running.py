"""Whether a Postgres session is running a message, and the cancel requests that may stop
it.

A ``CancelRequest`` (on another connection, naming the session by its process id and
secret) cancels the statement running then; one that arrives between statements does
nothing, as in Postgres. The statement's work sees the signal too (:mod:`sparkiq.cancel`),
so a DuckDB statement stops instead of running on to the timeout. One signal serves the
session's messages until a cancel request sets it; then the next message gets a fresh one.
"""

from __future__ import annotations

import hmac
import threading

from sparkiq.cancel import CancelSignal, use_signal
from sparkiq.server.pg.errors import StatementCanceledError

__all__ = ["Running"]


class Running:
    """One session's running state and cancel signal (see the module docstring); thread
    safe: :meth:`cancel` and :attr:`busy` are called from other threads."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self._lock = threading.Lock()  # guards _busy and _signal (not the signal's state)
        self._busy = False
        self._signal = CancelSignal()

    def enter(self) -> None:
        """Make the session's signal the current work's in this thread's context (the
        session's thread, or the reactor's while it serves the session)."""
        use_signal(self._signal)

    def begin(self) -> None:
        """A message starts running (until :meth:`end`): cancel requests now cancel it."""
        with self._lock:
            if self._signal.is_set():
                self._signal = CancelSignal()
                use_signal(self._signal)
            self._busy = True

    def end(self) -> None:
        with self._lock:
            self._busy = False

    @property
    def busy(self) -> bool:
        """Whether a statement (or an extended-protocol message) is running."""
        with self._lock:
            return self._busy

    def cancel(self, secret: bytes) -> bool:
        """Cancel the running statement if ``secret`` is the session's (from another
        thread: a CancelRequest). The statement fails with SQLSTATE 57014 at its next
        check: before it starts, when the node's answer comes back, and between batches of
        rows sent; a DuckDB statement running on this node for it is interrupted within
        the SQL watchdog's poll. Returns whether the secret matched."""
        if not hmac.compare_digest(secret, self.secret):
            return False
        with self._lock:
            if self._busy:
                self._signal.set()
        return True

    def check(self) -> None:
        """Raise :class:`StatementCanceledError` if a cancel request stopped the message."""
        with self._lock:
            canceled = self._signal.is_set()
        if canceled:
            raise StatementCanceledError("canceling statement due to user request")
