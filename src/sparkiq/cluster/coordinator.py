"""The clustered side of a node: membership, assignment, hosting changes and routing.

A :class:`Coordinator` runs two threads. The *heartbeat* thread, every
``heartbeat_interval``, sends this node's heartbeat to every known member that has none in
flight (on a pool of its own, so routed load never delays it) and records the replies that
arrive; a member that does not answer is judged by the failure detector, not by one late
reply. The *rebalance* thread then recomputes the assignment and *rebalances* the node's
replicas -- it may wait for the tailer (a long restore), and heartbeats must not:

* a partition newly assigned here (as active or standby) is opened and restored from the
  changelog (from its local files if the node hosted it before, else from the newest
  snapshot plus the batches after it) by the node's tailer, while the router keeps sending
  its queries to replicas that are caught up;
* a partition no longer assigned here is kept -- and keeps answering -- until every node it
  is now assigned to reports it caught up to at least this node's batch; then it is
  released: dropped from routing at once, closed and deleted after a grace period so that
  reads in flight finish.

**Stalls.** When the heartbeat loop finds that more than ``stall_limit`` seconds passed since
its last round (the process was paused with SIGSTOP, or starved of CPU), the node is *not
fresh* (:meth:`Coordinator.is_fresh`): it refuses to answer sub-requests (routers fall
through to other replicas) until it has exchanged a round of heartbeats -- silence that
accrued while it was itself stalled does not count against the others -- and applied what
was committed meanwhile. Only then does it rebalance, so a node resuming from a pause neither
answers from its old view nor reopens partitions that never left it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from typing import Any

from sparkiq.cluster.assignment import Assignment
from sparkiq.cluster.heartbeat import FORMAT, HeartbeatError
from sparkiq.cluster.httppool import NodeTimeoutError
from sparkiq.cluster.membership import HostedState, Membership
from sparkiq.cluster.nodeauth import NodeKey, Opened, RequestVerifier
from sparkiq.cluster.router import LocalAnswer, Router
from sparkiq.cluster.swim import GossipMembership
from sparkiq.cluster.swim_loop import SwimLoop
from sparkiq.cluster.transport import Transport
from sparkiq.errors import AuthenticationError, NodeUnreachableError, SparkiqError
from sparkiq.pools import ElasticPool
from sparkiq.serving.config import is_loopback_host

__all__ = ["Coordinator"]

log = logging.getLogger("sparkiq.cluster")

#: Seconds between two log lines about heartbeats refused by the same URL.
_REFUSAL_LOG_EVERY = 60.0


class Coordinator:
    """Membership and routing for one node (see the module docstring)."""

    def __init__(
        self,
        *,
        node_id: str,
        url: str,
        seeds: list[str],
        standbys: int,
        key: NodeKey | None,
        open_to_local: bool,
        transport: Transport,
        heartbeat_interval: float,
        failure_timeout: float,
        membership: str = "gossip",
        local_answer: LocalAnswer,
        local_caught_up: Callable[[str, int], bool],
        hosted_state: Callable[[], HostedState],
        rebalance: Callable[[Assignment], None],
        catch_up: Callable[[], object] | None = None,
        committed_head: Callable[[str], int] | None = None,
    ) -> None:
        #: Checks node credentials of incoming node-protocol requests (None: no secret).
        self.verifier = None if key is None else RequestVerifier(key)
        #: Without a secret: whether processes on this host may be members (the node asks
        #: no credential of its clients either).
        self.open_to_local = open_to_local
        self.standbys = standbys
        self.transport = transport
        self.heartbeat_interval = heartbeat_interval
        self.failure_timeout = failure_timeout
        #: A gap this long between two heartbeat rounds means this node was stalled.
        self.stall_limit = max(failure_timeout, 4 * heartbeat_interval)
        self._hosted_state = hosted_state
        self._rebalance = rebalance
        self._catch_up = catch_up
        self._committed_head = committed_head
        self._changed = threading.Event()
        self.membership: Membership | GossipMembership
        if membership == "gossip":
            self.membership = GossipMembership(
                node_id,
                url,
                seeds,
                period=heartbeat_interval,
                failure_timeout=failure_timeout,
                on_change=self._changed.set,
                loopback_only=key is None,
                hosted_source=hosted_state,
            )
        else:
            self.membership = Membership(
                node_id,
                url,
                seeds,
                heartbeat_interval=heartbeat_interval,
                failure_timeout=failure_timeout,
                on_change=self._changed.set,
                loopback_only=key is None,
            )
        self._assignment = Assignment((node_id,), standbys)
        self._executor = ElasticPool("sparkiq-router", 32)
        # Heartbeats have threads of their own: routed load must never delay them, or a
        # busy node would look silent to the others.
        self._beats = ElasticPool("sparkiq-beat", 8)
        # Seeds not yet heard from and hearsay members have a lane of their own: names that
        # lead nowhere (dead ports, unroutable addresses) must not delay proven members.
        self._probes = ElasticPool("sparkiq-probe", 4)
        self._in_flight: dict[str, Future[None]] = {}
        self._in_flight_lock = threading.Lock()
        # url -> when a refusal from it was last logged; written by heartbeat threads
        # (plain dict operations, atomic under the GIL)
        self._refusals_logged: dict[str, float] = {}
        #: Heartbeats this node sent, and those it answered, since start: what membership
        #: costs in messages, for /metrics (unlocked: two threads adding at once may lose
        #: one count, which a rate does not notice).
        self.heartbeats_sent = 0
        self.heartbeats_answered = 0
        #: The gossip protocol's periods (None: all-to-all heartbeats). A probe and its
        #: indirect probes each wait a third of the failure floor, so a period fits in it.
        self._swim: SwimLoop | None = None
        if isinstance(self.membership, GossipMembership):
            self._swim = SwimLoop(
                self.membership,
                transport,
                hosted_state,
                probe_timeout=max(failure_timeout / 3, heartbeat_interval),
                beats=self._beats,
                seeds_lane=self._probes,
            )
        self._round_done = threading.Condition()
        self._rounds = 0
        self._last_round = time.monotonic()
        self._wake = threading.Event()
        self.router = Router(
            self.membership,
            transport,
            lambda: self._assignment_now(),
            local_answer,
            local_caught_up,
            self._executor,
            fresh_view=self,
        )
        self._stop = threading.Event()
        self._rebalance_wanted = threading.Event()
        self._resyncing = False  # set after a stall until the replicas have caught up
        self._threads: list[threading.Thread] = []

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
        """Meet the cluster, host what is assigned, then keep going.

        Meeting means the seeds *and* the members they name: rounds go on while each one
        proves new members, for at most ``failure_timeout`` s. A joining node that
        rebalanced on its view of the seeds alone would open -- restore -- the partitions
        of a far smaller cluster (with one seed and one standby: every partition) and
        release most of them a round later."""
        wait = max(self.failure_timeout, 1.0)
        if self._swim is not None:  # a seed's ack to a join carries every member and record
            self._swim.view.set_own_hosted(self._hosted_state())
            self._swim.join(wait)
            self._start_threads()
            return
        membership = self.membership
        assert isinstance(membership, Membership)
        deadline = time.monotonic() + wait
        self.heartbeat_round(wait=wait)
        known = (-1, -1)
        while membership.unproven_targets() and time.monotonic() < deadline:
            now_known = (len(membership.proven_targets()), len(membership.members()))
            if now_known == known:
                break  # a round proved nobody new: the rest is dead seeds or hearsay
            known = now_known
            self.heartbeat_round(wait=min(wait, max(0.0, deadline - time.monotonic())))
        self._start_threads()

    def _start_threads(self) -> None:
        # one line naming the protocol: which one a node (or a test's subprocess) runs is
        # otherwise visible only in its traffic
        log.info(
            "%s: membership by %s (period %.2f s, failure floor %.1f s)",
            self.membership.node_id,
            "gossip" if self._swim is not None else "heartbeats",
            self.heartbeat_interval,
            self.failure_timeout,
        )
        self.membership.tick()
        self._last_round = time.monotonic()
        self._rebalance(self._assignment_now())
        node_id = self.membership.node_id
        self._threads = [
            threading.Thread(target=self._run, name=f"sparkiq-heartbeat-{node_id}", daemon=True),
            threading.Thread(
                target=self._run_rebalance, name=f"sparkiq-rebalance-{node_id}", daemon=True
            ),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        if self._swim is not None and self._threads:
            try:  # a planned leave: the others remove this node at once
                self._swim.leave(wait=self._swim.probe_timeout)
            except Exception:
                log.exception("announcing the leave of %s failed", self.membership.node_id)
        self._stop.set()
        self._wake.set()
        self._rebalance_wanted.set()
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.router.close()
        self._beats.shutdown(wait=False, cancel_futures=True)
        self._probes.shutdown(wait=False, cancel_futures=True)
        self.transport.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.heartbeat_interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self._round()
            except Exception:
                log.exception("heartbeat round of %s failed", self.membership.node_id)
            finally:
                with self._round_done:
                    self._rounds += 1
                    self._round_done.notify_all()

    def _round(self) -> None:
        """One round of the heartbeat loop. After a stall (this node was paused or starved
        for ``stall_limit`` s) the node first hears from the others -- silence does not
        count until then -- and refuses to answer (:meth:`is_fresh`) until the rebalance
        thread has also applied what was committed meanwhile, so it never acts or answers
        on what it knew before the stall.

        A stall can land between two rounds or in the middle of one, while the loop waits
        for replies; both are noticed, or a pause that hit the wait would pass unseen and
        the node would answer from its pre-pause view as soon as the round ended."""
        gap = time.monotonic() - self._last_round
        if gap > self.stall_limit:
            self._resync(gap)
        else:
            started = time.monotonic()
            self.heartbeat_round(wait=self.heartbeat_interval)
            waited = time.monotonic() - started
            if waited > self.heartbeat_interval + self.stall_limit:
                self._resync(waited)
        self.membership.tick()
        self._last_round = time.monotonic()
        self._changed.clear()
        self._rebalance_wanted.set()

    def _resync(self, gap: float) -> None:
        """After a stall of ``gap`` s: not fresh until caught up, and hear from everyone."""
        log.warning(
            "%s: stalled for %.1f s; resynchronizing before answering again",
            self.membership.node_id,
            gap,
        )
        # Set before _last_round moves on, so that is_fresh() never sees a window between.
        self._resyncing = True
        self.heartbeat_round(wait=self.failure_timeout)

    def _run_rebalance(self) -> None:
        """Rebalancing (and catching up after a stall) waits for the tailer's lock, which a
        long restore holds; it runs here so that heartbeats never wait for it."""
        while not self._stop.is_set():
            self._rebalance_wanted.wait(self.heartbeat_interval)
            self._rebalance_wanted.clear()
            if self._stop.is_set():
                break
            if time.monotonic() - self._last_round > self.stall_limit:
                continue  # the view is from before a stall: the heartbeat loop renews it first
            try:
                if self._resyncing:
                    if self._catch_up is not None:
                        self._catch_up()
                    self._resyncing = False
                    with self._round_done:
                        self._round_done.notify_all()
                self._rebalance(self._assignment_now())
            except Exception:
                log.exception("rebalancing %s failed", self.membership.node_id)

    def heartbeat_round(self, wait: float) -> None:
        """Send this node's heartbeat to every target that has none in flight and record
        the replies that arrive within ``wait`` s (later ones are recorded when they come)."""
        if self._swim is not None:
            self._swim.round(wait)
            self.heartbeats_sent = self._swim.sent
            self.heartbeats_answered = self._swim.answered
            return
        membership = self.membership
        assert isinstance(membership, Membership)
        hosted = self._hosted_state()
        docs: dict[bool, dict[str, Any]] = {}  # by whether the target reads groups
        readers = membership.group_readers()

        def doc_for(url: str) -> dict[str, Any]:
            groups = url in readers
            if groups not in docs:
                docs[groups] = membership.heartbeat_doc(hosted, groups=groups)
            return docs[groups]

        sent = []
        lanes = [(self._beats, membership.proven_targets())]
        lanes.append((self._probes, membership.unproven_targets()))
        with self._in_flight_lock:
            for pool, urls in lanes:
                for url in urls:
                    if url in self._in_flight:
                        continue  # still waiting for the last one: a slow member gets no pile-up
                    future = pool.submit(self._beat, url, doc_for(url))
                    self._in_flight[url] = future
                    sent.append(future)
        for future in sent:
            future.add_done_callback(self._beat_done)
        if sent:
            futures_wait(sent, timeout=wait)
        self.membership.check()

    def _beat(self, url: str, doc: dict[str, Any]) -> None:
        """Send one heartbeat and record its outcome, on the heartbeat thread that sent it:
        the round waiting for it then sees the reply recorded (a done-callback would run
        only after the waiter woke)."""
        self.heartbeats_sent += 1
        membership = self.membership
        assert isinstance(membership, Membership)
        try:
            reply = self.transport.heartbeat(url, doc)
        except NodeTimeoutError:
            return  # no reply in time: the failure detector judges the silence
        except NodeUnreachableError as exc:
            membership.unreachable(url, f"heartbeat: {exc}")
            return
        except SparkiqError as exc:
            self._log_refusal(url, exc)
            return
        try:
            membership.heard(reply)
        except HeartbeatError as exc:
            log.warning("ignoring the heartbeat reply of %s: %s", url, exc)

    def _beat_done(self, future: Future[None]) -> None:
        with self._in_flight_lock:
            url = next((u for u, f in self._in_flight.items() if f is future), None)
            if url is not None:
                del self._in_flight[url]
        if future.cancelled():
            return  # the node is stopping
        exc = future.exception()
        if exc is not None:
            log.error("heartbeat to %s failed unexpectedly", url, exc_info=exc)

    def admit(
        self, header: str | None, method: str, path: str, body: bytes, peer: str | None
    ) -> Opened | None:
        """Check a node-protocol request's node credential before anything of it is
        decoded: with a cluster secret its MAC (the opened request is returned: the reply
        is bound to its MAC, and it names the caller it runs for); without one, only a
        process on this host may speak for a node (``peer``: the caller's address), and only
        when the node asks no credential of its clients. Raises
        :class:`AuthenticationError` naming what is missing."""
        if self.verifier is not None:
            return self.verifier.verify(header, method, path, body)
        if self.open_to_local and is_loopback_host(peer):
            return None
        raise AuthenticationError(
            "this node admits no members: "
            + (
                "its clients authenticate but it has no cluster secret"
                if not self.open_to_local
                else f"{peer or 'the caller'} is not on this host and the node has no "
                "cluster secret"
            )
            + "; start every node of the cluster with the same --cluster-secret "
            "(SPARKIQ_CLUSTER_SECRET)"
        )

    def sign_reply(self, request_mac: str | None, body: bytes) -> str | None:
        """The reply header proving this node holds the secret (None without one)."""
        if self.verifier is None or request_mac is None:
            return None
        return self.verifier.key.sign_reply(request_mac, body)

    def _log_refusal(self, url: str | None, exc: BaseException) -> None:
        """A refused heartbeat is logged once a minute per URL: an impostor or a node of
        another cluster at a seed address refuses every round."""
        now = time.monotonic()
        key = url or ""
        if now - self._refusals_logged.get(key, -_REFUSAL_LOG_EVERY) >= _REFUSAL_LOG_EVERY:
            self._refusals_logged[key] = now
            log.warning("heartbeat to %s refused: %s", url, exc)

    def on_heartbeat(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A heartbeat from another member (it passed :meth:`admit`); returns this node's.
        Raises :class:`~sparkiq.cluster.heartbeat.HeartbeatError` for a malformed one."""
        if not isinstance(self.membership, Membership):
            raise HeartbeatError(
                "this node's membership is gossip: run every node of the cluster with the "
                "same membership setting",
                "body",
            )
        self.heartbeats_answered += 1
        self.membership.heard(doc)
        groups = doc.get("v", 1) >= FORMAT  # answered in the version it came in (checked)
        return self.membership.heartbeat_doc(self._hosted_state(), groups=groups)

    def on_probe(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A gossip probe (it passed :meth:`admit`); returns the ack."""
        return self._gossip().on_probe(doc)

    def on_probe_req(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A gossip indirect probe request (it passed :meth:`admit`)."""
        return self._gossip().on_probe_req(doc)

    def _gossip(self) -> SwimLoop:
        if self._swim is None:
            raise HeartbeatError(
                "this node's membership is heartbeats: run every node of the cluster with "
                "the same membership setting",
                "body",
            )
        return self._swim

    # -- freshness ---------------------------------------------------------------------------

    def is_fresh(self) -> bool:
        """Whether this node's view and replicas can be trusted: its heartbeat loop ran
        within ``stall_limit`` s. A node just resumed from a pause is not fresh until it
        has heard from the others again and caught up with the changelog."""
        return not self._resyncing and time.monotonic() - self._last_round <= self.stall_limit

    def wait_fresh(self, timeout: float) -> bool:
        """Block until :meth:`is_fresh` (at most ``timeout`` s); return whether it is."""
        if self.is_fresh():
            return True
        deadline = time.monotonic() + timeout
        self._wake.set()
        with self._round_done:
            while not self.is_fresh():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    return False
                self._round_done.wait(remaining)
        return True

    def refresh(self, timeout: float) -> bool:
        """Run a heartbeat round now and wait for it (at most ``timeout`` s): routers call
        this before retrying on a fresh view."""
        with self._round_done:
            target = self._rounds + 1
        self._wake.set()
        deadline = time.monotonic() + timeout
        with self._round_done:
            while self._rounds < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set() or not self._threads:
                    return False
                self._round_done.wait(remaining)
        return True

    def handed_off(self, table: str, partition: int, my_batch: int) -> bool:
        """Whether every node ``partition`` is now assigned to has it caught up to at least
        ``my_batch`` (so this node may release it). A claim this node cannot check -- a
        batch beyond the newest it knows is committed -- does not count until it can: a
        replica never runs ahead of the changelog."""
        assignment = self._assignment_now()
        replicas = assignment.replicas(table, partition)
        if not replicas:
            return False
        head = None if self._committed_head is None else self._committed_head(table)
        for member in replicas:
            state = self.membership.hosted_state(member).get(table, {}).get(partition)
            if state is None or state[1] != "live" or state[0] < my_batch:
                if state is not None and isinstance(self.membership, GossipMembership):
                    self.membership.want(member)  # its batches may be newer than its record
                return False
            if head is not None and state[0] > head:
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
