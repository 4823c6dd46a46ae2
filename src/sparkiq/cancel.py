"""Work whose caller stopped waiting for it.

A request's work runs on a pool thread while the caller waits: an HTTP client that hangs up,
a router that stopped waiting for a sub-request (another replica answered first, or the
member went silent), psql's Ctrl-C (a CancelRequest). Without a signal the work runs on to
its end or to the statement timeout, burning a core for nobody. Whoever knows the caller is
gone sets a :class:`CancelSignal`; the work runs inside :func:`cancellable` and whatever
takes long looks at :func:`cancel_signal`: the SQL watchdog interrupts a DuckDB statement
within its 25 ms poll, and a request out to another node has its connection cut (that
node then sees its caller leave, and stops in turn).

The signal is a context variable, so it follows the work onto threads that copy the context
(:class:`sparkiq.pools.ElasticPool` does: a statement's fragments see it too) and is never
shared between two requests.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

__all__ = ["CancelSignal", "cancel_signal", "cancellable", "use_signal"]


class CancelSignal:
    """Set once, when the caller is gone; callbacks registered with :meth:`on_cancel` run
    then, on the thread that sets it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _set, _callbacks and _next
        self._set = False
        self._callbacks: dict[int, Callable[[], Any]] = {}
        self._next = 0

    def set(self) -> None:
        with self._lock:
            if self._set:
                return
            self._set = True
            callbacks, self._callbacks = list(self._callbacks.values()), {}
        for callback in callbacks:  # outside the lock: a callback takes locks of its own
            callback()

    def is_set(self) -> bool:
        with self._lock:
            return self._set

    @contextlib.contextmanager
    def on_cancel(self, callback: Callable[[], Any]) -> Iterator[None]:
        """Call ``callback`` if the signal is set while the block runs (at once if it
        already is)."""
        with self._lock:
            key = self._next
            self._next += 1
            registered = not self._set
            if registered:
                self._callbacks[key] = callback
        if not registered:
            callback()
        try:
            yield
        finally:
            with self._lock:
                self._callbacks.pop(key, None)


_SIGNAL: ContextVar[CancelSignal | None] = ContextVar("sparkiq_cancel_signal", default=None)


def cancel_signal() -> CancelSignal | None:
    """The signal of the current work's caller (None outside a request)."""
    return _SIGNAL.get()


@contextlib.contextmanager
def cancellable(signal: CancelSignal) -> Iterator[None]:
    """Run the block as work that stops once ``signal`` is set."""
    token = _SIGNAL.set(signal)
    try:
        yield
    finally:
        _SIGNAL.reset(token)


def use_signal(signal: CancelSignal) -> None:
    """Make ``signal`` the current work's from now on in this context: for a thread that
    runs one caller's requests one after another (a Postgres connection's), which keeps
    one signal until it is set, rather than entering :func:`cancellable` per request."""
    _SIGNAL.set(signal)
