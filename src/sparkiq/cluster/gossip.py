"""SWIM-style membership dissemination: the state machine, without I/O or threads.

Not wired into :class:`~sparkiq.cluster.coordinator.Coordinator` yet (membership there is
all-to-all heartbeats; see docs/design.md, "Membership at 100 nodes"). This is the part of
its replacement that decides *what* to send and *what to believe*; the caller supplies time
(``now``, monotonic seconds), randomness and the messages.

After Das, Gupta and Motivala, "SWIM: Scalable Weakly-consistent Infection-style Process
Group Membership Protocol" (DSN 2002):

**Probing.** Each protocol period a member probes one other (:meth:`Gossip.next_probe`),
chosen round-robin over a list shuffled at every pass, so every member is probed within
``2n - 1`` periods and each member sends one probe a period, whatever ``n``. A probe that is
not acknowledged in time is retried through ``k`` other members (:meth:`Gossip.helpers`:
indirect probes, which route around a one-way or single-link failure); if none of those
acknowledges either, the caller reports :meth:`Gossip.probe_failed` and the member becomes
*suspect*.

**Suspicion.** A suspect member that does not refute within the suspicion timeout
(``suspicion_mult * log2(n + 1)`` periods, at least ``suspicion_floor`` s) is declared
*dead* (:meth:`Gossip.expire`). A member that hears it is suspected (or declared dead) while
running refutes it by raising its own *incarnation* number and announcing itself alive --
a paused or slow member is thus not removed for being late once.

**Reconnecting.** Members declared dead are not probed, so two sides of a healed partition
that declared each other dead would never speak again (nothing crosses between them) and the
cluster would stay split for good. Every few periods a member therefore also probes one
member it holds dead (:meth:`Gossip.next_reconnect`, round-robin): if that member runs, the
probe tells it that it is held dead, it refutes with a higher incarnation and its ack brings
it back; what it held of the prober travels back the same way. Members that *left* are not
retried: they said goodbye, and a restarted node joins through its seeds.

**Dissemination.** Every change is an :class:`Update` ``(member, status, incarnation, url)``
queued for piggybacking on the probes and acks the member sends anyway
(:meth:`Gossip.piggyback`), each update at most ``retransmit_mult * ceil(log2(n + 1))``
times, least-sent first: an update reaches every member in O(log n) periods with high
probability, and no extra messages are sent for it. Which update wins is decided by
:meth:`Gossip.apply` with SWIM's precedence:

* ``alive(i)`` beats ``suspect(j)`` and ``alive(j)`` when ``i > j``;
* ``suspect(i)`` beats ``alive(j)`` when ``i >= j`` and ``suspect(j)`` when ``i > j``;
* ``dead`` and ``left`` (a planned leave, announced by the member itself) beat every other
  status of the same or a lower incarnation, and a member that is dead or left comes back
  only with a higher incarnation (a restarted node starts above its last).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from sparkiq.cluster.heartbeat import HeartbeatError

__all__ = ["ALIVE", "DEAD", "LEFT", "SUSPECT", "Gossip", "Update"]

ALIVE, SUSPECT, DEAD, LEFT = "alive", "suspect", "dead", "left"
_STATUSES = (ALIVE, SUSPECT, DEAD, LEFT)
_GONE = (DEAD, LEFT)


@dataclass(frozen=True, slots=True)
class Update:
    """What a member believes of one member; the unit of dissemination.

    On the wire (a list inside a probe or ack, packed like heartbeats)::

        [member_id, status, incarnation, url]
    """

    member: str
    status: str
    incarnation: int
    url: str

    def to_wire(self) -> list[Any]:
        return [self.member, self.status, self.incarnation, self.url]

    @staticmethod
    def from_wire(value: object) -> Update:
        """Validate one update received from another member; raise
        :class:`~sparkiq.cluster.heartbeat.HeartbeatError` naming the problem."""
        if not isinstance(value, list | tuple) or len(value) != 4:
            raise HeartbeatError("an update is [member, status, incarnation, url]", "updates")
        member, status, incarnation, url = value
        if not isinstance(member, str) or not 0 < len(member) <= 128 or not member.isprintable():
            raise HeartbeatError("an update's member must be a node id", "updates")
        if status not in _STATUSES:
            raise HeartbeatError(f"an update's status must be one of {_STATUSES}", "updates")
        if isinstance(incarnation, bool) or not isinstance(incarnation, int) or incarnation < 0:
            raise HeartbeatError("an update's incarnation must be an integer >= 0", "updates")
        if not isinstance(url, str) or not 0 < len(url) <= 2048:
            raise HeartbeatError("an update's url must be a URL", "updates")
        return Update(member, status, incarnation, url)


def _beats(new: Update, old: Update) -> bool:
    """Whether ``new`` overrides ``old`` (about the same member): SWIM's precedence."""
    if old.status in _GONE:
        return new.incarnation > old.incarnation
    if new.status in _GONE:
        return new.incarnation >= old.incarnation
    if new.status == SUSPECT:
        return new.incarnation > old.incarnation or (
            new.incarnation == old.incarnation and old.status == ALIVE
        )
    return new.incarnation > old.incarnation  # alive


@dataclass
class _Entry:
    state: Update
    since: float  # when it took this status (monotonic seconds)


class Gossip:
    """One member's view and its dissemination queue (see the module docstring). Not
    thread-safe: one protocol loop drives it."""

    def __init__(
        self,
        node_id: str,
        url: str,
        *,
        period: float = 0.5,
        indirect: int = 3,
        retransmit_mult: int = 3,
        suspicion_mult: float = 4.0,
        suspicion_floor: float = 3.0,
        incarnation: int = 0,
        rng: random.Random | None = None,
    ) -> None:
        self.node_id = node_id
        self.url = url
        self.period = period
        self.indirect = indirect
        self.retransmit_mult = retransmit_mult
        self.suspicion_mult = suspicion_mult
        self.suspicion_floor = suspicion_floor
        self.incarnation = incarnation
        self._rng = rng or random.Random()
        self._members: dict[str, _Entry] = {}
        self._queue: dict[str, tuple[Update, int]] = {}  # member -> (update, times sent)
        self._order: list[str] = []
        self._next = 0
        self._reconnects = 0  # how many reconnect probes were chosen: the round-robin's index
        self._left = False
        self._enqueue(Update(node_id, ALIVE, incarnation, url))

    # -- views ---------------------------------------------------------------------------

    def status(self, member: str) -> str | None:
        if member == self.node_id:
            return ALIVE
        entry = self._members.get(member)
        return None if entry is None else entry.state.status

    def entry(self, member: str) -> _Entry | None:
        """What is known of ``member`` and since when (None: nothing, or this member)."""
        return self._members.get(member)

    def live(self) -> tuple[str, ...]:
        """Members alive (not suspect, dead or left), this one included, sorted."""
        alive = [m for m, e in self._members.items() if e.state.status == ALIVE]
        return tuple(sorted({self.node_id, *alive}))

    def members(self) -> dict[str, Update]:
        """Every member known, whatever its status, by id (this one excluded)."""
        return {m: e.state for m, e in self._members.items()}

    def size(self) -> int:
        """Members not known gone, this one included: the ``n`` of the limits."""
        return 1 + sum(1 for e in self._members.values() if e.state.status not in _GONE)

    def retransmit_limit(self) -> int:
        return self.retransmit_mult * max(1, math.ceil(math.log2(self.size() + 1)))

    def suspicion_timeout(self) -> float:
        periods = self.suspicion_mult * math.log2(self.size() + 1)
        return max(self.suspicion_floor, periods * self.period)

    # -- probing -------------------------------------------------------------------------

    def next_probe(self) -> str | None:
        """The member to probe this period (None: no other member is known)."""
        candidates = {m for m, e in self._members.items() if e.state.status not in _GONE}
        if not candidates:
            return None
        while True:
            if self._next >= len(self._order):
                self._order = sorted(candidates)
                self._rng.shuffle(self._order)
                self._next = 0
            member = self._order[self._next]
            self._next += 1
            if member in candidates:
                return member

    def next_reconnect(self) -> str | None:
        """A member held dead to probe again (None: none is), each in turn."""
        dead = sorted(m for m, e in self._members.items() if e.state.status == DEAD)
        if not dead:
            return None
        self._reconnects += 1
        return dead[self._reconnects % len(dead)]

    def helpers(self, target: str) -> list[str]:
        """Up to ``indirect`` alive members (not ``target``) to probe ``target`` for us."""
        alive = sorted(
            m for m, e in self._members.items() if e.state.status == ALIVE and m != target
        )
        return self._rng.sample(alive, min(self.indirect, len(alive)))

    def probe_failed(self, member: str, now: float) -> None:
        """Neither ``member`` nor the helpers acknowledged this period's probe."""
        entry = self._members.get(member)
        if entry is None or entry.state.status != ALIVE:
            return
        state = entry.state
        self.apply(Update(member, SUSPECT, state.incarnation, state.url), now)

    def expire(self, now: float) -> list[str]:
        """Declare dead the suspects whose suspicion timed out; return them."""
        timeout = self.suspicion_timeout()
        dead = [
            m
            for m, e in self._members.items()
            if e.state.status == SUSPECT and now - e.since >= timeout
        ]
        for member in dead:
            state = self._members[member].state
            self.apply(Update(member, DEAD, state.incarnation, state.url), now)
        return dead

    def leave(self) -> Update:
        """Announce a planned leave (send it on the last probes): the others remove this
        member at once instead of suspecting it for the suspicion timeout."""
        self.incarnation += 1
        self._left = True
        update = Update(self.node_id, LEFT, self.incarnation, self.url)
        self._enqueue(update)
        return update

    # -- dissemination --------------------------------------------------------------------

    def apply(self, update: Update, now: float) -> bool:
        """Take ``update`` in (heard from another member, or concluded here); return whether
        it changed this view. Changes are queued for piggybacking."""
        if update.member == self.node_id:
            if self._left:
                return False  # our own leave coming back: not to be refuted
            if update.status != ALIVE and update.incarnation >= self.incarnation:
                self.incarnation = update.incarnation + 1  # refute: I am here
                self._enqueue(Update(self.node_id, ALIVE, self.incarnation, self.url))
                return True
            return False
        entry = self._members.get(update.member)
        if entry is not None and not _beats(update, entry.state):
            return False
        if entry is None and update.status in _GONE:
            return False  # never knew it: nothing to remove, nothing to tell
        self._members[update.member] = _Entry(update, now)
        self._enqueue(update)
        return True

    def receive(self, updates: object, now: float) -> int:
        """Apply the piggybacked ``updates`` of a message (validated first: one malformed
        update rejects the message, having changed nothing); return how many changed
        this view."""
        if not isinstance(updates, list) or len(updates) > 4096:
            raise HeartbeatError("updates must be a list of at most 4096 updates", "updates")
        parsed = [Update.from_wire(u) for u in updates]
        return sum(1 for u in parsed if self.apply(u, now))

    def piggyback(self, limit: int) -> list[list[Any]]:
        """Up to ``limit`` queued updates for one outgoing message, least-sent first; each
        leaves the queue once sent :meth:`retransmit_limit` times."""
        chosen = sorted(self._queue.items(), key=lambda item: item[1][1])[:limit]
        out = []
        ceiling = self.retransmit_limit()
        for member, (update, sent) in chosen:
            out.append(update.to_wire())
            if sent + 1 >= ceiling:
                del self._queue[member]
            else:
                self._queue[member] = (update, sent + 1)
        return out

    def pending(self) -> int:
        return len(self._queue)

    def snapshot(self) -> list[list[Any]]:
        """Every member's state and this one's, for a member joining through this one (a
        joiner takes the whole view in one message instead of waiting for gossip)."""
        own = Update(self.node_id, ALIVE, self.incarnation, self.url)
        return [own.to_wire(), *(e.state.to_wire() for e in self._members.values())]

    def _enqueue(self, update: Update) -> None:
        self._queue[update.member] = (update, 0)  # a newer update replaces an older one
