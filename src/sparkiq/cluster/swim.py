"""Membership by gossip: the view of :mod:`sparkiq.cluster.gossip` with hosted state, as the
coordinator and the router use it (``membership="gossip"``; see docs/design.md,
"Membership at 100 nodes").

:class:`GossipMembership` answers what :class:`~sparkiq.cluster.membership.Membership`
answers (who is live, where a member is, what it hosts, whom to route around) from a
:class:`~sparkiq.cluster.gossip.Gossip` view, and builds and reads the probe messages that
:mod:`sparkiq.cluster.swim_loop` sends. It is thread-safe: the protocol loop, the HTTP
handlers and routers all use it.

**Hosted state as versioned records.** What a member hosts (per table, per partition: batch,
state, lag) changes with every batch, so it cannot ride the piggyback queue whole for every
member. Each member numbers its own hosted state: the *hosted version* moves (to the larger
of the last one plus one and the wall clock in microseconds, so a restarted node starts above
its previous life) whenever the state changes. A record ``[member, version, groups]``
(``groups``: the heartbeat's format 2) is

* *pushed*: a member's new record is queued like a membership update and piggybacked on
  probes and acks, a few records a message, least-sent first, each at most the gossip
  retransmit limit of times; a member that takes a newer record in queues it in turn
  (infection), so it reaches everyone in ``O(log n)`` periods;
* *pulled*: every probe says which version of the target's record the prober holds
  (``hv``), and the ack carries the target's record when it is newer -- so a record lost to
  the push is still fetched when its member is next probed.

The version moves at once when which partitions a member hosts, or their states (``live``,
``restoring``, ``error``), change: that is what routing needs. When only batches moved it
moves at most every ``batch_refresh`` s (default 10 periods): every member's batches move
with every trigger, and N members' fresh batches at all N members is N^2 records a trigger,
which no piggyback limit carries. Where a current batch matters -- an old owner releasing a
partition waits until its new replicas have applied its batch -- the member asks for it
(:meth:`want`): the member is probed next with ``fresh``, and its ack carries its state as of
that moment.

**A byte bound per message.** A record grows with the partitions its member hosts (at 10
members and 10,000 partitions, thousands of partitions each), so a count of records alone
does not bound a message. The records one probe, ack or probe request carries -- pushed,
pulled and a joiner's snapshot together -- take at most ``hosted_bytes`` bytes
(:data:`HOSTED_BYTES_PER_MESSAGE` by default) and at most ``hosted_per_message`` records. A
record that does not fit waits for the next message (it keeps its place: least-sent first,
it leads the next one); a pulled record and a joiner's snapshot go first, the snapshot's
records that do not fit reach the joiner by the pull when it probes their members. A single
record larger than the whole bound could never fit: it travels alone, in a message that
carries no other record, so one such member costs what it did before the bound and never
holds up the others.

**Stall-proof clock.** Suspicion timers run on a clock that advances at most
``2 * period`` past this node's last protocol period (:meth:`tick`), as the heartbeat
detector's silence does: a node that was itself paused or starved must not declare others
dead for the time it was not running.

**Routing around.** A router that fails to reach a member marks it unreachable here
(:meth:`suspect`): it leaves this node's live view at once (as under heartbeats) and is
probed first; any direct message from it clears the mark.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from sparkiq.cluster.gossip import ALIVE, DEAD, LEFT, SUSPECT, Gossip, Update
from sparkiq.cluster.heartbeat import (
    MAX_MEMBERS,
    HeartbeatError,
    HostedState,
    check_url,
    checked_seeds,
    grouped,
    parse_groups,
)
from sparkiq.wire.values import pack

__all__ = ["GossipMembership"]

log = logging.getLogger("sparkiq.membership")

_MAX_INT = (1 << 63) - 1

#: The default byte bound of the hosted records in one message (see the module docstring).
#: 32 KiB is a few records of a member hosting a thousand partitions or more each, and at
#: about four messages a member a second at the default period it caps the records' share of
#: a member's traffic near 128 KB/s, whatever the cluster's size and shape: the bench
#: (bench/membership_gossip.py) measured 144 KB/s per member unbounded at 10 members and
#: 10,000 partitions.
HOSTED_BYTES_PER_MESSAGE = 32 * 1024


class _Record(NamedTuple):
    """One member's hosted record as held here."""

    version: int
    groups: dict[str, Any]  # on the wire (the heartbeat's format 2)
    hosted: HostedState
    size: int  # bytes of ``[member, version, groups]`` on the wire

    @staticmethod
    def of(member: str, version: int, groups: dict[str, Any], hosted: HostedState) -> _Record:
        return _Record(version, groups, hosted, len(pack([member, version, groups])))

    def wire(self, member: str) -> list[Any]:
        return [member, self.version, self.groups]


class GossipMembership:
    """This node's view under gossip (see the module docstring)."""

    def __init__(
        self,
        node_id: str,
        url: str,
        seeds: list[str],
        *,
        period: float = 0.5,
        failure_timeout: float = 3.0,
        on_change: Callable[[], None] | None = None,
        loopback_only: bool = False,
        updates_per_message: int = 16,
        hosted_per_message: int = 8,
        hosted_bytes: int = HOSTED_BYTES_PER_MESSAGE,
        batch_refresh: float | None = None,
        hosted_source: Callable[[], HostedState] | None = None,
    ) -> None:
        self.node_id = node_id
        self.url = url
        self.scheme = urllib.parse.urlsplit(url).scheme
        self.loopback_only = loopback_only
        self.seeds = checked_seeds(
            list(seeds), url, self.scheme, loopback_only=loopback_only, node_id=node_id, log=log
        )
        self.heartbeat_interval = period
        self.failure_timeout = failure_timeout
        self.updates_per_message = updates_per_message
        self.hosted_per_message = hosted_per_message
        if hosted_bytes < 1:
            raise ValueError(f"hosted_bytes must be at least 1 byte, got {hosted_bytes}")
        self.hosted_bytes = hosted_bytes
        #: A record whose only change is newer batches (or lags) waits this long since the
        #: last version: see "Hosted state" in the module docstring.
        self.batch_refresh = 10 * period if batch_refresh is None else batch_refresh
        self._hosted_source = hosted_source
        self._own_at = float("-inf")  # monotonic time of this node's last version
        self._wanted: set[str] = set()  # members to probe for their current record
        # the wall clock in ms: a restarted node starts above the incarnation it had
        self.gossip = Gossip(
            node_id,
            url,
            period=period,
            suspicion_floor=failure_timeout,
            incarnation=time.time_ns() // 1_000_000,
        )
        self._lock = threading.RLock()
        self._on_change = on_change
        self._last_live: tuple[str, ...] = (node_id,)
        # member -> its record as held here; this node's own included
        self._records: dict[str, _Record] = {}
        self._record_queue: dict[str, int] = {}  # member -> times its record was sent
        self._unreachable: dict[str, float] = {}  # routers failed to reach it (clock time)
        self._vclock = 0.0
        self._last_real: float | None = None

    # -- the clock suspicion runs on --------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """This node's protocol loop is running at ``now`` (monotonic)."""
        real = time.monotonic() if now is None else now
        with self._lock:
            if self._last_real is not None:
                self._vclock += min(max(0.0, real - self._last_real), 2 * self.heartbeat_interval)
            self._last_real = real

    def clock(self) -> float:
        """Seconds on the stall-proof clock (see the module docstring)."""
        real = time.monotonic()
        with self._lock:
            if self._last_real is None:
                return self._vclock
            ahead = min(max(0.0, real - self._last_real), 2 * self.heartbeat_interval)
            return self._vclock + ahead

    # -- views (what Membership answers) ---------------------------------------------------

    def live(self) -> tuple[str, ...]:
        """Members alive (not suspect, dead, left or unreachable), this node included."""
        with self._lock:
            return tuple(m for m in self.gossip.live() if m not in self._unreachable)

    def silence(self, node_id: str) -> float:
        """How long ``node_id`` has been in doubt: 0 while alive, the time since it was
        suspected (or found unreachable), infinite when gone or unknown."""
        if node_id == self.node_id:
            return 0.0
        clock = self.clock()
        with self._lock:
            since = self._unreachable.get(node_id)
            if since is not None:
                return max(0.0, clock - since)
            entry = self.gossip.entry(node_id)
            if entry is None or entry.state.status not in (ALIVE, SUSPECT):
                return float("inf")
            return 0.0 if entry.state.status == ALIVE else max(0.0, clock - entry.since)

    def is_suspect(self, node_id: str) -> bool:
        with self._lock:
            return node_id in self._unreachable or self.gossip.status(node_id) == SUSPECT

    def url_of(self, node_id: str) -> str | None:
        if node_id == self.node_id:
            return self.url
        with self._lock:
            state = self.gossip.members().get(node_id)
            return None if state is None else state.url

    def hosted_state(self, node_id: str) -> HostedState:
        with self._lock:
            record = self._records.get(node_id)
            return {} if record is None else record.hosted

    def hosting(self, table: str, partition: int) -> list[str]:
        """Members (not this node) alive and not unreachable whose last record says they
        host ``partition`` of ``table``."""
        with self._lock:
            return sorted(
                m
                for m, record in self._records.items()
                if m != self.node_id
                and m not in self._unreachable
                and self.gossip.status(m) == ALIVE
                and partition in record.hosted.get(table, {})
            )

    def members(self) -> dict[str, Update]:
        with self._lock:
            return self.gossip.members()

    def next_probe(self) -> str | None:
        with self._lock:
            return self.gossip.next_probe()

    def next_reconnect(self) -> str | None:
        with self._lock:
            return self.gossip.next_reconnect()

    def helpers(self, target: str) -> list[str]:
        with self._lock:
            return self.gossip.helpers(target)

    def hosted_version(self, node_id: str) -> int:
        """The version of ``node_id``'s record held here (-1: none)."""
        with self._lock:
            record = self._records.get(node_id)
            return -1 if record is None else record.version

    # -- changes ----------------------------------------------------------------------------

    def suspect(self, node_id: str, why: str = "") -> None:
        """A router could not reach ``node_id``: route around it until it is heard from."""
        with self._lock:
            if node_id in self._unreachable or self.gossip.status(node_id) in (None, DEAD, LEFT):
                return
            self._unreachable[node_id] = self.clock()
        log.warning(
            "%s: member %s is unreachable (%s); routing around it", self.node_id, node_id, why
        )
        self.check()

    def unreachable_members(self) -> list[str]:
        with self._lock:
            return sorted(self._unreachable)

    def heard_from(self, node_id: str) -> None:
        """A message came from ``node_id`` itself."""
        with self._lock:
            self._unreachable.pop(node_id, None)

    def probe_failed(self, node_id: str) -> None:
        with self._lock:
            self.gossip.probe_failed(node_id, self.clock())

    def expire(self) -> list[str]:
        """Declare dead the suspects whose suspicion timed out on the stall-proof clock."""
        with self._lock:
            dead = self.gossip.expire(self.clock())
            for member in dead:
                self._unreachable.pop(member, None)
        for member in dead:
            log.warning("%s: member %s declared dead", self.node_id, member)
        return dead

    def check(self) -> None:
        """Call ``on_change`` when the live members changed."""
        live = self.live()
        with self._lock:
            changed = live != self._last_live
            gone = set(self._last_live) - set(live)
            self._last_live = live
        if changed:
            if gone:
                log.warning("%s: members %s left (or are unreachable)", self.node_id, sorted(gone))
            if self._on_change is not None:
                self._on_change()

    def set_own_hosted(self, hosted: HostedState, *, force: bool = False) -> None:
        """This node's hosted state now: a new record (and version) when which partitions
        it hosts or their states changed, and when only their batches moved, at most every
        ``batch_refresh`` s (``force``: now)."""
        groups = grouped(hosted)
        now = time.monotonic()
        with self._lock:
            own = self._records.get(self.node_id)
            if own is not None and own.groups == groups:
                return
            if (
                own is not None
                and not force
                and now - self._own_at < self.batch_refresh
                and _shape(own.hosted) == _shape(hosted)
            ):
                return  # only batches moved: they wait for the refresh or a pull
            last = -1 if own is None else own.version
            version = max(last + 1, time.time_ns() // 1000)
            self._records[self.node_id] = _Record.of(self.node_id, version, groups, hosted)
            self._record_queue[self.node_id] = 0
            self._own_at = now

    def want(self, node_id: str) -> None:
        """Probe ``node_id`` soon for its current record (a handoff waits on its batch)."""
        with self._lock:
            if node_id != self.node_id and self.gossip.status(node_id) == ALIVE:
                self._wanted.add(node_id)

    def take_wanted(self) -> str | None:
        with self._lock:
            return self._wanted.pop() if self._wanted else None

    def leave(self) -> None:
        with self._lock:
            self.gossip.leave()

    # -- messages ---------------------------------------------------------------------------

    def message(
        self,
        peer: str | None,
        *,
        join: bool = False,
        fresh: bool = False,
        owed: list[str] | None = None,
    ) -> dict[str, Any]:
        """A probe (or ack) to ``peer`` (None: a seed not known by id yet): this node's id,
        URL and incarnation, queued updates (and what this node believes of ``peer`` when
        not alive, so that it refutes), hosted records within the byte bound (``owed``
        first: records this message owes its peer), and the version of ``peer``'s record
        held here (the pull)."""
        with self._lock:
            updates = self.gossip.piggyback(self.updates_per_message)
            belief = None if peer is None else self.gossip.members().get(peer)
            if belief is not None and belief.status != ALIVE:
                updates.append(belief.to_wire())
            doc: dict[str, Any] = {
                "node_id": self.node_id,
                "url": self.url,
                "inc": self.gossip.incarnation,
                "updates": updates,
                "hosted": self._take_records(owed or []),
                "hv": -1 if peer is None else self.hosted_version(peer),
            }
            if join:
                doc["join"] = True
            if fresh:  # the ack must carry the peer's state as of now
                doc["fresh"] = True
        return doc

    def reply(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Take a probe in (see :meth:`receive`) and return the ack: the prober's missing
        record of this node, and to a joining member every member and record."""
        sender = self.receive(doc)
        if doc.get("fresh") is True and self._hosted_source is not None:
            self.set_own_hosted(self._hosted_source(), force=True)
        join = doc.get("join") is True
        with self._lock:
            owed = []
            own = self._records.get(self.node_id)
            if own is not None and doc.get("hv", -1) != own.version:
                owed.append(self.node_id)  # the pull
            if join:  # then everyone else's that fits: the rest comes by the pull
                owed += sorted(m for m in self._records if m != self.node_id)
            ack = self.message(sender, owed=owed)
            if join:
                ack["members"] = self.gossip.snapshot()
        return ack

    def receive(self, doc: Mapping[str, Any]) -> str:
        """Validate a probe, ack or probe request (every field, before anything is taken
        in: :class:`~sparkiq.cluster.heartbeat.HeartbeatError` names the culprit) and take
        it in: its sender is alive at its incarnation, and its updates, members and records
        apply. Returns the sender's id."""
        if not isinstance(doc, Mapping):
            raise HeartbeatError("a probe is a map", "body")
        sender = doc.get("node_id")
        if not isinstance(sender, str) or not 0 < len(sender) <= 128 or not sender.isprintable():
            raise HeartbeatError("node_id must be a node id", "node_id")
        url = check_url(doc.get("url"), self.scheme, "url", loopback_only=self.loopback_only)
        inc = doc.get("inc")
        if isinstance(inc, bool) or not isinstance(inc, int) or not 0 <= inc <= _MAX_INT:
            raise HeartbeatError("inc must be an incarnation, an integer >= 0", "inc")
        updates = self._updates(doc.get("updates", []))
        if "members" in doc:
            updates += self._updates(doc["members"])
        records = self._parse_records(doc.get("hosted", []))
        with self._lock:
            now = self.clock()
            if sender != self.node_id:
                if len(self.gossip.members()) < MAX_MEMBERS or sender in self.gossip.members():
                    self.gossip.apply(Update(sender, ALIVE, inc, url), now)
                self._unreachable.pop(sender, None)
            for update in updates:
                if update.member in self.gossip.members() or len(self.gossip.members()) < (
                    MAX_MEMBERS
                ):
                    self.gossip.apply(update, now)
            for member, version, groups, hosted in records:
                held = self._records.get(member)
                if member == self.node_id or (held is not None and held.version >= version):
                    continue
                if member not in self.gossip.members():
                    continue  # a record of a member not (yet) known: it comes again
                self._records[member] = _Record.of(member, version, groups, hosted)
                self._record_queue[member] = 0
        self.check()
        return sender

    def _updates(self, value: object) -> list[Update]:
        if not isinstance(value, list) or len(value) > MAX_MEMBERS:
            raise HeartbeatError(f"updates must be a list of at most {MAX_MEMBERS}", "updates")
        out = []
        for item in value:
            update = Update.from_wire(item)
            check_url(update.url, self.scheme, "updates", loopback_only=self.loopback_only)
            out.append(update)
        return out

    def _parse_records(self, value: object) -> list[tuple[str, int, dict[str, Any], HostedState]]:
        if not isinstance(value, list) or len(value) > MAX_MEMBERS:
            raise HeartbeatError(f"hosted must be a list of at most {MAX_MEMBERS}", "hosted")
        out = []
        for item in value:
            if not isinstance(item, list | tuple) or len(item) != 3:
                raise HeartbeatError("a hosted record is [member, version, groups]", "hosted")
            member, version, groups = item
            if not isinstance(member, str) or not 0 < len(member) <= 128:
                raise HeartbeatError("a hosted record's member must be a node id", "hosted")
            if isinstance(version, bool) or not isinstance(version, int) or version < 0:
                raise HeartbeatError("a hosted record's version is an integer >= 0", "hosted")
            hosted = parse_groups(groups)
            out.append((member, version, groups, hosted))
        return out

    def _take_records(self, owed: list[str]) -> list[list[Any]]:
        """The hosted records of one message within the byte bound (call with the lock
        held): the ``owed`` ones that fit, in order, then queued ones, least-sent first, up
        to ``hosted_per_message`` of them. A queued record that does not fit keeps its
        place for the next message; one larger than the bound goes alone (see the module
        docstring)."""
        out: list[list[Any]] = []
        used = 0

        def fits(record: _Record) -> bool:
            return used + record.size <= self.hosted_bytes or not out

        for member in owed:
            record = self._records.get(member)
            if record is not None and fits(record):
                out.append(record.wire(member))
                used += record.size
        taken = {item[0] for item in out}
        ceiling = self.gossip.retransmit_limit()
        pushed = 0
        for member, sent in sorted(self._record_queue.items(), key=lambda item: item[1]):
            if pushed >= self.hosted_per_message or used >= self.hosted_bytes:
                break
            record = self._records.get(member)
            if record is None:
                del self._record_queue[member]
                continue
            if member in taken or not fits(record):
                continue  # already in this message, or waits for the next one
            out.append(record.wire(member))
            used += record.size
            pushed += 1
            if sent + 1 >= ceiling:
                del self._record_queue[member]
            else:
                self._record_queue[member] = sent + 1
        return out


def _shape(hosted: HostedState) -> dict[str, dict[int, str]]:
    """Which partitions ``hosted`` holds and their states, batches and lags left out."""
    return {t: {p: state[1] for p, state in parts.items()} for t, parts in hosted.items()}
