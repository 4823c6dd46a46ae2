"""SQL push queries: ``SELECT <columns> FROM <table> [WHERE <predicate>] EMIT CHANGES``.

A :class:`SubscriptionHub` serves push queries on one node. It keeps **one tail per table**
(a thread reading the table's new commit records and segments, of every partition, from the
shared ``state_dir`` through a :class:`~sparkiq.changelog.feed.ChangeFeed`), decodes each
committed change once and fans it out to every :class:`Subscription` of the table;
subscriptions with the same statement share the evaluation of its WHERE and projection. A
table's tail starts with its first subscription and stops when its last one closes.

Semantics (the contract of :meth:`SubscriptionHub.subscribe`):

* **Every committed change that matches, in commit order**: batch after batch; within a
  batch by partition, then key, so the changes of one key are in order. A change is visible
  once its batch's commit record exists, as for pull queries.
* **Positions.** ``Change.position`` is the table's position after the change's batch
  (``{table: {p: batch}}`` for every partition plus the batch's source components, so it
  also bounds a later pull query) plus the component ``push:<table>`` = ``{batch: n}``: the
  first ``n`` changes of that batch were seen. Its token resumes right after the change:
  ``subscribe(..., from_position=token)`` delivers every change after it and none before,
  while the changelog still holds them; else :class:`SubscriptionError` names the oldest
  batch available. A position without ``push:`` (a pull query's) resumes after its batch.
  :attr:`Subscription.position` is where the consumer is, also across batches in which
  nothing matched: resume from it after a disconnect.
* **Snapshot.** ``snapshot=True`` starts with every matching row as of one committed batch
  ``B`` (the newest when subscribing, or ``from_position``'s), read from the changelog's
  snapshots and segments: an exact cut, the same batch for every partition. Then every
  change after ``B``. Snapshot rows have ``Change.snapshot = True`` and the position after
  ``B``; a consumer that disconnects during the snapshot subscribes with a snapshot again.
* **A row that stops matching the WHERE** is delivered as a deletion (``row=None``) when the
  subscription last delivered that key as a row, else dropped; so are deletions. A
  subscription resumed from a position cannot know what its consumer holds: it delivers the
  first non-matching change of each key as a deletion (ignore deletions of keys you do not
  hold). Without WHERE every change is delivered and nothing is tracked.
* **Slow consumers are bounded**: at most ``buffer_limit`` changes wait in the hub for a
  consumer (which takes them in chunks); one more closes the subscription and frees its
  buffer, and the consumer's next read raises :class:`SlowConsumerError` carrying the
  position to resume from.
* :meth:`Subscription.close` is idempotent, ends iteration and may be called from any
  thread; :meth:`Subscription.poll` takes a timeout (for keep-alives).

Rows are dicts as ``Row.asDict(recursive=True)`` gives them, projected. A ``Change`` and its
row may be shared by the subscriptions of one statement: treat them as read-only.

Modules: :mod:`sparkiq.sql.push_plan` compiles statements, :mod:`sparkiq.sql.change` holds
:class:`Change`, :mod:`sparkiq.sql.push_batch` decodes and evaluates batches,
:mod:`sparkiq.sql.subscription` holds subscriptions, and this module the hub and its
per-table tails (imports go in that order, one way). Every
name in this module's ``__all__`` (the push query API) is importable from here.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from sparkiq.changelog import Changelog, list_tables
from sparkiq.changelog.feed import ChangeFeed, RetentionGapError, require_after
from sparkiq.changelog.source import ChangelogSource, SegmentSource
from sparkiq.errors import ChangelogError, UnknownStoreError
from sparkiq.principals import check_read
from sparkiq.query.position import Position
from sparkiq.schema.types import TableSchema
from sparkiq.sql.change import Change
from sparkiq.sql.limits import SqlLimits
from sparkiq.sql.push_batch import Chunk, DecodedBatch, Decoder, Evaluated
from sparkiq.sql.push_plan import PushPlan, PushQueryError, plan_push_query
from sparkiq.sql.subscription import (
    PositionExpiredError,
    SlowConsumerError,
    Subscription,
    SubscriptionError,
    wake_waiters,
)

__all__ = [
    "Change",
    "Chunk",
    "PositionExpiredError",
    "PushQueryError",
    "SlowConsumerError",
    "Subscription",
    "SubscriptionError",
    "SubscriptionHub",
]

log = logging.getLogger("sparkiq.push")


# -- the shared tail and the hub --------------------------------------------------------------


class _Tail:
    """One thread following one table's changelog for every subscription of the table."""

    def __init__(self, hub: SubscriptionHub, changelog: ChangelogSource, decoder: Decoder) -> None:
        self.hub, self.table, self.decoder = hub, changelog.table, decoder
        committed = changelog.committed_batch_ids()
        self.head = committed[-1] if committed else -1  # the last batch fanned out
        self.feed = ChangeFeed(changelog, self.head)
        self.groups: dict[str, tuple[PushPlan, list[Subscription]]] = {}
        self.cohorts: dict[str, tuple[int, Subscription]] = {}  # statement -> (head, first)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"sparkiq-push-{self.table}")
        self.thread.daemon = True

    def add(self, sub: Subscription) -> None:
        """Register ``sub``: the tail delivers it the batches after its current head."""
        with self.lock:
            sub._join(self.head)
            self.groups.setdefault(sub.statement, (sub.plan, []))[1].append(sub)
            # Subscriptions of one statement that start live at the same head go through
            # the same states: they share one (WHERE state, selection) per batch.
            cohort = self.cohorts.get(sub.statement)
            if cohort is not None and cohort[0] == self.head:
                sub._share_state(cohort[1])
            elif sub._fresh_cohort() is not None:
                self.cohorts[sub.statement] = (self.head, sub)

    def remove(self, sub: Subscription) -> int:
        """Unregister ``sub`` (if registered); return how many subscriptions remain."""
        with self.lock:
            group = self.groups.get(sub.statement)
            if group is not None and sub in group[1]:
                group[1].remove(sub)
                if not group[1]:
                    del self.groups[sub.statement]
                    self.cohorts.pop(sub.statement, None)
            return sum(len(subs) for _, subs in self.groups.values())

    def _run(self) -> None:
        poll_interval = self.hub.poll_interval
        while not self.stopped.is_set():
            try:
                batches = self.feed.poll()
                for changes in batches:
                    self._fan_out(self.decoder.decode(changes))
            except ChangelogError as exc:
                if isinstance(exc, RetentionGapError):
                    self.hub._tail_failed(self, exc.message, expired=True)
                    return
                log.warning("push tail of %s: %s; retrying", self.table, exc.message)
                batches = []
            except Exception as exc:  # a row that cannot be decoded: fail loudly, not silently
                log.exception("push tail of %s failed", self.table)
                self.hub._tail_failed(self, f"the changelog cannot be decoded: {exc!r}")
                return
            if not batches:
                self.wake.wait(poll_interval)
                self.wake.clear()

    def _fan_out(self, d: DecodedBatch) -> None:
        with self.lock:
            groups = [(plan, list(subs)) for plan, subs in self.groups.values()]
            self.head = d.batch.batch_id
        wake: list[Any] = []  # event-loop consumers to wake, once per loop, at the end
        for plan, subs in groups:
            cache: list[Evaluated] = []
            selected: dict[int, Any] = {}  # one selection per cohort of this statement

            def evaluate(plan: PushPlan = plan, cache: list[Evaluated] = cache) -> Evaluated:
                if not cache:
                    cache.append(Evaluated(plan, d))
                return cache[0]

            for sub in subs:
                if not sub._offer(d, evaluate, wake, selected):
                    self.hub._unregister(sub)
        if wake:
            wake_waiters(wake)


class SubscriptionHub:
    """Serves push queries over the tables in ``state_dir`` (one per node).

    ``source``, when given (a :class:`~sparkiq.Node`), limits push queries to the tables it
    serves (``source.tables``). ``sources(table)``, when given, says where a table's changes
    come from (a :class:`~sparkiq.changelog.source.ChangelogSource`: an attached checkpoint's
    store) or None for a sparkiq table of ``state_dir``. ``buffer_limit`` is the default
    bound on the changes waiting for one consumer; ``poll_interval`` how often (seconds) a
    tail checks for a new commit (:meth:`notify` wakes it at once); ``limits`` bounds each
    statement as a pull query's (a node's ``sql_limits``; default: the defaults). Threads:
    one per table with subscriptions, none else. Call :meth:`close` when the node stops.
    """

    def __init__(
        self,
        state_dir: str,
        source: Any = None,
        *,
        buffer_limit: int = 10_000,
        poll_interval: float = 0.02,
        sources: Callable[[str], ChangelogSource | None] | None = None,
        limits: SqlLimits | None = None,
    ) -> None:
        if not (isinstance(buffer_limit, int) and buffer_limit > 0):
            raise PushQueryError(f"buffer_limit must be a positive int, got {buffer_limit!r}")
        if not (isinstance(poll_interval, int | float) and poll_interval > 0):
            raise PushQueryError(f"poll_interval must be a positive number, got {poll_interval!r}")
        self.state_dir, self.source, self._sources = state_dir, source, sources
        self.buffer_limit, self.poll_interval = buffer_limit, float(poll_interval)
        self.limits = SqlLimits() if limits is None else limits
        self._lock = threading.Lock()
        self._tails: dict[str, _Tail] = {}
        self._subscriptions: set[Subscription] = set()
        self._decoders: dict[str, tuple[ChangelogSource, Decoder]] = {}
        self._closed = False

    def _resolve(self, name: str) -> tuple[str, TableSchema]:
        if name not in self._decoders and not Changelog(self.state_dir, name).exists():
            same = [t for t in list_tables(self.state_dir) if t.lower() == name.lower()]
            name = same[0] if len(same) == 1 else name
        return name, self._table(name)[1].keys.schema

    def _table(self, table: str) -> tuple[ChangelogSource, Decoder]:
        found = self._decoders.get(table)
        if found is None:
            served = getattr(self.source, "tables", None)
            if served is not None and table not in served:
                raise UnknownStoreError(
                    f"unknown table {table!r}; this node serves {sorted(served)}", store=table
                )
            attached = None if self._sources is None else self._sources(table)
            changelog = attached or SegmentSource(Changelog(self.state_dir, table, read_only=True))
            found = self._decoders[table] = (changelog, Decoder(changelog))
        return found

    def subscribe(
        self,
        text: str,
        *,
        from_position: Position | str | None = None,
        snapshot: bool = False,
        buffer_limit: int | None = None,
    ) -> Subscription:
        """Start the push query ``text`` (``SELECT ... FROM t [WHERE ...] EMIT CHANGES``).

        Without ``from_position`` it delivers the changes committed after it started; with
        one (a :class:`Position` or its token), those after that position (see the module
        docstring). ``snapshot=True`` first delivers the matching rows as of the newest
        batch (or ``from_position``'s batch). Raises :class:`PushQueryError` for a bad
        statement, :class:`~sparkiq.errors.UnknownStoreError` for an unknown table and
        :class:`SubscriptionError` when the changes after ``from_position`` are gone.
        """
        plan = plan_push_query(text, self._resolve, self.limits)
        check_read((plan.table,))
        changelog, decoder = self._table(plan.table)
        start = self._parse_position(plan.table, from_position)
        limit = self.buffer_limit if buffer_limit is None else buffer_limit
        if not (isinstance(limit, int) and limit > 0):
            raise PushQueryError(f"buffer_limit must be a positive int, got {limit!r}")
        resume: tuple[int, int] | None = None
        if start is not None:
            batch = max(start.partition_offsets(plan.table).values())
            seen = start.partition_offsets(f"push:{plan.table}").get(batch)
            resume = (batch, seen) if seen is not None and not snapshot else (batch + 1, 0)
            if snapshot and batch >= 0 and not changelog.has_commit(batch):
                raise PositionExpiredError(
                    f"from_position is at batch {batch} of {plan.table!r}, which is not in "
                    "the changelog: a snapshot needs a committed (and retained) batch",
                    store=plan.table,
                    position=start,
                )
            try:
                require_after(changelog, resume[0] - 1)
            except ChangelogError as exc:
                kind = (
                    PositionExpiredError
                    if isinstance(exc, RetentionGapError)
                    else SubscriptionError
                )
                raise kind(
                    f"cannot resume push query {plan.statement!r} from {start.to_token()}: "
                    f"{exc.message}",
                    store=plan.table,
                    position=start,
                ) from None
        with self._lock:
            if self._closed:
                raise SubscriptionError("the push query hub is closed (its node stopped)")
            tail = self._tails.get(plan.table)
            if tail is None:
                tail = self._tails[plan.table] = _Tail(self, changelog, decoder)
                tail.thread.start()
            sub = Subscription(
                self._unregister,
                plan,
                changelog,
                decoder,
                start=start,
                resume=resume,
                snapshot=snapshot,
                buffer_limit=limit,
            )
            tail.add(sub)
            self._subscriptions.add(sub)
        return sub

    @staticmethod
    def _parse_position(table: str, value: Position | str | None) -> Position | None:
        if value is None:
            return None
        try:
            position = value if isinstance(value, Position) else Position.from_token(value)
        except (ValueError, TypeError) as exc:
            raise PushQueryError(f"from_position: {exc}") from None
        if not position.partition_offsets(table):
            raise PushQueryError(
                f"from_position {position!r} has no offsets for table {table!r}: pass a "
                "position of this table (a change's, a subscription's or a query result's)"
            )
        return position

    def notify(self, table: str | None = None) -> None:
        """Wake the tails (of ``table``, or all) so they read a just-committed batch now."""
        with self._lock:
            tails = list(self._tails.values())
        for tail in tails:
            if table is None or tail.table == table:
                tail.wake.set()

    def subscriptions(self) -> dict[str, int]:
        """Open subscriptions per table that has a running tail."""
        with self._lock:
            return {
                t: sum(len(s) for _, s in tail.groups.values()) for t, tail in self._tails.items()
            }

    def _unregister(self, sub: Subscription) -> None:
        with self._lock:
            self._subscriptions.discard(sub)
            tail = self._tails.get(sub.table)
            if tail is not None and tail.remove(sub) == 0:
                del self._tails[sub.table]
                tail.stopped.set()
                tail.wake.set()

    def _tail_failed(self, tail: _Tail, message: str, expired: bool = False) -> None:
        with self._lock:
            if self._tails.get(tail.table) is tail:
                del self._tails[tail.table]
            subs = [s for _, group in tail.groups.values() for s in group]
        kind = PositionExpiredError if expired else SubscriptionError
        for sub in subs:
            sub._fail(functools.partial(sub._error, kind, message))

    def close(self) -> None:
        """Fail every open subscription (their consumers see :class:`SubscriptionError`
        with the position to resume from, e.g. on another node) and stop every tail."""
        with self._lock:
            self._closed = True
            tails, self._tails = list(self._tails.values()), {}
            subs, self._subscriptions = list(self._subscriptions), set()
        for sub in subs:
            sub._fail(functools.partial(sub._error, SubscriptionError, "its node stopped"))
        for tail in tails:
            tail.stopped.set()
            tail.wake.set()
        for tail in tails:
            if tail.thread is not threading.current_thread():
                tail.thread.join(timeout=10)
