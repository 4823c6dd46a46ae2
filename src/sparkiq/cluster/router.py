"""Routing: any node answers any query by asking the nodes that host each partition.

For each partition a request needs, the router lists *candidates*: the partition's replicas
by rendezvous order (active, then standbys), then any other live member still hosting it
(an old owner during a handoff). Replicas known to be caught up go first, so a partition
that moved keeps being answered by its old owner until the new one has restored it. Sub-
requests go out in parallel, one per partition (range results then stream from the node
that holds them). When a candidate is unreachable, is not hosting the partition, or is
behind the requested bound, the next one is tried; only when every candidate failed does
the partition's result carry the failure (the most informative one seen), while the
other partitions still answer. ``require_active()`` restricts candidates to the active.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from sparkiq.cluster.assignment import Assignment
from sparkiq.cluster.membership import Membership
from sparkiq.cluster.transport import NodeUnreachableError, Transport
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import FailureReason, QueryResult, StateQueryResult
from sparkiq.wire.protocol import RemoteError

__all__ = ["Router"]

log = logging.getLogger("sparkiq.router")

#: Failures another replica may not have; ranked by how much they tell the caller.
_RETRY_RANK = {
    FailureReason.NOT_UP_TO_BOUND: 3,
    FailureReason.NOT_ACTIVE: 2,
    FailureReason.STORE_EXCEPTION: 1,
    FailureReason.NOT_PRESENT: 0,
}

LocalAnswer = Callable[[StateQueryRequest], StateQueryResult[Any]]


class Router:
    """Sends each partition of a request to a node hosting it; merges the answers."""

    def __init__(
        self,
        membership: Membership,
        transport: Transport,
        assignment: Callable[[], Assignment],
        local_answer: LocalAnswer,
        local_caught_up: Callable[[str, int], bool],
        executor: Executor,
    ) -> None:
        self._membership = membership
        self._transport = transport
        self._assignment = assignment
        self._local_answer = local_answer
        self._local_caught_up = local_caught_up
        self._executor = executor
        self.forwarded = 0  # sub-requests sent to other nodes (for metrics)

    def candidates(self, table: str, partition: int, require_active: bool) -> list[str]:
        """Members to ask for ``partition``, best first."""
        me = self._membership.node_id
        assignment = self._assignment()
        replicas = list(assignment.replicas(table, partition))
        if require_active:
            return replicas[:1]
        live = self._membership.live()
        for member in live:
            if member not in replicas and partition in self._hosted(member, table):
                replicas.append(member)  # an old owner still holding it

        def rank(member: str) -> tuple[int, int, int]:
            caught_up = self._caught_up(member, table, partition)
            return (0 if caught_up else 1, 0 if member == me else 1, replicas.index(member))

        return sorted((m for m in replicas if m in live), key=rank)

    def _hosted(self, member: str, table: str) -> dict[int, tuple[int, str, int]]:
        return self._membership.hosted_state(member).get(table, {})

    def _caught_up(self, member: str, table: str, partition: int) -> bool:
        if member == self._membership.node_id:
            return self._local_caught_up(table, partition)
        state = self._hosted(member, table).get(partition)
        return state is not None and state[1] == "live"

    def route(
        self, request: StateQueryRequest, partitions: list[int], token: str | None
    ) -> StateQueryResult[Any]:
        if len(partitions) == 1:
            p = partitions[0]
            return StateQueryResult({p: self._answer(request, p, token)})
        futures = {p: self._executor.submit(self._answer, request, p, token) for p in partitions}
        return StateQueryResult({p: f.result() for p, f in futures.items()})

    def _answer(self, request: StateQueryRequest, partition: int, token: str | None) -> Any:
        sub = request.with_partitions((partition,))
        best: QueryResult[Any] | None = None
        tried: list[str] = []
        for member in self.candidates(request.store, partition, request.is_require_active):
            tried.append(member)
            try:
                if member == self._membership.node_id:
                    result = self._local_answer(sub).partition_results[partition]
                else:
                    url = self._membership.url_of(member)
                    if url is None:
                        continue
                    self.forwarded += 1
                    result = self._transport.query(url, sub, token)[partition]
            except NodeUnreachableError as exc:
                self._membership.suspect(member)
                log.info("partition %d of %r: %s", partition, request.store, exc)
                continue
            except RemoteError as exc:
                if exc.code == "unauthorized":
                    raise
                log.info("partition %d of %r: %s", partition, request.store, exc)
                continue
            reason = result.failure_reason
            if reason is None or reason not in _RETRY_RANK:
                return result
            if best is None or _RETRY_RANK[reason] > _RETRY_RANK.get(best.failure_reason, -1):  # type: ignore[arg-type]
                best = result
        if best is not None:
            return best
        return QueryResult.for_failure(
            FailureReason.NOT_PRESENT,
            f"no live node could answer partition {partition} of {request.store!r} "
            f"(tried {tried or 'none'}): retry once the cluster has recovered",
        )
