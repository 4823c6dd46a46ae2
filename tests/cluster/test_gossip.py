"""SWIM gossip's state machine (sparkiq.cluster.gossip): which update wins, refutation,
probing order, piggyback limits, suspicion timeouts, validation; and N members simulated
period by period (bench/_gossip.py): messages per member stay flat as N grows and every
change is agreed on within the target."""

from __future__ import annotations

import math
import random

import pytest
from bench._gossip import GossipSim

from sparkiq.cluster.gossip import ALIVE, DEAD, LEFT, SUSPECT, Gossip, Update
from sparkiq.cluster.heartbeat import HeartbeatError


def gossip(node_id: str = "a", **options: float) -> Gossip:
    return Gossip(node_id, f"local://{node_id}", rng=random.Random(7), **options)  # type: ignore[arg-type]


def up(member: str, status: str, incarnation: int) -> Update:
    return Update(member, status, incarnation, f"local://{member}")


# (known, heard, wins): SWIM's precedence, and gone members return only with a higher one
PRECEDENCE = [
    ((ALIVE, 1), (ALIVE, 2), True),
    ((ALIVE, 2), (ALIVE, 2), False),
    ((ALIVE, 2), (SUSPECT, 2), True),
    ((ALIVE, 2), (SUSPECT, 1), False),
    ((SUSPECT, 2), (SUSPECT, 2), False),
    ((SUSPECT, 2), (SUSPECT, 3), True),
    ((SUSPECT, 2), (ALIVE, 2), False),
    ((SUSPECT, 2), (ALIVE, 3), True),
    ((ALIVE, 2), (DEAD, 2), True),
    ((SUSPECT, 2), (LEFT, 2), True),
    ((ALIVE, 3), (DEAD, 2), False),
    ((DEAD, 2), (ALIVE, 2), False),
    ((DEAD, 2), (SUSPECT, 5), True),
    ((LEFT, 2), (ALIVE, 3), True),
    ((LEFT, 2), (DEAD, 2), False),
]


@pytest.mark.parametrize(("known", "heard", "wins"), PRECEDENCE, ids=str)
def test_which_update_wins(known: tuple[str, int], heard: tuple[str, int], wins: bool) -> None:
    view = gossip()
    assert view.apply(up("b", ALIVE, 0), 0.0)
    if known != (ALIVE, 0):
        assert view.apply(up("b", *known), 0.0)
    assert view.apply(up("b", *heard), 1.0) is wins
    assert view.members()["b"] == up("b", *(heard if wins else known))


def test_a_suspected_member_refutes_with_a_higher_incarnation() -> None:
    view = gossip()
    assert view.apply(up("a", SUSPECT, 0), 0.0)
    assert view.incarnation == 1
    assert view.piggyback(10) == [up("a", ALIVE, 1).to_wire()]  # announced, replacing inc 0
    assert not view.apply(up("a", SUSPECT, 0), 0.0)  # old news: already refuted
    view.apply(up("a", DEAD, 1), 0.0)  # declared dead while running: refuted too
    assert view.incarnation == 2


def test_a_member_leaving_does_not_refute_its_own_leave() -> None:
    view = gossip()
    left = view.leave()
    assert left.status == LEFT and left.incarnation == 1
    assert not view.apply(up("a", LEFT, 1), 0.0)
    assert view.incarnation == 1


def test_every_member_is_probed_once_per_pass() -> None:
    view = gossip()
    others = {f"m{i}" for i in range(9)}
    for member in others:
        view.apply(up(member, ALIVE, 0), 0.0)
    first = [view.next_probe() for _ in range(9)]
    second = [view.next_probe() for _ in range(9)]
    assert set(first) == set(second) == others
    assert first != second  # shuffled again at every pass
    view.apply(up("m0", DEAD, 0), 0.0)
    assert "m0" not in {view.next_probe() for _ in range(18)}
    assert "m3" not in view.helpers("m3") and len(view.helpers("m3")) == 3


def test_updates_are_piggybacked_least_sent_first_a_bounded_number_of_times() -> None:
    view = gossip()
    view.piggyback(10)  # its own alive update, first sent
    view.apply(up("b", ALIVE, 0), 0.0)
    assert [u[0] for u in view.piggyback(1)] == ["b"]  # never sent goes first
    limit = view.retransmit_limit()
    sent = 2  # "a" once, "b" once
    while view.pending():
        sent += len(view.piggyback(10))
    assert sent == 2 * limit
    view.apply(up("b", SUSPECT, 0), 0.0)
    assert view.piggyback(10) == [[*up("b", SUSPECT, 0).to_wire()]]  # the newer replaced it


def test_a_suspect_is_declared_dead_after_the_suspicion_timeout() -> None:
    small = gossip(period=0.5, suspicion_mult=2.0, suspicion_floor=1.0)
    for i in range(3):
        small.apply(up(f"m{i}", ALIVE, 0), 0.0)
    small.probe_failed("m0", 10.0)
    assert small.status("m0") == SUSPECT and "m0" not in small.live()
    timeout = small.suspicion_timeout()
    assert timeout == pytest.approx(2.0 * math.log2(4 + 1) * 0.5)  # mult * log2(n + 1) periods
    assert small.expire(10.0 + timeout - 0.01) == []
    assert small.expire(10.0 + timeout + 1e-9) == ["m0"]
    assert small.status("m0") == DEAD
    big = gossip(period=0.5, suspicion_mult=2.0, suspicion_floor=1.0)
    for i in range(99):
        big.apply(up(f"m{i}", ALIVE, 0), 0.0)
    assert big.suspicion_timeout() > timeout  # grows with log n


BAD_UPDATES = [
    "x",
    [["b", ALIVE, 0]],
    [["b", "zombie", 0, "local://b"]],
    [["b", ALIVE, -1, "local://b"]],
    [["b", ALIVE, True, "local://b"]],
    [["", ALIVE, 0, "local://b"]],
    [["b", ALIVE, 0, ""]],
]


@pytest.mark.parametrize("updates", BAD_UPDATES, ids=repr)
def test_a_malformed_update_rejects_the_message_and_changes_nothing(updates: object) -> None:
    view = gossip()
    good = up("c", ALIVE, 0).to_wire()
    with pytest.raises(HeartbeatError) as caught:
        view.receive([good, *updates] if isinstance(updates, list) else updates, 0.0)
    assert caught.value.field == "updates"
    assert view.members() == {}


def test_gossip_messages_stay_flat_and_changes_are_agreed_on_quickly() -> None:
    """Simulated periods of 0.5 s: each member sends about two messages a period (its
    probe and one ack) at 10 members and at 60; a join, a leave and a kill are agreed on by
    every member within 10 s, and the killed member is declared dead within 10 s too."""
    per_member = {}
    for n in (10, 60):
        sim = GossipSim(n, seed=n)
        for _ in range(20):
            sim.step()
        per_member[n] = sum(sim.messages.values()) / n / 20
        everyone = set(sim.members)
        limit = int(10 / sim.period)
        assert sim.run_until_agreed(everyone | {"new"}, 0) is None
        sim.join("new")
        assert sim.run_until_agreed(everyone | {"new"}, limit) is not None
        sim.leave("new")
        assert sim.run_until_agreed(everyone, limit) is not None
        sim.kill("g1")
        assert sim.run_until_agreed(everyone - {"g1"}, limit) is not None
        assert sim.run_until_dead("g1", limit) is not None
    assert per_member[10] == pytest.approx(2.0, abs=0.2)
    assert per_member[60] == pytest.approx(per_member[10], abs=0.2)
