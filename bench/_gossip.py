"""SWIM gossip (:mod:`sparkiq.cluster.gossip`) of N members, simulated period by period.

No threads and no clock: each protocol period every running member probes the member its
:class:`~sparkiq.cluster.gossip.Gossip` names, piggybacking up to :data:`PIGGYBACK` updates;
a running target acknowledges with its own; a stopped one does not, and the prober then asks
``indirect`` helpers (a ping-req each, and the helper's ping), and on no answer reports the
probe failed. Messages and their packed bytes are counted per member. What this leaves out
is the transport: the figures are the protocol's messages, bytes and decision CPU, and its
time to agreement in periods (times the period in seconds).

A joiner takes the seed's whole view in one exchange (:meth:`Gossip.snapshot`); a member
leaving announces it on its next probes (:meth:`Gossip.leave`) then stops; a killed member
stops at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from sparkiq.cluster.gossip import ALIVE, DEAD, Gossip, Update
from sparkiq.wire.values import pack

__all__ = ["PIGGYBACK", "GossipSim"]

#: The most updates piggybacked on one message.
PIGGYBACK = 8
#: Periods a leaving member goes on probing to announce its leave.
LEAVE_PERIODS = 3


@dataclass
class GossipSim:
    """``n`` members ``g0``... that already know each other (or ``n`` joined one by one
    when ``bootstrap``), period ``period`` s."""

    n: int
    period: float = 0.5
    seed: int = 0
    suspicion_mult: float = 2.0
    members: dict[str, Gossip] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    leaving: dict[str, int] = field(default_factory=dict)
    messages: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    now: float = 0.0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        for i in range(self.n):
            self._add(f"g{i}")
        for gossip in self.members.values():
            for other in self.members.values():
                if other is not gossip:
                    gossip.apply(Update(other.node_id, ALIVE, 0, other.url), self.now)
        for gossip in self.members.values():
            while gossip.pending():  # everyone knows everyone: nothing left to tell
                gossip.piggyback(1 << 20)

    def _add(self, node_id: str) -> Gossip:
        gossip = Gossip(
            node_id,
            f"local://{node_id}",
            period=self.period,
            suspicion_mult=self.suspicion_mult,
            rng=random.Random(self._rng.random()),
        )
        self.members[node_id] = gossip
        self.running.add(node_id)
        return gossip

    def _send(self, sender: str, doc: dict[str, object]) -> None:
        self.messages[sender] = self.messages.get(sender, 0) + 1
        self.bytes[sender] = self.bytes.get(sender, 0) + len(pack(doc))

    def _message(self, sender: str) -> dict[str, object]:
        updates = self.members[sender].piggyback(PIGGYBACK)
        doc: dict[str, object] = {"node_id": sender, "updates": updates}
        self._send(sender, doc)
        return doc

    def join(self, node_id: str, seed: str = "g0") -> None:
        gossip = self._add(node_id)
        # the join exchange: the joiner's announcement one way, the seed's view the other
        hello = {"node_id": node_id, "updates": [u.to_wire() for u in [_own(gossip)]]}
        self._send(node_id, hello)
        self.members[seed].receive(hello["updates"], self.now)
        view = {"node_id": seed, "updates": self.members[seed].snapshot()}
        self._send(seed, view)
        gossip.receive(view["updates"], self.now)

    def leave(self, node_id: str) -> None:
        self.members[node_id].leave()
        self.leaving[node_id] = LEAVE_PERIODS

    def kill(self, node_id: str) -> None:
        self.running.discard(node_id)

    def step(self) -> None:
        """One protocol period of every running member, in a random order."""
        order = sorted(self.running)
        self._rng.shuffle(order)
        for member in order:
            if member in self.running:
                self._probe(member)
        for member in list(self.leaving):
            self.leaving[member] -= 1
            if self.leaving[member] <= 0:
                del self.leaving[member]
                self.running.discard(member)
        self.now += self.period
        for member in self.running:
            self.members[member].expire(self.now)

    def _probe(self, member: str) -> None:
        gossip = self.members[member]
        target = gossip.next_probe()
        if target is None:
            return
        ping = self._message(member)
        if target in self.running:
            self.members[target].receive(ping["updates"], self.now)
            ack = self._message(target)
            gossip.receive(ack["updates"], self.now)
            return
        for helper in gossip.helpers(target):
            request = self._message(member)  # ping-req
            if helper not in self.running:
                continue
            self.members[helper].receive(request["updates"], self.now)
            self._message(helper)  # the helper's ping, unanswered
        gossip.probe_failed(target, self.now)

    def agreed(self, expected: set[str]) -> bool:
        want = tuple(sorted(expected))
        return all(self.members[m].live() == want for m in self.running if m in expected)

    def run_until_agreed(self, expected: set[str], limit: int) -> int | None:
        """Periods until every running member of ``expected`` sees exactly ``expected``."""
        for periods in range(limit + 1):
            if self.agreed(expected):
                return periods
            self.step()
        return None

    def run_until_dead(self, member: str, limit: int) -> int | None:
        """Periods until every running member declared ``member`` dead (not only suspect)."""
        for periods in range(limit + 1):
            if all(self.members[m].status(member) == DEAD for m in self.running):
                return periods
            self.step()
        return None


def _own(gossip: Gossip) -> Update:
    return Update(gossip.node_id, ALIVE, gossip.incarnation, gossip.url)
