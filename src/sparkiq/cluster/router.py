"""Routing: any node answers any query by asking the nodes that host each partition.

For each partition a request needs, the router lists *candidates*: the partition's replicas
by rendezvous order (active, then standbys), then any other live member still hosting it
(an old owner during a handoff), and last any member not suspect whose latest heartbeat
said it hosts the partition even though the failure detector no longer counts it live
(views of the membership differ between nodes while heartbeats are late; a partition that
is hosted somewhere must not be refused because this node's view is behind). Replicas
known to be caught up go first, then members heard from recently, so a partition that moved
keeps being answered by its old owner until the new one has restored it, and a member gone
quiet is asked last. Sub-requests go out in parallel, one per partition (range results then
stream from the node that holds them), except for a query nodes answer for several
partitions together (``Query.combine``: SQL fragments), which goes out one per node, to each
partition's best candidate; a partition its node did not answer is then asked alone.

When a candidate is unreachable, is not hosting the partition, or is behind the requested
bound, the next one is tried. A candidate that does not answer is not waited for blindly;
the next candidate is asked as well, and the first answer wins, once its sub-request has
been out for

- ``hedge_after`` seconds *and* the member has been silent (no heartbeat) that long -- a
  paused or partitioned node costs that delay, not the read timeout; or
- the hedge delay learned from this router's own latencies for that query type
  (:class:`~sparkiq.cluster.hedge.HedgeDelay`: 3 x p99, between ``hedge_after`` and
  :data:`HEDGE_CEILING`) -- a member that still sends heartbeats but does not answer (a
  one-way partition, a stuck handler) costs at most that. Such a member is then *lagging*:
  it is asked after the others for :data:`LAGGING_FOR` seconds, or until it answers.

A member that refuses this node's sub-request (``401``: its check of the node credential
failed -- a clock more than ``MAX_SKEW`` off, another cluster secret) is *refusing*: the
router logs a warning naming the refusal (once per member per :data:`REFUSING_FOR`), asks it
after every other candidate for that long, and asks the next candidate now. The caller's own
token is checked by the node the caller asked, before any routing, and never travels to
members (:mod:`sparkiq.cluster.transport`), so a member's ``401`` is never about the caller.
When no candidate answers, the partition's failure names the refusals it met.

Sub-requests are reads and every copy carries the same bound and pinned batch, so the
answer that wins satisfies the request whichever replica gave it. When every candidate failed,
the router waits for one fresh heartbeat round and tries once more on the new view; only
then does the partition's result carry the failure (the most informative one seen), while
the other partitions still answer. A request pinned to a batch that every candidate answered
with ``NOT_UP_TO_BOUND`` is not asked again: each has already waited for the batch.
``require_active()`` restricts candidates to the active.

A sub-request nobody waits for any more -- another replica answered first, the member was
given up on, or the request's own caller left (:mod:`sparkiq.cancel`) -- has its connection
cut, so the member stops working on it (a DuckDB fragment is interrupted) instead of
running on to its timeout.

Before routing, a node that was itself stalled waits (briefly) until it has resynchronized
(:meth:`~sparkiq.cluster.coordinator.Coordinator.is_fresh`), so it never routes on the view
it had before a pause.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from typing import Any, Protocol

from sparkiq.cancel import cancel_signal
from sparkiq.cluster.assignment import Assignment
from sparkiq.cluster.hedge import Copies, HedgeDelay, close_results
from sparkiq.cluster.httppool import NodeTimeoutError
from sparkiq.cluster.membership import Membership
from sparkiq.cluster.swim import GossipMembership
from sparkiq.cluster.transport import NodeUnreachableError, Transport
from sparkiq.errors import ErrorCode, ForbiddenError
from sparkiq.pools import ElasticPool
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import FailureReason, QueryResult, StateQueryResult
from sparkiq.wire.protocol import RemoteError

__all__ = ["HEDGE_CEILING", "LAGGING_FOR", "REFUSING_FOR", "FreshView", "Router"]

log = logging.getLogger("sparkiq.router")

#: Failures another replica may not have; ranked by how much they tell the caller.
_RETRY_RANK = {
    FailureReason.NOT_UP_TO_BOUND: 3,
    FailureReason.NOT_ACTIVE: 2,
    FailureReason.STORE_EXCEPTION: 1,
    FailureReason.NOT_PRESENT: 0,
}

#: How often a router waiting on sub-requests looks at the members' silence.
_POLL = 0.05
#: The most a sub-request is waited for alone once latencies are known (seconds).
HEDGE_CEILING = 1.0
#: How long a member that let a sub-request go unanswered past the hedge delay is asked last.
LAGGING_FOR = 5.0
#: How long a member that refused this node's credential is asked last, and how often its
#: refusal is logged: a clock or a secret is not fixed in seconds.
REFUSING_FOR = 30.0

LocalAnswer = Callable[[StateQueryRequest], StateQueryResult[Any]]
_Remote = dict[int, QueryResult[Any]]


class FreshView(Protocol):
    """What the router needs of the coordinator to route on a current view."""

    failure_timeout: float
    heartbeat_interval: float

    def wait_fresh(self, timeout: float) -> bool: ...

    def refresh(self, timeout: float) -> bool: ...


class Router:
    """Sends each partition of a request to a node hosting it; merges the answers."""

    def __init__(
        self,
        membership: Membership | GossipMembership,
        transport: Transport,
        assignment: Callable[[], Assignment],
        local_answer: LocalAnswer,
        local_caught_up: Callable[[str, int], bool],
        executor: Executor,
        *,
        fresh_view: FreshView | None = None,
    ) -> None:
        self._membership = membership
        self._transport = transport
        self._assignment = assignment
        self._local_answer = local_answer
        self._local_caught_up = local_caught_up
        self._executor = executor
        self._view = fresh_view
        interval = fresh_view.heartbeat_interval if fresh_view is not None else 0.5
        self.hedge_after = max(2 * interval, 0.2)
        self._delays = HedgeDelay(
            floor=self.hedge_after, ceiling=max(self.hedge_after, HEDGE_CEILING)
        )
        # member -> monotonic time until which it is asked after the others (see the module
        # docstring); plain dict operations, atomic under the GIL, are all it sees.
        self._lagging: dict[str, float] = {}
        # member -> monotonic time until which it is asked last for refusing this node's
        # credential (and its refusal is not logged again); read like _lagging, written under
        # _refusing_lock so that concurrent sub-requests refused together say it once
        self._refusing: dict[str, float] = {}
        self._refusing_lock = threading.Lock()
        # Sub-requests to other nodes run here, never on ``executor`` (which runs the
        # per-partition fan-out that waits for them): no pool ever waits on itself.
        self._io = ElasticPool("sparkiq-subrequest", 64)
        self.forwarded = 0  # sub-requests sent to other nodes (for metrics)
        self.hedged = 0  # candidates asked because an earlier one was silent (for metrics)

    def close(self) -> None:
        self._io.shutdown(wait=False, cancel_futures=True)

    def candidates(self, table: str, partition: int, require_active: bool) -> list[str]:
        """Members to ask for ``partition``, best first (see the module docstring)."""
        me = self._membership.node_id
        assignment = self._assignment()
        replicas = list(assignment.replicas(table, partition))
        if require_active:
            return replicas[:1]
        live = self._membership.live()
        ordered = [m for m in replicas if m in live]
        for member in live:
            if member in ordered:
                continue
            if member == me:
                if self._local_caught_up(table, partition):
                    ordered.append(me)  # our old replica, still held
            elif partition in self._hosted(member, table):
                ordered.append(member)  # an old owner still holding it

        index = {m: i for i, m in enumerate(ordered)}

        now = time.monotonic()

        def rank(member: str) -> tuple[int, int, int, int, int]:
            caught_up = self._caught_up(member, table, partition)
            quiet = (
                self._membership.silence(member) >= self.hedge_after
                or self._lagging.get(member, 0.0) > now
            )
            return (
                1 if self._refusing.get(member, 0.0) > now else 0,
                0 if caught_up else 1,
                1 if quiet else 0,
                0 if member == me else 1,
                index[member],
            )

        fallback = [m for m in self._membership.hosting(table, partition) if m not in index]
        fallback.sort(key=lambda m: self._refusing.get(m, 0.0) > now)
        return sorted(ordered, key=rank) + fallback

    def _hosted(self, member: str, table: str) -> dict[int, tuple[int, str, int]]:
        return self._membership.hosted_state(member).get(table, {})

    def _caught_up(self, member: str, table: str, partition: int) -> bool:
        if member == self._membership.node_id:
            return self._local_caught_up(table, partition)
        state = self._hosted(member, table).get(partition)
        return state is not None and state[1] == "live"

    def route(self, request: StateQueryRequest, partitions: list[int]) -> StateQueryResult[Any]:
        view = self._view
        if view is not None:
            view.wait_fresh(view.failure_timeout)
        if len(partitions) == 1:
            p = partitions[0]
            return StateQueryResult({p: self._answer(request, p)})
        if request.query.combine:
            return self._route_by_node(request, partitions)
        futures = {p: self._executor.submit(self._answer, request, p) for p in partitions}
        return StateQueryResult({p: f.result() for p, f in futures.items()})

    def _route_by_node(
        self, request: StateQueryRequest, partitions: list[int]
    ) -> StateQueryResult[Any]:
        """A query nodes answer for several partitions together (``Query.combine``): one
        sub-request per node, to each partition's best candidate. A partition its node did
        not answer with a final result -- the node failed, fell silent (the hedging rule of
        :meth:`_overdue`) or answered with a retryable failure -- is then routed alone, with
        every failover rule of :meth:`_answer`."""
        me = self._membership.node_id
        groups: dict[str, list[int]] = {}
        for partition in partitions:
            best = self.candidates(request.store, partition, request.is_require_active)[:1]
            groups.setdefault(best[0] if best else "", []).append(partition)
        results: dict[int, QueryResult[Any]] = {}
        alone: dict[int, Future[QueryResult[Any]]] = {}

        def route_alone(group: list[int]) -> None:
            for partition in group:
                alone[partition] = self._executor.submit(self._answer, request, partition)

        def keep(answers: Mapping[int, QueryResult[Any]], group: list[int]) -> None:
            route_alone([p for p in group if not _final(answers.get(p))])
            results.update((p, answers[p]) for p in group if _final(answers.get(p)))

        copies: Copies[_Remote] = Copies(self._io, release=close_results)
        local: list[int] = []
        for member, group in groups.items():
            url = self._membership.url_of(member) if member and member != me else None
            if member == me:
                local = group
            elif url is None or len(group) == 1:
                route_alone(group)
            else:
                self.forwarded += 1
                copies.send(member, self._transport.query, url, request.with_partitions(group))
        kind = type(request.query).__name__
        wait = self._delays.delay(kind)
        try:
            if local:
                keep(self._local_answer(request.with_partitions(local)).partition_results, local)
            caller = cancel_signal()
            while copies:
                if caller is not None and caller.is_set():
                    break  # _answer gives the caller-left failure to what is still out
                for copy in copies.wait(_POLL):
                    group = groups[copy.target]
                    what = f"partitions {group}"
                    answers = self._remote_answers(
                        copy.future, copy.target, what, request.store, {}
                    )
                    if answers is None:
                        route_alone(group)
                        continue
                    self._delays.record(kind, time.monotonic() - copy.sent_at)
                    self._lagging.pop(copy.target, None)
                    self._refusing.pop(copy.target, None)
                    keep(answers, group)
                for copy in copies:
                    if self._overdue(copy.target, copy.sent_at, wait):
                        copies.abandon(copy)
                        route_alone(groups[copy.target])
            for copy in copies:
                route_alone(groups[copy.target])
        finally:
            copies.abandon_all()
        results.update((p, future.result()) for p, future in alone.items())
        return StateQueryResult({p: results[p] for p in partitions})

    def _answer(self, request: StateQueryRequest, partition: int) -> Any:
        refused: dict[str, str] = {}  # member -> why it refused this node's sub-request
        best, tried, unanswered = self._attempt(request, partition, refused)
        if _final(best):
            return best
        caller = cancel_signal()
        if caller is not None and caller.is_set():  # nobody waits for a second round
            return best or QueryResult.for_failure(
                FailureReason.NOT_PRESENT, "the caller left before any node answered"
            )
        if (
            request.at_batch is not None
            and unanswered == 0
            and best is not None
            and best.failure_reason is FailureReason.NOT_UP_TO_BOUND
        ):
            # Every candidate already waited for the batch (execute's catch-up wait) and
            # refused: asking them all again would only multiply that wait.
            return best
        view = self._view
        if view is not None and view.refresh(view.failure_timeout):
            again, tried_again, _ = self._attempt(request, partition, refused)
            if _final(again) or _better(again, best):
                best = again
            tried += tried_again
        if best is not None:
            return best
        why = "".join(f"; {member} refused it: {text}" for member, text in refused.items())
        return QueryResult.for_failure(
            FailureReason.NOT_PRESENT,
            f"no live node could answer partition {partition} of {request.store!r} "
            f"(tried {tried or 'none'}){why}: retry once the cluster has recovered",
        )

    def _attempt(
        self, request: StateQueryRequest, partition: int, refused: dict[str, str]
    ) -> tuple[QueryResult[Any] | None, list[str], int]:
        """Ask the candidates in turn (hedging past silent ones); return the first answer
        that is not a retryable failure, else the most informative failure, who was asked
        and how many of them gave no answer at all. Members that refused this node's
        credential are added to ``refused``."""
        me = self._membership.node_id
        sub = request.with_partitions((partition,))
        queue = deque(self.candidates(request.store, partition, request.is_require_active))
        kind = type(request.query).__name__
        wait = self._delays.delay(kind)
        copies: Copies[_Remote] = Copies(self._io, release=close_results)
        best: QueryResult[Any] | None = None
        tried: list[str] = []
        answered = 0
        caller = cancel_signal()
        try:
            while queue or copies:
                if caller is not None and caller.is_set():
                    break  # the request's own caller left: so do its sub-requests
                if queue and copies.all_overdue(lambda c: self._overdue(c.target, c.sent_at, wait)):
                    member = queue.popleft()
                    if copies:
                        self.hedged += 1
                    tried.append(member)
                    if member == me:
                        mine = self._local_answer(sub).partition_results[partition]
                        answered += 1
                        if _final(mine):
                            return mine, tried, len(tried) - answered
                        best = mine if _better(mine, best) else best
                        continue
                    url = self._membership.url_of(member)
                    if url is None:
                        continue
                    self.forwarded += 1
                    copies.send(member, self._transport.query, url, sub)
                    continue
                done = copies.wait(_POLL)
                for copy in done:
                    result = self._remote_result(
                        copy.future, copy.target, partition, request.store, refused
                    )
                    if result is None:
                        continue
                    self._delays.record(kind, time.monotonic() - copy.sent_at)
                    self._lagging.pop(copy.target, None)
                    self._refusing.pop(copy.target, None)
                    answered += 1
                    if _final(result):
                        return result, tried, len(tried) - answered
                    best = result if _better(result, best) else best
                if not done and not queue:
                    self._give_up_on_gone(copies, wait, others_answered=best is not None)
            return best, tried, len(tried) - answered
        finally:
            copies.abandon_all()

    def _overdue(self, member: str, sent_at: float, wait: float | None) -> bool:
        """Whether to stop waiting for ``member`` alone: its sub-request has been out for
        ``hedge_after`` s and it has not been heard from for as long, or it has been out
        for the learned hedge delay ``wait`` (the member is then lagging)."""
        out_for = time.monotonic() - sent_at
        after = self.hedge_after
        if self._membership.is_suspect(member) or (
            out_for >= after and self._membership.silence(member) >= after
        ):
            return True
        if wait is not None and out_for >= wait:
            if self._lagging.get(member, 0.0) <= time.monotonic():
                log.info("%s has not answered in %.2f s: asking another replica", member, out_for)
            self._lagging[member] = time.monotonic() + LAGGING_FOR
            return True
        return False

    def _give_up_on_gone(
        self,
        copies: Copies[_Remote],
        wait: float | None,
        *,
        others_answered: bool,
    ) -> None:
        """Nobody else to ask: stop waiting for overdue members the detector declared gone,
        or for any overdue member once another candidate answered (with a failure worth a
        retry, such as ``NOT_UP_TO_BOUND`` from a standby a few batches behind): a fresh
        round on a new view is then a better bet than a member that may never answer --
        one still heartbeating behind a one-way partition is never declared gone."""
        live = self._membership.live()
        for copy in copies:
            gone = copy.target not in live or others_answered
            if gone and self._overdue(copy.target, copy.sent_at, wait):
                log.info("giving up on %s: it went silent", copy.target)
                copies.abandon(copy)

    def _remote_result(
        self,
        future: Future[_Remote],
        member: str,
        partition: int,
        store: str,
        refused: dict[str, str],
    ) -> QueryResult[Any] | None:
        answers = self._remote_answers(future, member, f"partition {partition}", store, refused)
        return None if answers is None else answers.get(partition)

    def _remote_answers(
        self,
        future: Future[_Remote],
        member: str,
        what: str,
        store: str,
        refused: dict[str, str],
    ) -> _Remote | None:
        """The answers of a sub-request to ``member`` (None: it failed, and the failure
        is noted: a suspect member, a refusing one; ``what`` names the partitions asked)."""
        try:
            return future.result()
        except NodeTimeoutError as exc:  # slow or paused: the detector decides
            log.info("%s of %r: %s", what, store, exc)
        except NodeUnreachableError as exc:
            self._membership.suspect(member, str(exc))
            log.info("%s of %r: %s", what, store, exc)
        except RemoteError as exc:
            if exc.code is ErrorCode.UNAUTHORIZED:  # the member refuses this node, not the caller
                refused[member] = exc.message
                self._refused(member, exc.message)
                return None
            if exc.code is ErrorCode.FORBIDDEN:  # the member applies the caller's grants too
                raise ForbiddenError(exc.message) from None
            log.info("%s of %r: %s", what, store, exc)
        return None

    def _refused(self, member: str, why: str) -> None:
        """``member`` refused this node's credential: asked last for :data:`REFUSING_FOR`,
        and said once in that time (every sub-request to it would say it again)."""
        now = time.monotonic()
        with self._refusing_lock:
            news = self._refusing.get(member, 0.0) <= now
            self._refusing[member] = now + REFUSING_FOR
        if news:
            log.warning(
                "%s refuses this node's sub-requests, asking other replicas for %.0f s: %s",
                member,
                REFUSING_FOR,
                why,
            )


def _final(result: QueryResult[Any] | None) -> bool:
    """An answer, or a failure no other replica would avoid."""
    if result is None:
        return False
    reason = result.failure_reason
    return reason is None or reason not in _RETRY_RANK


def _better(result: QueryResult[Any] | None, than: QueryResult[Any] | None) -> bool:
    if result is None or result.failure_reason is None:
        return result is not None
    if than is None or than.failure_reason is None:
        return than is None
    return _RETRY_RANK[result.failure_reason] > _RETRY_RANK.get(than.failure_reason, -1)
