"""Hedged reads: how long to wait for one replica before asking another (a delay learned
from latency), and the copies of one read out at once, of which the first answer wins.

A request that a healthy node answers in 5 ms and one that it answers in 2 s must not be
given up on after the same wait. :class:`HedgeDelay` keeps the latest latencies of answered
requests per kind (a query type, ``sql``) and derives the wait from them:
``k x p99``, never below ``floor`` (so scheduler noise on a loaded machine does not send
every request twice) and never above ``ceiling`` (so a node cut off from the network costs
at most that, whatever the history says).

``None`` means "do not hedge; wait as you would without hedging": for a kind whose median
latency is above ``ceiling`` (a heavy SQL statement), a node working on it and a node that
is gone look the same for that long, and sending it elsewhere would only double heavy work.

A kind with too few latencies of its own (fewer than :data:`MIN_SAMPLES`) gets ``ceiling``,
the most patient bounded wait -- unless the kinds together show a median above it. So a
caller with no history yet (a new client whose first node is cut off) waits ``ceiling``, not
its whole timeout; the price is that a heavy kind is sent twice until its latencies are
known.

The latencies are wall-clock and measured where they are used, so a loaded machine raises
the delay with everything else: the delay follows what the machine does now, not a guess
made for an idle one.

Thread-safe: ``record`` and ``delay`` may run on any thread (``record`` takes a lock;
``delay`` reads values that are replaced whole, never changed in place).

:class:`Copies` is the one place a hedged read's copies are sent, waited for and let go of,
used by the client (:class:`~sparkiq.client.Client`, racing the nodes it knows) and the
router (:class:`~sparkiq.cluster.router.Router`, racing a partition's replicas); each decides
*when* a copy is overdue and *which* answer is good, :class:`Copies` does the rest. A copy
runs inside its own :class:`~sparkiq.cancel.CancelSignal`: one nobody waits for any more has
its connection cut (the node then stops working on it) and, if it had already answered, its
answer released (a stream it was sending is closed). A :class:`Copies` belongs to the one
thread that runs the race.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Executor, Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sparkiq.cancel import CancelSignal, cancellable
from sparkiq.query.result import QueryResult

__all__ = ["MIN_SAMPLES", "Copies", "Copy", "HedgeDelay", "close_results"]

T = TypeVar("T")

#: Latencies a kind needs before a delay is derived from them.
MIN_SAMPLES = 8
#: Latencies kept per kind (the p99 of the last WINDOW answers).
WINDOW = 256
#: A kind's delay is derived again after this many more of its latencies.
RECOMPUTE_EVERY = 16


class HedgeDelay:
    """``k x p99`` of recent latencies per kind, within ``[floor, ceiling]`` seconds.

    The delay of a kind is recomputed every :data:`RECOMPUTE_EVERY` latencies it records,
    so :meth:`delay` (on every request's path) is a dictionary read."""

    def __init__(self, *, floor: float, ceiling: float, k: float = 3.0) -> None:
        if not 0 < floor <= ceiling:
            raise ValueError(f"need 0 < floor <= ceiling, got {floor} and {ceiling}")
        self.floor, self.ceiling, self.k = floor, ceiling, k
        self._windows: dict[str, deque[float]] = {}
        self._counts: dict[str, int] = {}
        self._delays: dict[str, float | None] = {}
        self._pooled_median: float | None = None
        # guards the three dicts above, the deques in them and _pooled_median
        self._lock = threading.Lock()

    def record(self, kind: str, seconds: float) -> None:
        """An answer of ``kind`` arrived ``seconds`` after its request was sent."""
        with self._lock:
            window = self._windows.get(kind)
            if window is None:
                window = self._windows[kind] = deque(maxlen=WINDOW)
            window.append(seconds)
            count = self._counts[kind] = self._counts.get(kind, 0) + 1
            if count == MIN_SAMPLES or count % RECOMPUTE_EVERY == 0:
                self._delays[kind] = self._derive(sorted(window))
                pooled = sorted(x for w in self._windows.values() for x in w)
                self._pooled_median = pooled[len(pooled) // 2]

    def _derive(self, ordered: list[float]) -> float | None:
        if ordered[len(ordered) // 2] > self.ceiling:
            return None
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return min(self.ceiling, max(self.floor, self.k * p99))

    def delay(self, kind: str) -> float | None:
        """How long to wait for an answer of ``kind`` before asking elsewhere; ``None``
        when there is no basis to give up early (see the module docstring)."""
        if kind in self._delays:
            return self._delays[kind]
        median = self._pooled_median
        return None if median is not None and median > self.ceiling else self.ceiling


def close_results(results: Mapping[int, QueryResult[Any]]) -> None:
    """Close the rows of results nobody reads any more -- the answer of a copy that lost the
    race (they may still be streaming from the node that sent them)."""
    for result in results.values():
        close = getattr(result.result, "close", None)
        if callable(close):
            close()


@dataclass(frozen=True)
class Copy(Generic[T]):
    """One copy of a read: where it went, when, and its outcome once done."""

    target: str
    sent_at: float
    future: Future[T]
    cancel: CancelSignal


class Copies(Generic[T]):
    """The copies of one read that are out (see the module docstring).

    ``release`` lets go of the answer of a copy that finished after nobody waited for it
    any more (closing the rows it streams); a copy that failed needs nothing."""

    def __init__(self, pool: Executor, release: Callable[[T], None] | None = None) -> None:
        self._pool = pool
        self._release = release
        self._out: dict[Future[T], Copy[T]] = {}

    def send(self, target: str, fn: Callable[..., T], *args: Any) -> None:
        """Run ``fn(*args)`` on the pool as the copy sent to ``target``."""
        cancel = CancelSignal()
        future = self._pool.submit(_cancellable_by, cancel, fn, *args)
        self._out[future] = Copy(target, time.monotonic(), future, cancel)

    def __bool__(self) -> bool:
        return bool(self._out)

    def __iter__(self) -> Iterator[Copy[T]]:
        return iter(list(self._out.values()))

    def all_overdue(self, overdue: Callable[[Copy[T]], bool]) -> bool:
        """Whether every copy out is overdue (true when none is): time to ask another."""
        return all(overdue(copy) for copy in self._out.values())

    def newest_sent(self) -> float:
        """When the latest copy out was sent (monotonic seconds)."""
        return max(copy.sent_at for copy in self._out.values())

    def wait(self, timeout: float | None) -> list[Copy[T]]:
        """The copies that finish within ``timeout`` seconds (``None``: until one does),
        no longer out once returned."""
        done, _ = futures_wait(self._out, timeout=timeout, return_when=FIRST_COMPLETED)
        return [self._out.pop(future) for future in done]

    def abandon(self, copy: Copy[T]) -> None:
        """Stop waiting for ``copy``: cut its connection, release its answer if it comes."""
        if self._out.pop(copy.future, None) is None:
            return
        copy.cancel.set()
        copy.future.add_done_callback(self._let_go)

    def abandon_all(self) -> None:
        """Stop waiting for every copy still out (the race is over)."""
        for copy in list(self._out.values()):
            self.abandon(copy)

    def _let_go(self, future: Future[T]) -> None:
        if self._release is None or future.cancelled() or future.exception() is not None:
            return
        self._release(future.result())


def _cancellable_by(signal: CancelSignal, fn: Callable[..., T], *args: Any) -> T:
    with cancellable(signal):
        return fn(*args)
