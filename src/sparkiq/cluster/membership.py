"""Who is in the cluster: seed peers, heartbeats and failure detection.

Every ``heartbeat_interval`` a node sends a heartbeat to every member it knows (the seed
peers and whoever they told it about). A heartbeat carries the sender's id, URL, the
members it knows and the state of every partition it hosts; the reply carries the same of
the receiver, so one round trip informs both sides. Every heartbeat is validated
(:func:`sparkiq.cluster.heartbeat.parse_heartbeat`) before anything is recorded, so a
malformed one changes nothing.

**Live.** A member is live until the failure detector says its silence means it is gone
(:class:`sparkiq.cluster.detector.Detector`: phi accrual over its heartbeat arrivals, with
``failure_timeout`` as the floor), so a member that is merely slow is not declared gone. A
router that cannot reach a member marks it *suspect*: it is skipped until it is heard from
again, so a killed node stops receiving queries at the first failed attempt rather than after
the detector's deadline.

**Our own pauses are not their silence.** Silence is measured on a clock that stops
``2 * heartbeat_interval`` after this node's last heartbeat round (:meth:`Membership.tick`):
while this node itself is stalled (paused, starved of CPU) it sends nothing and may hear
nothing, and that must not make it declare everyone else gone. After a stall the
coordinator first exchanges a round of heartbeats, then moves the clock on.

**Whom a node calls.** Heartbeats carry no credential, only a MAC of themselves
(:mod:`sparkiq.cluster.nodeauth`), and are recorded only once proven: a heartbeat that
passed the node-credential check, or a reply whose MAC answers ours. They go to the seeds,
to members heard from (*proven*), and to members a proven one named (*hearsay*, at most
:data:`MAX_HEARSAY` at a time) -- only of this node's own scheme, and only on loopback when
the node has no cluster secret. Hearsay is contacted on a lane of its own
(:meth:`Membership.unproven_targets`), so names that lead nowhere (dead ports, unroutable
addresses) cannot delay the heartbeats of proven members; hearsay never heard from directly
is forgotten after ``forget_after`` seconds, so invented members do not accumulate.

Members are identified by node id; the id of a seed is learned from its first reply.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkiq.cluster.detector import ArrivalWindow, Detector
from sparkiq.cluster.heartbeat import (
    FORMAT,
    MAX_MEMBERS,
    Heartbeat,
    HostedState,
    checked_seeds,
    grouped,
    parse_heartbeat,
)

__all__ = ["MAX_HEARSAY", "HostedState", "Member", "Membership"]

log = logging.getLogger("sparkiq.membership")

#: The most members known only by hearsay (named by another, never heard from) at once.
MAX_HEARSAY = 64


@dataclass
class Member:
    node_id: str
    url: str
    last_heard: float | None = None  # monotonic time of the last direct contact
    suspect_since: float | None = None
    started_at: float = 0.0
    hosted: HostedState = field(default_factory=dict)
    learned_at: float = 0.0  # monotonic time it was first named
    arrivals: ArrivalWindow = field(default_factory=ArrivalWindow)
    version: int = 1  # the heartbeat format its last heartbeat said it reads


class Membership:
    """The live members as this node sees them. Thread-safe."""

    def __init__(
        self,
        node_id: str,
        url: str,
        seeds: list[str],
        *,
        heartbeat_interval: float = 0.5,
        failure_timeout: float = 3.0,
        forget_after: float | None = None,
        on_change: Callable[[], None] | None = None,
        loopback_only: bool = False,
    ) -> None:
        self.node_id = node_id
        self.url = url
        self.scheme = urllib.parse.urlsplit(url).scheme
        self.loopback_only = loopback_only
        self.seeds = checked_seeds(
            list(seeds), url, self.scheme, loopback_only=loopback_only, node_id=node_id, log=log
        )
        self.heartbeat_interval = heartbeat_interval
        self.failure_timeout = failure_timeout
        self.detector = Detector(heartbeat_interval, failure_timeout)
        self.forget_after = forget_after if forget_after is not None else 20 * failure_timeout
        self.started_at = time.time()
        self._members: dict[str, Member] = {}
        self._lock = threading.Lock()
        self._on_change = on_change
        self._last_live: tuple[str, ...] = (node_id,)
        self._last_tick: float | None = None

    # -- the clock silence is measured on -------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """This node's heartbeat loop is running at ``now`` (monotonic)."""
        self._last_tick = time.monotonic() if now is None else now

    def _clock(self) -> float:
        now = time.monotonic()
        last_tick = self._last_tick
        if last_tick is None:
            return now
        return min(now, last_tick + 2 * self.heartbeat_interval)

    # -- views -------------------------------------------------------------------------------

    def _is_live(self, member: Member, clock: float) -> bool:
        if member.last_heard is None or member.suspect_since is not None:
            return False
        return not self.detector.gone(member.arrivals, clock - member.last_heard)

    def live(self) -> tuple[str, ...]:
        """Ids of the live members, this node included, sorted."""
        clock = self._clock()
        with self._lock:
            ids = [m.node_id for m in self._members.values() if self._is_live(m, clock)]
        return tuple(sorted({self.node_id, *ids}))

    def silence(self, node_id: str) -> float:
        """Seconds since ``node_id`` was last heard from (infinite if never; 0 for this node)."""
        if node_id == self.node_id:
            return 0.0
        clock = self._clock()
        with self._lock:
            member = self._members.get(node_id)
            if member is None or member.last_heard is None:
                return float("inf")
            return max(0.0, clock - member.last_heard)

    def is_suspect(self, node_id: str) -> bool:
        with self._lock:
            member = self._members.get(node_id)
            return member is not None and member.suspect_since is not None

    def url_of(self, node_id: str) -> str | None:
        if node_id == self.node_id:
            return self.url
        with self._lock:
            member = self._members.get(node_id)
            return None if member is None else member.url

    def hosted_state(self, node_id: str) -> HostedState:
        with self._lock:
            member = self._members.get(node_id)
            return {} if member is None else member.hosted

    def hosting(self, table: str, partition: int) -> list[str]:
        """Members (other than this node), not suspect, whose last heartbeat said they host
        ``partition`` of ``table`` -- whether or not the detector still counts them live."""
        with self._lock:
            return sorted(
                m.node_id
                for m in self._members.values()
                if m.suspect_since is None and partition in m.hosted.get(table, {})
            )

    def members(self) -> dict[str, Member]:
        with self._lock:
            return dict(self._members)

    def deadline(self, node_id: str) -> float | None:
        """The silence (s) at which ``node_id`` would now be declared gone."""
        with self._lock:
            member = self._members.get(node_id)
            arrivals = None if member is None else member.arrivals
        return None if arrivals is None else self.detector.deadline(arrivals)

    def targets(self) -> list[str]:
        """URLs to send heartbeats to: every seed and every known member."""
        return sorted({*self.proven_targets(), *self.unproven_targets()})

    def proven_targets(self) -> list[str]:
        """URLs of the members heard from directly."""
        with self._lock:
            return sorted({m.url for m in self._members.values() if m.last_heard is not None})

    def unproven_targets(self) -> list[str]:
        """URLs of the seeds and hearsay members no member heard from is at."""
        with self._lock:
            proven = {m.url for m in self._members.values() if m.last_heard is not None}
            hearsay = {m.url for m in self._members.values() if m.last_heard is None}
        return sorted((hearsay | set(self.seeds)) - proven)

    # -- updates -----------------------------------------------------------------------------

    def heard(self, doc: Mapping[str, Any] | Heartbeat) -> None:
        """Record a heartbeat (or a heartbeat's reply) received from another member.

        Raises :class:`~sparkiq.cluster.heartbeat.HeartbeatError` for a malformed one,
        having recorded nothing. Callers pass only heartbeats that passed the
        node-credential check and replies whose MAC answers this node's heartbeat (see
        "Whom a node calls")."""
        beat = (
            doc
            if isinstance(doc, Heartbeat)
            else parse_heartbeat(doc, self.scheme, loopback_only=self.loopback_only)
        )
        if beat.node_id == self.node_id:
            return
        now = time.monotonic()
        with self._lock:
            member = self._members.get(beat.node_id)
            if member is None:
                if len(self._members) >= MAX_MEMBERS:
                    log.warning("%s: member limit reached; ignoring %s", self.node_id, beat.url)
                    return
                member = self._members[beat.node_id] = Member(beat.node_id, beat.url)
                member.learned_at = now
                log.info("%s: member %s joined at %s", self.node_id, beat.node_id, beat.url)
            elif member.suspect_since is not None or member.last_heard is None:
                log.info("%s: member %s is back at %s", self.node_id, beat.node_id, beat.url)
            member.url = beat.url
            member.arrivals.arrived(now, self.failure_timeout)
            member.last_heard = now
            member.suspect_since = None
            member.started_at = beat.started_at
            member.hosted = beat.hosted
            member.version = beat.version
            hearsay = sum(1 for m in self._members.values() if m.last_heard is None)
            for other_id, other_url in beat.members.items():
                if other_id == self.node_id or other_id in self._members:
                    continue
                if len(self._members) >= MAX_MEMBERS or hearsay >= MAX_HEARSAY:
                    break
                self._members[other_id] = Member(other_id, other_url, learned_at=now)
                hearsay += 1
        self._check_change()

    def suspect(self, node_id: str, why: str = "") -> None:
        """A request to ``node_id`` failed (``why``: the error, for the log): skip it until
        it is heard from again."""
        with self._lock:
            member = self._members.get(node_id)
            if member is None or member.suspect_since is not None:
                return
            member.suspect_since = time.monotonic()
            log.warning(
                "%s: member %s is unreachable (%s); routing around it", self.node_id, node_id, why
            )
        self._check_change()

    def unreachable(self, url: str, why: str = "") -> None:
        """A heartbeat to ``url`` failed (``why``: the error, for the log)."""
        with self._lock:
            ids = [m.node_id for m in self._members.values() if m.url == url]
        for node_id in ids:
            self.suspect(node_id, why)

    def check(self) -> None:
        """Notice members that went silent, forget invented ones (every heartbeat round)."""
        now = time.monotonic()
        with self._lock:
            for node_id, member in list(self._members.items()):
                if member.last_heard is None and now - member.learned_at > self.forget_after:
                    log.info("%s: forgetting %s, never heard from", self.node_id, node_id)
                    del self._members[node_id]
        self._check_change()

    def _check_change(self) -> None:
        live = self.live()
        if live != self._last_live:
            gone = set(self._last_live) - set(live)
            if gone:
                log.warning("%s: members %s left (or are unreachable)", self.node_id, sorted(gone))
            self._last_live = live
            if self._on_change is not None:
                self._on_change()

    def group_readers(self) -> set[str]:
        """URLs of the members heard from that said they read version 2 heartbeats (see
        :mod:`sparkiq.cluster.heartbeat`, "Versions"); seeds and hearsay get version 1."""
        with self._lock:
            return {
                m.url
                for m in self._members.values()
                if m.version >= FORMAT and m.last_heard is not None
            }

    def heartbeat_doc(self, hosted: HostedState, *, groups: bool = False) -> dict[str, Any]:
        """What this node tells others about itself (the format of
        :mod:`sparkiq.cluster.heartbeat`): version 2's ``groups`` when ``groups``, else
        version 1's ``hosted``; either way it says it reads version 2."""
        with self._lock:
            # only members heard directly: second-hand names must not echo around forever
            known = {m.node_id: m.url for m in self._members.values() if m.last_heard is not None}
        doc: dict[str, Any] = {
            "node_id": self.node_id,
            "url": self.url,
            "started_at": self.started_at,
            "members": known,
            "v": FORMAT,
        }
        if groups:
            doc["groups"] = grouped(hosted)
        else:
            doc["hosted"] = {
                table: {str(p): list(s) for p, s in parts.items()}
                for table, parts in hosted.items()
            }
        return doc
