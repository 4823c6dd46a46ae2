"""Push query subscriptions: :class:`Subscription` and its errors.

A :class:`Subscription` is one consumer's view of a push query: a bounded buffer that the
table's tail (in :mod:`sparkiq.sql.push`) fills with the changes of each committed batch,
and an iterator the consumer reads them from, change by change or a
:class:`~sparkiq.sql.push_batch.Chunk` at a time, from a thread or awaiting on an event
loop. Before it goes live it catches up in the consumer's own thread (the snapshot, then
the batches between its resume point and the tail's head). Contracts (the full semantics
are in :mod:`sparkiq.sql.push`):

* One consumer reads a subscription; :meth:`Subscription.close` is idempotent and may
  be called from any thread. The hub and its tail call ``_join`` (under the tail's lock),
  ``_offer`` (once per batch after the join, in commit order) and ``_fail``; the hub passes
  its ``unregister`` callback in, so this module needs nothing of :mod:`sparkiq.sql.push`.
* At most ``buffer_limit`` changes wait for the consumer; one more fails the subscription
  with :class:`SlowConsumerError` and frees its buffer.
* Every failure is a :class:`SubscriptionError` (root :class:`~sparkiq.errors.SparkiqError`)
  carrying ``store`` and the consumer's ``position``: subscribing again from it loses and
  repeats no change, while the changelog holds them. :class:`PositionExpiredError` means it
  no longer does.
* A :class:`~sparkiq.sql.change.Change` and its row may be shared by the subscriptions of
  one statement (one :class:`~sparkiq.sql.push_batch.Evaluated` per statement and batch):
  treat them as read-only.

Error hierarchy::

    SparkiqError
    └── SubscriptionError          push_failed: the hub closed, the changelog cannot be read
        ├── SlowConsumerError      slow_consumer: more than buffer_limit changes behind
        └── PositionExpiredError   position_expired: retention deleted the changes needed
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor

from sparkiq.changelog.feed import (
    ChangeFeed,
    RetentionGapError,
    read_state,
    require_after,
)
from sparkiq.changelog.source import ChangelogSource
from sparkiq.error_codes import ErrorCode
from sparkiq.errors import ChangelogError, SparkiqError
from sparkiq.query.position import Position
from sparkiq.sql.change import BatchPosition, Change
from sparkiq.sql.push_batch import Chunk, DecodedBatch, Decoder, Evaluated, SharedChanges
from sparkiq.sql.push_plan import PushPlan

__all__ = [
    "PositionExpiredError",
    "SlowConsumerError",
    "Subscription",
    "SubscriptionError",
    "wake_waiters",
]


class SubscriptionError(SparkiqError):
    """A subscription cannot go on (the hub closed, the changelog cannot be read);
    ``position`` is the consumer's position, to resume from."""

    code = ErrorCode.PUSH_FAILED


class SlowConsumerError(SubscriptionError):
    """The consumer fell more than ``buffer_limit`` changes behind; resume from ``position``."""

    code = ErrorCode.SLOW_CONSUMER


class PositionExpiredError(SubscriptionError):
    """Changes after the position asked for are gone (retention deleted them): start again
    with ``snapshot=True``, or keep the changelog longer."""

    code = ErrorCode.POSITION_EXPIRED


# A batch's changes for one subscription and the position after them (None: the position
# is the last change's, as for a snapshot's rows); an empty one only moves the position.
_Segment = tuple[SharedChanges, Position | None]
_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[bool]"]


def wake_waiters(waiters: list[_Waiter]) -> None:
    """Wake the event-loop consumers ``waiters`` (collected by the tail during one batch's
    fan-out): one call into each event loop, however many of its consumers it wakes."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[bool]]] = {}
    for loop, future in waiters:
        by_loop.setdefault(loop, []).append(future)
    for loop, futures in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: its consumers are gone
            loop.call_soon_threadsafe(_settle_all, futures)


def _settle_all(futures: list[asyncio.Future[bool]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(True)


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)


# -- subscriptions ----------------------------------------------------------------------------


class Subscription:
    """A running push query: a closeable iterator (and context manager) of :class:`Change`.

    Iterating blocks until the next change; it ends when the subscription is closed and
    raises :class:`SubscriptionError` (e.g. :class:`SlowConsumerError`) when it failed.
    :meth:`poll_chunk` takes every waiting change at once instead, and
    :meth:`poll_chunk_async` awaits them on an event loop (no thread per consumer: the tail
    wakes an event loop once per batch for all its consumers). One consumer reads it, with
    one of these at a time; :meth:`close` may be called from any thread.
    """

    def __init__(
        self,
        unregister: Callable[[Subscription], None],
        plan: PushPlan,
        changelog: ChangelogSource,
        decoder: Decoder,
        *,
        start: Position | None,
        resume: tuple[int, int] | None,
        snapshot: bool,
        buffer_limit: int,
    ) -> None:
        self._unregister, self.plan = unregister, plan
        self._changelog, self._decoder = changelog, decoder
        self.statement, self.table, self.columns = plan.statement, plan.table, plan.columns
        self._limit, self._snapshot = buffer_limit, snapshot
        self._resume = resume or (0, 0)  # the first change to deliver: (batch, index)
        self._held: set[bytes] | None = None if plan.predicate is None else set()
        known = start is None or snapshot  # else: what the consumer holds is unknown
        self._absent: set[bytes] | None = None if known or plan.predicate is None else set()
        self._cond = threading.Condition()
        self._queue: deque[_Segment] = deque()  # filled by the tail
        self._waiter: _Waiter | None = None  # an event-loop consumer waiting for the tail
        self._pending: deque[DecodedBatch] = deque()  # raw batches while catching up
        self._queued = 0
        # the consumer's own: segments to read, and the one being read change by change
        self._ready: deque[_Segment] = deque()
        self._current: list[Change] = []
        self._index = 0
        self._current_after: Position | None = None
        self._last: Change | Position = start or Position.empty()
        self._joined = resume is not None
        self._prefix: Iterator[_Segment] | None = None
        self._live = True
        self._closed = False
        self._failure: Callable[[], SubscriptionError] | None = None

    @property
    def position(self) -> Position:
        """Where the consumer is: resuming from it delivers exactly what it has not read."""
        last = self._last
        return last.position if isinstance(last, Change) else last

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def caught_up(self) -> bool:
        """True once the consumer has read everything that was committed when it subscribed
        (the snapshot, when asked for, and the batches from its resume point): from then on
        each change is live. Read it from the consumer's thread, between polls."""
        return (
            self._prefix is None
            and self._live
            and not self._ready
            and self._index >= len(self._current)
            and self._current_after is None
        )

    def poll(self, timeout: float | None = None) -> Change | None:
        """The next change; None when ``timeout`` seconds passed first or when closed.
        Raises :class:`SubscriptionError` when the subscription failed."""
        current, index = self._current, self._index
        if index < len(current) and not self._closed:  # the common case, kept short
            held = current[index]
            self._index = index + 1
            self._last = held
            return held
        deadline = None if timeout is None else time.monotonic() + timeout
        stepped = False
        while True:
            if self._closed:
                return None
            change = self._next_ready()
            if change is not None:
                return change
            if self._failure is not None:
                raise self._failure()
            if stepped and deadline is not None and time.monotonic() >= deadline:
                return None  # catching up took the whole timeout: let the caller send a keep-alive
            stepped = True
            if not self._step(deadline):
                return None

    def poll_chunk(self, timeout: float | None = None) -> Chunk | None:
        """Every change waiting (at least one, blocking until then), as one :class:`Chunk`;
        None when ``timeout`` seconds passed first or when closed. Raises
        :class:`SubscriptionError` when the subscription failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        stepped = False
        while True:
            if self._closed:
                return None
            chunk = self._take_chunk()
            if chunk is not None:
                return chunk
            if self._failure is not None:
                raise self._failure()
            if stepped and deadline is not None and time.monotonic() >= deadline:
                return None
            stepped = True
            if not self._step(deadline):
                return None

    async def poll_chunk_async(
        self, timeout: float | None = None, executor: Executor | None = None
    ) -> Chunk | None:
        """:meth:`poll_chunk` for a consumer on an event loop: waiting for the tail holds no
        thread (catching up reads the changelog on ``executor``; None: the loop's default)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        stepped = False
        while True:
            if self._closed:
                return None
            chunk = self._take_chunk()
            if chunk is not None:
                return chunk
            if self._failure is not None:
                raise self._failure()
            if stepped and deadline is not None and loop.time() >= deadline:
                return None
            stepped = True
            if self._prefix is not None or not self._live:
                await loop.run_in_executor(executor, self._step, None)
                continue
            with self._cond:
                if self._queue or self._closed or self._failure is not None:
                    self._move_queue()
                    continue
                future: asyncio.Future[bool] = loop.create_future()
                self._waiter = (loop, future)
            timer = None if deadline is None else loop.call_at(deadline, _expire, future)
            try:
                await future
            finally:
                if timer is not None:
                    timer.cancel()
                if self._waiter is not None:  # else the tail took it, as it woke us
                    with self._cond:
                        if self._waiter is not None and self._waiter[1] is future:
                            self._waiter = None
            with self._cond:
                self._move_queue()

    def _next_ready(self) -> Change | None:
        """The next change the consumer already holds (moving its position past each
        finished batch), or None."""
        while True:
            current, index = self._current, self._index
            if index < len(current):
                change = current[index]
                self._index = index + 1
                self._last = change
                return change
            if self._current_after is not None:
                self._last, self._current_after = self._current_after, None
            if not self._ready:
                return None
            shared, self._current_after = self._ready.popleft()
            self._current, self._index = shared.changes, 0

    def _take_chunk(self) -> Chunk | None:
        """Everything the consumer already holds as one chunk (None: no change; the
        position still moves past batches in which nothing matched)."""
        current, index = self._current, self._index
        if not self._ready and index >= len(current) and self._current_after is None:
            return None
        parts: list[SharedChanges] = []
        if index < len(current):
            rest = current if index == 0 else current[index:]
            parts.append(SharedChanges(rest))
            self._last = rest[-1]
        if self._current_after is not None:
            self._last = self._current_after
        self._current, self._index, self._current_after = [], 0, None
        for shared, after in self._ready:
            if shared.changes:
                parts.append(shared)
                self._last = shared.changes[-1]
            if after is not None:
                self._last = after
        self._ready.clear()
        return Chunk(parts, self.position) if parts else None

    def _move_queue(self) -> None:
        """Under the lock: what the tail queued becomes the consumer's."""
        self._ready.extend(self._queue)
        self._queue.clear()
        self._queued = 0

    def _step(self, deadline: float | None) -> bool:
        """One step towards holding changes: catch up one piece, or wait for the tail
        until ``deadline`` (False: it passed first)."""
        if self._prefix is not None:
            self._catch_up()
            return True
        if not self._live:
            with self._cond:
                d = self._pending.popleft() if self._pending else None
                self._queued -= len(d.raw) if d is not None else 0
                self._live = d is None
            if d is not None:
                self._ready.append(self._segment(Evaluated(self.plan, d), d.batch))
            return True
        with self._cond:
            while not (self._queue or self._closed or self._failure):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self._move_queue()
        return True

    def _catch_up(self) -> None:
        assert self._prefix is not None
        try:
            chunk = next(self._prefix, None)
        except ChangelogError as exc:
            kind = PositionExpiredError if isinstance(exc, RetentionGapError) else SubscriptionError
            self._fail(functools.partial(self._error, kind, exc.message))
            return
        if chunk is None:
            self._prefix = None
        else:
            self._ready.append(chunk)

    def __iter__(self) -> Iterator[Change]:
        return self

    def __next__(self) -> Change:
        change = self.poll()
        if change is None:
            raise StopIteration
        return change

    def close(self) -> None:
        """Stop the subscription and free its buffer. Idempotent; ends iteration."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._queue.clear()
            self._pending.clear()
            self._cond.notify_all()
            self._wake_waiter()
        self._unregister(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _join(self, head: int) -> None:
        """Called under the tail's lock as it registers this subscription: the tail delivers
        the batches after ``head``; what comes before them is read here, by the consumer."""
        if not self._joined:
            self._joined = True
            self._resume = (head + 1, 0)
            self._last = self._decoder.batch(head, {}).after
        after = self._resume[0] - 1
        if self._snapshot or after < head:
            self._live = False
            snapshot_at = after if self._snapshot else None
            self._prefix = self._prefix_items(self._changelog, snapshot_at, after, head)

    def _error(self, kind: type[SubscriptionError], message: str) -> SubscriptionError:
        token = self.position.to_token()
        return kind(
            f"push query {self.statement!r} on table {self.table!r} stopped: {message}. "
            f"Its position is {token}: subscribe again with from_position=<that token> to go "
            "on without losing or repeating a change, while the changelog still holds them",
            store=self.table,
            position=self.position,
        )

    def _fail(self, error: Callable[[], SubscriptionError]) -> None:
        with self._cond:
            if self._closed or self._failure is not None:
                return
            self._failure = error
            self._queue.clear()
            self._pending.clear()
            self._queued = 0
            self._cond.notify_all()
            self._wake_waiter()

    def _wake_waiter(self) -> None:
        """Under the lock: wake the event-loop consumer, if one waits (closing, failing)."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            wake_waiters([waiter])

    def _select(self, evaluated: Evaluated, batch_id: int) -> SharedChanges:
        """What this subscription delivers of a batch (resume point and WHERE state): most
        often the statement's shared verdict itself, with no work per change."""
        first_batch, first_index = self._resume
        if batch_id < first_batch:
            return SharedChanges.EMPTY
        held, absent = self._held, self._absent
        if batch_id == first_batch and first_index:
            return self._select_from(evaluated.rows[first_index:])
        if held is None:
            return evaluated.everything
        held.update(evaluated.matched_keys)
        gone = evaluated.others_keys & held
        held.difference_update(gone)
        if absent is not None:
            absent.difference_update(evaluated.matched_keys)
            gone |= evaluated.others_keys - absent
            absent.update(evaluated.others_keys)
        if not gone:
            return evaluated.matched
        return evaluated.with_leaving(gone)

    def _select_from(self, rows: list[tuple[bytes, bool, Change]]) -> SharedChanges:
        held, absent = self._held, self._absent
        if held is None:
            return SharedChanges([change for _, _, change in rows])
        out: list[Change] = []
        for raw, matches, change in rows:
            if matches:
                held.add(raw)
                if absent is not None:
                    absent.discard(raw)
                out.append(change)
            elif raw in held or (absent is not None and raw not in absent):
                held.discard(raw)
                if absent is not None:
                    absent.add(raw)
                out.append(change)
        return SharedChanges(out)

    def _segment(self, evaluated: Evaluated, batch: BatchPosition) -> _Segment:
        return self._select(evaluated, batch.batch_id), batch.after

    def _fresh_cohort(self) -> set[bytes] | None:
        """The WHERE state to share with subscriptions that start as this one did: live at
        the tail's head, from nothing (not resumed, no snapshot), with a WHERE; else None."""
        fresh = self._live and self._prefix is None and self._resume[1] == 0
        return self._held if fresh and self._absent is None else None

    def _share_state(self, first: Subscription) -> None:
        """Called under the tail's lock as this subscription registers: ``first`` started
        at the same head the same way; from now on both hold one WHERE state, and the tail
        selects each batch's changes once for both (``_offer``'s ``selected``)."""
        held = first._fresh_cohort()
        if held is not None and self._fresh_cohort() is not None and not held:
            self._held = held

    def _offer(
        self,
        d: DecodedBatch,
        evaluate: Callable[[], Evaluated],
        wake: list[_Waiter],
        selected: dict[int, SharedChanges],
    ) -> bool:
        """Called by the tail for every batch after the one the subscription joined at;
        False when the subscription no longer wants batches (closed, failed, overflowed).
        An event-loop consumer waiting for it is added to ``wake``, for the tail to wake
        with the others once the batch is fanned out. ``selected`` holds this batch's
        selection per shared WHERE state (a cohort, see ``_share_state``)."""
        with self._cond:  # the consumer takes it only briefly: one lock per batch here
            if self._closed or self._failure is not None:
                return False
            if not self._live:
                self._pending.append(d)
                self._queued += len(d.raw)
                return self._check_bound()
            held = self._held
            if held is not None and self._absent is None:
                shared = selected.get(id(held))
                if shared is None:  # the first of its cohort: the others take the same
                    shared = selected[id(held)] = self._select(evaluate(), d.batch.batch_id)
                segment: _Segment = (shared, d.batch.after)
            else:
                segment = self._segment(evaluate(), d.batch)
            queue = self._queue
            if not segment[0] and queue and not queue[-1][0]:
                queue[-1] = segment  # nothing new matched: just move the position
            else:
                queue.append(segment)
                self._queued += len(segment[0])
            waiter = self._waiter
            if waiter is None:
                self._cond.notify()  # a consumer thread, if one waits
            else:
                wake.append(waiter)
                self._waiter = None
            return self._check_bound()

    def _check_bound(self) -> bool:
        if self._queued <= self._limit:
            return True
        count, limit = self._queued, self._limit
        self._failure = lambda: self._error(
            SlowConsumerError,
            f"the consumer fell {count} changes behind (buffer_limit={limit}); the "
            "subscription was closed so that its buffer cannot grow without bound. Read "
            "faster or raise buffer_limit",
        )
        self._queue.clear()
        self._pending.clear()
        self._queued = 0
        self._cond.notify_all()
        return False  # the tail wakes an event-loop consumer (``_offer``'s ``wake``)

    def _prefix_items(
        self, changelog: ChangelogSource, snapshot_at: int | None, after: int, until: int
    ) -> Iterator[_Segment]:
        """What precedes the shared tail (read in the consumer's thread, one partition or
        one batch at a time): the snapshot, then batches ``after+1 .. until``."""
        decoder = self._decoder
        if snapshot_at is not None:
            record = changelog.read_commit(snapshot_at) if snapshot_at >= 0 else None
            batch = decoder.batch(snapshot_at, record.position if record else {})
            predicate, project = self.plan.predicate, self.plan.project
            for _, state in read_state(changelog, snapshot_at):
                chunk: list[Change] = []
                for raw in sorted(state):
                    row = decoder.rows.decode(state[raw])
                    if predicate is None or predicate(row):
                        if self._held is not None:
                            self._held.add(raw)
                        key = decoder.key(raw)
                        chunk.append(Change.in_batch(key, project(row), batch, -1, True))
                yield SharedChanges(chunk), None
            yield SharedChanges.EMPTY, batch.after
        feed = ChangeFeed(changelog, after)
        while feed.after < until:
            batches = feed.poll(16, until=until)
            if not batches:
                require_after(changelog, feed.after)
                raise ChangelogError(f"batch {feed.after + 1} of {self.table!r} is missing")
            for changes in batches:
                d = decoder.decode(changes)
                yield self._segment(Evaluated(self.plan, d), d.batch)
