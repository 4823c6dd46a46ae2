"""Who is in the cluster: seed peers, heartbeats and a failure window.

Every ``heartbeat_interval`` a node sends a heartbeat to every member it knows (the seed
peers and whoever they told it about). A heartbeat carries the sender's id, URL, the
members it knows and the state of every partition it hosts; the reply carries the same of
the receiver, so one round trip informs both sides. A member is *live* while it was heard
from (directly) within ``failure_timeout`` seconds. A router that cannot reach a member
marks it *suspect*: it is skipped until it is heard from again, so a killed node stops
receiving queries at the first failed attempt rather than after the failure window.

Members are identified by node id; the id of a seed is learned from its first reply.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HostedState", "Member", "Membership"]

log = logging.getLogger("sparkiq.membership")

#: Per table, per hosted partition: ``(batch_id, state, lag_batches)`` (state: live,
#: restoring, error; lag: committed batches not applied yet).
HostedState = dict[str, dict[int, tuple[int, str, int]]]


@dataclass
class Member:
    node_id: str
    url: str
    last_heard: float = -1e18  # monotonic time of the last direct contact
    suspect_since: float | None = None
    started_at: float = 0.0
    hosted: HostedState = field(default_factory=dict)


class Membership:
    """The live members as this node sees them. Thread-safe."""

    def __init__(
        self,
        node_id: str,
        url: str,
        seeds: list[str],
        *,
        failure_timeout: float = 3.0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.url = url
        self.seeds = [s for s in seeds if s != url]
        self.failure_timeout = failure_timeout
        self.started_at = time.time()
        self._members: dict[str, Member] = {}
        self._lock = threading.Lock()
        self._on_change = on_change
        self._last_live: tuple[str, ...] = (node_id,)

    # -- views -------------------------------------------------------------------------------

    def live(self) -> tuple[str, ...]:
        """Ids of the live members, this node included, sorted."""
        now = time.monotonic()
        with self._lock:
            ids = [
                m.node_id
                for m in self._members.values()
                if now - m.last_heard <= self.failure_timeout and m.suspect_since is None
            ]
        return tuple(sorted({self.node_id, *ids}))

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

    def members(self) -> dict[str, Member]:
        with self._lock:
            return dict(self._members)

    def targets(self) -> list[str]:
        """URLs to send heartbeats to: every known member and every seed."""
        with self._lock:
            urls = {m.url for m in self._members.values()}
        return sorted(urls | set(self.seeds))

    # -- updates -----------------------------------------------------------------------------

    def heard(self, doc: Mapping[str, Any]) -> None:
        """Record a heartbeat (or a heartbeat's reply) received from another member."""
        node_id, url = doc.get("node_id"), doc.get("url")
        if not isinstance(node_id, str) or not isinstance(url, str) or node_id == self.node_id:
            return
        hosted = {
            table: {int(p): (int(s[0]), str(s[1]), int(s[2])) for p, s in parts.items()}
            for table, parts in (doc.get("hosted") or {}).items()
        }
        with self._lock:
            member = self._members.get(node_id)
            if member is None:
                member = self._members[node_id] = Member(node_id, url)
                log.info("%s: member %s joined at %s", self.node_id, node_id, url)
            member.url = url
            member.last_heard = time.monotonic()
            member.suspect_since = None
            member.started_at = float(doc.get("started_at") or 0.0)
            member.hosted = hosted
            for other_id, other_url in (doc.get("members") or {}).items():
                if other_id != self.node_id and other_id not in self._members:
                    self._members[other_id] = Member(other_id, other_url)
        self._check_change()

    def suspect(self, node_id: str) -> None:
        """A request to ``node_id`` failed: skip it until it is heard from again."""
        with self._lock:
            member = self._members.get(node_id)
            if member is None or member.suspect_since is not None:
                return
            member.suspect_since = time.monotonic()
            log.warning("%s: member %s is unreachable; routing around it", self.node_id, node_id)
        self._check_change()

    def unreachable(self, url: str) -> None:
        """A heartbeat to ``url`` failed."""
        with self._lock:
            ids = [m.node_id for m in self._members.values() if m.url == url]
        for node_id in ids:
            self.suspect(node_id)

    def check(self) -> None:
        """Notice members that went silent (called on every heartbeat round)."""
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

    def heartbeat_doc(self, hosted: HostedState) -> dict[str, Any]:
        """What this node tells others about itself."""
        with self._lock:
            known = {m.node_id: m.url for m in self._members.values()}
        return {
            "node_id": self.node_id,
            "url": self.url,
            "started_at": self.started_at,
            "members": known,
            "hosted": {
                table: {str(p): list(s) for p, s in parts.items()}
                for table, parts in hosted.items()
            },
        }
