"""Thread pools that grow with the load, shrink after it and say what they hold.

A ``ThreadPoolExecutor`` starts a thread whenever work arrives and no thread is idle, up to
its bound, and keeps every thread for the life of the process. A node's pools see bursts --
a range query fans out to every partition, a silent peer holds each sub-request to it for a
whole timeout -- so they crept up to their bounds over hours, and a node's threads and memory
(each thread's stack and malloc arena, about half a megabyte here) rose for as long as a
soak ran: bounded, but never flat. An :class:`ElasticPool` ends a thread that found no work
for ``idle_seconds``, so after a burst the pool returns to what the steady load needs.

Its threads are daemons. Whoever owns a pool shuts it down; at interpreter exit a task still
running (a copy out to a silent node) is abandoned instead of holding the process until its
timeout, which a ``ThreadPoolExecutor`` would do.

Work runs in the context (``contextvars``) of the code that submitted it, as
``asyncio.to_thread`` does: a request's cancel signal (:mod:`sparkiq.cancel`) follows its
work onto pool threads.

Every live pool is listed by :func:`pool_limits`, so ``/metrics`` can show each pool's
threads next to its bound.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["ElasticPool", "pool_limits"]

T = TypeVar("T")

_Work = tuple[Future[Any], contextvars.Context, Callable[..., Any], tuple[Any, ...], dict[str, Any]]

#: Every pool not yet shut down (weak: a pool nobody holds any more drops out by itself).
_live: weakref.WeakSet[ElasticPool] = weakref.WeakSet()
_live_lock = threading.Lock()  # guards _live


def pool_limits() -> dict[str, int]:
    """The thread bound of each pool name, summed over the live pools of that name (a
    process running several nodes has one pool of each name per node)."""
    with _live_lock:
        pools = list(_live)
    limits: dict[str, int] = {}
    for pool in pools:
        limits[pool.name] = limits.get(pool.name, 0) + pool.max_threads
    return limits


class ElasticPool(Executor):
    """An executor with at most ``max_threads`` threads named ``<name>_<n>``, started as work
    arrives and ended after ``idle_seconds`` without any."""

    def __init__(self, name: str, max_threads: int, *, idle_seconds: float = 30.0) -> None:
        if max_threads < 1:
            raise ValueError(f"a pool needs at least one thread, got max_threads={max_threads}")
        self.name = name
        self.max_threads = max_threads
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        # _work, _threads, _idle, _started and _shut are guarded by _lock; _ready (on the
        # same lock) wakes an idle thread when work arrives or the pool shuts down.
        self._ready = threading.Condition(self._lock)
        self._work: deque[_Work] = deque()
        self._threads = 0  # threads alive
        self._idle = 0  # of them, those not running work (waiting, woken, handing back)
        self._started = 0  # threads ever started, for their names
        self._shut = False
        self._own = threading.local()  # .thread is True on this pool's threads
        with _live_lock:
            _live.add(self)

    @property
    def threads(self) -> int:
        """Threads alive now."""
        with self._lock:
            return self._threads

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError(f"cannot schedule new work: pool {self.name!r} is shut down")
            self._work.append((future, contextvars.copy_context(), fn, args, kwargs))
            # Idle threads (waiting, woken but not yet running, or handing back a result)
            # each take one piece of work; only work beyond them needs a new thread.
            if len(self._work) > self._idle and self._threads < self.max_threads:
                self._start_thread()
            else:
                self._ready.notify()
        return future

    def _start_thread(self) -> None:
        """Start a thread for the work just queued (caller holds _lock)."""
        self._threads += 1
        self._idle += 1  # it starts by taking work
        self._started += 1
        thread = threading.Thread(
            target=self._run, name=f"{self.name}_{self._started}", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # the process can start no more threads: refuse the work
            self._threads -= 1
            self._idle -= 1
            self._work.pop()
            raise

    def _run(self) -> None:
        self._own.thread = True
        while (work := self._next()) is not None:
            self._execute(*work)
            del work  # hold nothing of it (its arguments) while idle

    def _execute(
        self,
        future: Future[Any],
        context: contextvars.Context,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        if not future.set_running_or_notify_cancel():
            self._back()
            return
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # handed to whoever waits on the future
            self._back()
            future.set_exception(exc)
        else:
            self._back()
            future.set_result(result)

    def _back(self) -> None:
        """Count this thread idle again *before* its caller hears the result: a caller that
        submits its next work at once finds it idle instead of starting another thread."""
        with self._lock:
            self._idle += 1

    def _next(self) -> _Work | None:
        """The next work to run, or None when this (idle) thread should end: idle for
        ``idle_seconds``, or the pool shut down with nothing queued."""
        with self._lock:
            while not self._work:
                if self._shut:
                    break
                if not self._ready.wait(self.idle_seconds) and not self._work:
                    break
            else:
                self._idle -= 1
                return self._work.popleft()
            self._idle -= 1
            self._threads -= 1
            if self._shut:
                self._ready.notify_all()  # shutdown(wait=True) counts the threads down
            return None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; with ``cancel_futures``, cancel what has not started. Threads end
        once the queue is empty; with ``wait``, this returns when they have (so a pool's own
        thread may not wait for it)."""
        if wait and getattr(self._own, "thread", False):
            raise RuntimeError(f"a thread of pool {self.name!r} cannot wait for its shutdown")
        with self._lock:
            self._shut = True
            cancelled = list(self._work) if cancel_futures else []
            if cancel_futures:
                self._work.clear()
            self._ready.notify_all()
        with _live_lock:
            _live.discard(self)
        for future, *_ in cancelled:
            future.cancel()
        if wait:
            with self._lock:
                while self._threads:
                    self._ready.wait()
