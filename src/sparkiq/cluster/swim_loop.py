"""The gossip protocol's periods: probes, indirect probes, joins and leaves over the node
transport (``membership="gossip"``; the view and the messages are
:mod:`sparkiq.cluster.swim`'s).

Each period (:meth:`SwimLoop.round`) this node

1. records its hosted state (a new hosted record when it changed);
2. until it knows any member, sends a *join* probe to every seed (on the seeds' lane: seeds
   that lead nowhere must not hold up the period); a seed's ack carries every member and
   every hosted record;
3. probes one member -- one found unreachable by a router first, then one whose current
   hosted record is wanted (:meth:`~sparkiq.cluster.swim.GossipMembership.want`), else the
   next of :meth:`~sparkiq.cluster.gossip.Gossip.next_probe`'s round-robin -- over
   ``/internal/probe``, waiting ``probe_timeout`` s for the ack;
4. without an ack, asks up to ``k`` other members to probe it (``/internal/probe-req``)
   and waits as long again; without any ack the member becomes *suspect* -- unless this
   period itself took far longer than its waits, which means this node was stalled and
   its silence says nothing of the member's;
5. declares dead the suspects whose timeout ran out on the stall-proof clock;
6. every :data:`RECONNECT_EVERY` periods, probes one member it holds dead, without waiting
   for the ack (on the seeds' lane: a member really gone must not hold up the period), so
   that the two sides of a healed partition find each other again (see "Reconnecting" in
   :mod:`sparkiq.cluster.gossip`).

Messages are signed and admitted like heartbeats (:mod:`sparkiq.cluster.nodeauth`): the
transport signs them and checks the reply's MAC, the HTTP layer admits them with
:meth:`~sparkiq.cluster.coordinator.Coordinator.admit`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as futures_wait
from typing import Any

from sparkiq.cluster.heartbeat import HeartbeatError, HostedState
from sparkiq.cluster.httppool import NodeTimeoutError
from sparkiq.cluster.swim import GossipMembership
from sparkiq.cluster.transport import Transport
from sparkiq.errors import NodeUnreachableError, SparkiqError
from sparkiq.pools import ElasticPool

__all__ = ["SwimLoop"]

log = logging.getLogger("sparkiq.cluster")

#: Periods between two probes of members held dead: after a partition heals, the sides meet
#: again within this many periods times the dead members' count, at one extra message per
#: this many periods while any member is held dead.
RECONNECT_EVERY = 4


class SwimLoop:
    """One node's gossip periods (see the module docstring)."""

    def __init__(
        self,
        view: GossipMembership,
        transport: Transport,
        hosted_state: Callable[[], HostedState],
        *,
        probe_timeout: float,
        beats: ElasticPool,
        seeds_lane: ElasticPool,
    ) -> None:
        self.view = view
        self.transport = transport
        self._hosted_state = hosted_state
        self.probe_timeout = probe_timeout
        self._beats = beats
        self._seeds_lane = seeds_lane
        #: Messages this node sent and answered (probes, acks of probe requests): /metrics.
        self.sent = 0
        self.answered = 0
        self._periods = 0

    # -- one period --------------------------------------------------------------------------

    def round(self, wait: float) -> None:
        """One protocol period; waits at most ``wait`` s for seeds' acks."""
        view = self.view
        view.set_own_hosted(self._hosted_state())
        if not view.members():
            self.join(wait)
        target, fresh = self._next_target()
        if target is not None:
            self._probe_member(target, fresh=fresh)
        self._periods += 1
        if self._periods % RECONNECT_EVERY == 0:
            self._reconnect()
        view.expire()
        view.check()

    def _reconnect(self) -> None:
        """Probe one member held dead; its ack, if it comes, is taken in when it comes."""
        member = self.view.next_reconnect()
        url = None if member is None else self.view.url_of(member)
        if member is not None and url is not None:
            self._seeds_lane.submit(self._probe, url, member)

    def _next_target(self) -> tuple[str | None, bool]:
        """Whom to probe this period, and whether for its current record."""
        unreachable = self.view.unreachable_members()
        if unreachable:
            return unreachable[0], False
        wanted = self.view.take_wanted()
        if wanted is not None:
            return wanted, True
        return self.view.next_probe(), False

    def _probe_member(self, target: str, *, fresh: bool = False) -> None:
        view = self.view
        url = view.url_of(target)
        if url is None:
            return
        started = time.monotonic()
        probe = self._beats.submit(self._probe, url, target, fresh=fresh)
        if self._acked([probe], self.probe_timeout):
            return
        helpers = view.helpers(target)
        asks = []
        for helper in helpers:
            helper_url = view.url_of(helper)
            if helper_url is not None:
                asks.append(self._beats.submit(self._ask, helper_url, helper, target, url))
        if asks and self._acked(asks, self.probe_timeout):
            return
        took = time.monotonic() - started
        # this node stalled meanwhile: the missing ack says nothing about the target
        if took > 2 * self.probe_timeout + max(2 * view.heartbeat_interval, self.probe_timeout):
            log.info(
                "%s: a probe period took %.1f s; not suspecting %s", view.node_id, took, target
            )
            return
        view.probe_failed(target)

    @staticmethod
    def _acked(futures: list[Future[bool]], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        pending = set(futures)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            done, pending = futures_wait(pending, timeout=remaining, return_when=FIRST_COMPLETED)
            if any(not f.cancelled() and f.exception() is None and f.result() for f in done):
                return True
        return False

    # -- messages ----------------------------------------------------------------------------

    def _probe(
        self, url: str, target: str | None, *, join: bool = False, fresh: bool = False
    ) -> bool:
        """Probe the member at ``url``; whether it acknowledged (its ack taken in)."""
        self.sent += 1
        try:
            ack = self.transport.probe(url, self.view.message(target, join=join, fresh=fresh))
            sender = self.view.receive(ack)
        except (NodeTimeoutError, NodeUnreachableError):
            return False
        except HeartbeatError as exc:
            log.warning("ignoring the probe ack of %s: %s", url, exc)
            return False
        except SparkiqError as exc:
            log.warning("probe to %s refused: %s", url, exc)
            return False
        return target is None or sender == target

    def _ask(self, helper_url: str, helper: str, target: str, target_url: str) -> bool:
        """Ask ``helper`` to probe ``target``; whether it got the target's ack."""
        self.sent += 1
        doc = self.view.message(helper)
        doc["target"] = target
        doc["target_url"] = target_url
        try:
            reply = self.transport.probe_req(helper_url, doc)
            self.view.receive(reply)
        except (NodeTimeoutError, NodeUnreachableError):
            return False
        except (HeartbeatError, SparkiqError) as exc:
            log.warning("probe request to %s failed: %s", helper_url, exc)
            return False
        return reply.get("acked") is True

    def on_probe(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A probe from another member (admitted); returns the ack."""
        self.answered += 1
        return self.view.reply(doc)

    def on_probe_req(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Probe ``doc["target"]`` for the member that asked; the reply says whether the
        target acknowledged within ``probe_timeout`` s."""
        self.answered += 1
        target, target_url = doc.get("target"), doc.get("target_url")
        if not isinstance(target, str) or not isinstance(target_url, str):
            raise HeartbeatError("a probe request names a target and its URL", "target")
        self.view.receive(doc)
        # only a member this node knows, where it knows it: never a URL a request names
        acked = False
        if self.view.url_of(target) == target_url.rstrip("/") and target != self.view.node_id:
            future = self._beats.submit(self._probe, target_url, target)
            acked = self._acked([future], self.probe_timeout)
        reply = self.view.message(doc["node_id"])
        reply["acked"] = acked
        return reply

    # -- joining and leaving -----------------------------------------------------------------

    def join(self, wait: float) -> bool:
        """Send a join probe to every seed; whether one answered within ``wait`` s."""
        futures = [
            self._seeds_lane.submit(self._probe, seed, None, join=True) for seed in self.view.seeds
        ]
        if not futures:
            return False
        return self._acked(futures, wait)

    def leave(self, wait: float) -> None:
        """Announce this node's planned leave to a few members (the rest hear it by gossip)
        so that they remove it at once instead of suspecting it."""
        view = self.view
        view.leave()
        told = view.helpers("")
        futures = []
        for member in told:
            url = view.url_of(member)
            if url is not None:
                futures.append(self._beats.submit(self._probe, url, member))
        if futures:
            futures_wait(futures, timeout=wait)
