"""The clustered side of a node: membership, assignment, hosting changes and routing.

A :class:`Coordinator` runs one heartbeat thread. Each round it exchanges heartbeats with
every known member, recomputes the assignment when the live membership changed, and
*rebalances* the node's replicas:

* a partition newly assigned here (as active or standby) is opened and restored from the
  changelog (from its local files if the node hosted it before, else from the newest
  snapshot plus the batches after it) by the node's tailer, while the router keeps sending
  its queries to replicas that are caught up;
* a partition no longer assigned here is kept -- and keeps answering -- until every node it
  is now assigned to reports it caught up to at least this node's batch; then it is
  released: dropped from routing at once, closed and deleted after a grace period so that
  reads in flight finish.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sparkiq.cluster.assignment import Assignment
from sparkiq.cluster.membership import HostedState, Membership
from sparkiq.cluster.router import LocalAnswer, Router
from sparkiq.cluster.transport import Transport
from sparkiq.errors import AuthenticationError, NodeUnreachableError, SparkiqError

__all__ = ["Coordinator"]

log = logging.getLogger("sparkiq.cluster")


class Coordinator:
    """Membership and routing for one node (see the module docstring)."""

    def __init__(
        self,
        *,
        node_id: str,
        url: str,
        seeds: list[str],
        standbys: int,
        token: str | None,
        transport: Transport,
        heartbeat_interval: float,
        failure_timeout: float,
        local_answer: LocalAnswer,
        local_caught_up: Callable[[str, int], bool],
        hosted_state: Callable[[], HostedState],
        rebalance: Callable[[Assignment], None],
    ) -> None:
        self.token = token
        self.standbys = standbys
        self.transport = transport
        self.heartbeat_interval = heartbeat_interval
        self._hosted_state = hosted_state
        self._rebalance = rebalance
        self._changed = threading.Event()
        self.membership = Membership(
            node_id, url, seeds, failure_timeout=failure_timeout, on_change=self._changed.set
        )
        self._assignment = Assignment((node_id,), standbys)
        self._executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="sparkiq-router")
        self.router = Router(
            self.membership,
            transport,
            lambda: self._assignment_now(),
            local_answer,
            local_caught_up,
            self._executor,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- assignment --------------------------------------------------------------------------

    def _assignment_now(self) -> Assignment:
        live = self.membership.live()
        if live != self._assignment.members:
            self._assignment = Assignment(live, self.standbys)
        return self._assignment

    @property
    def assignment(self) -> Assignment:
        return self._assignment_now()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Meet the seeds (one synchronous round), host what is assigned, then keep going."""
        self.heartbeat_round()
        self._rebalance(self._assignment_now())
        self._thread = threading.Thread(
            target=self._run, name=f"sparkiq-heartbeat-{self.membership.node_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.transport.close()

    def _run(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                self.heartbeat_round()
                self._changed.clear()
                self._rebalance(self._assignment_now())
            except Exception:
                log.exception("heartbeat round of %s failed", self.membership.node_id)

    def heartbeat_round(self) -> None:
        doc = self.membership.heartbeat_doc(self._hosted_state())
        targets = self.membership.targets()
        futures = [(url, self._executor.submit(self._beat, url, doc)) for url in targets]
        for url, future in futures:
            try:
                reply = future.result()
            except NodeUnreachableError:
                self.membership.unreachable(url)
            except SparkiqError as exc:
                log.warning("heartbeat to %s refused: %s", url, exc)
            else:
                self.membership.heard(reply)
        self.membership.check()

    def _beat(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        return self.transport.heartbeat(url, doc, self.token)

    def on_heartbeat(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.membership.heard(doc)
        return self.membership.heartbeat_doc(self._hosted_state())

    def check_token(self, token: str | None) -> None:
        """Raise :class:`AuthenticationError` unless ``token`` is the configured one."""
        if self.token is None:
            return
        if token is None or not hmac.compare_digest(token.encode(), self.token.encode()):
            raise AuthenticationError(
                "missing or wrong bearer token: send 'Authorization: Bearer <token>' with the "
                "token the node was started with (--token / SPARKIQ_TOKEN)"
            )

    def handed_off(self, table: str, partition: int, my_batch: int) -> bool:
        """Whether every node ``partition`` is now assigned to has it caught up to at least
        ``my_batch`` (so this node may release it)."""
        assignment = self._assignment_now()
        replicas = assignment.replicas(table, partition)
        if not replicas:
            return False
        for member in replicas:
            state = self.membership.hosted_state(member).get(table, {}).get(partition)
            if state is None or state[1] != "live" or state[0] < my_batch:
                return False
        return True

    def wait_members(self, count: int, timeout: float) -> bool:
        """Block until ``count`` members (this one included) are live; for tests and tools."""
        deadline = time.monotonic() + timeout
        while len(self.membership.live()) < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True
