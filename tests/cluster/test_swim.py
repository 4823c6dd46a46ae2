"""The gossip view (sparkiq.cluster.swim) between two or three views, no nodes: suspicion on
the stall-proof clock, refutation carried by one probe, hosted records pushed and pulled by
version, and messages checked before anything is taken in."""

from __future__ import annotations

import time

import pytest

from sparkiq.cluster.heartbeat import HeartbeatError
from sparkiq.cluster.swim import GossipMembership


def member(node_id: str, **options: float) -> GossipMembership:
    return GossipMembership(node_id, f"local://{node_id}", [], **options)  # type: ignore[arg-type]


def test_a_stall_of_this_node_does_not_run_suspicion_timers() -> None:
    a, b = member("a", period=0.5, failure_timeout=3.0), member("b")
    a.receive(b.message("a"))
    start = time.monotonic()
    a.tick(start)
    a.probe_failed("b")
    assert a.is_suspect("b") and a.live() == ("a",)
    a.tick(start + 60)  # this node was stalled for a minute: one second of it counts
    assert a.expire() == []
    a.tick(start + 61)
    assert a.expire() == []  # 2 s of the 3.2 s suspicion timeout
    for i in range(1, 8):
        a.tick(start + 61 + i * 0.5)
    assert a.expire() == ["b"]
    assert a.members()["b"].status == "dead"


def test_one_probe_carries_the_suspicion_and_its_ack_the_refutation() -> None:
    a, b = member("a"), member("b")
    a.receive(b.message("a"))
    a.probe_failed("b")
    assert "b" not in a.live()
    ack = b.reply(a.message("b"))  # the probe tells b what a believes of it
    assert ack["inc"] > a.members()["b"].incarnation
    a.receive(ack)
    assert a.live() == ("a", "b")


def test_hosted_records_are_pushed_then_pulled_by_version() -> None:
    a, b, c = member("a"), member("b"), member("c")
    first = {"t": {0: (3, "live", 0), 1: (3, "live", 0)}}
    b.set_own_hosted(first)
    a.receive(b.message("a"))  # pushed
    assert a.hosted_state("b") == first
    version = a.hosted_version("b")
    b.set_own_hosted({"t": {0: (3, "live", 0), 1: (3, "live", 0)}})  # unchanged: no version
    assert b.hosted_version("b") == version
    second = {"t": {0: (4, "live", 0), 1: (4, "restoring", 2)}}
    b.set_own_hosted(second)
    for _ in range(50):  # the push queue spent on another member
        c.receive(b.message("c"))
    assert b.message("a")["hosted"] == []
    assert a.hosted_state("b") == first
    a.receive(b.reply(a.message("b")))  # a's probe holds the old version: the ack has the new
    assert a.hosted_state("b") == second and a.hosted_version("b") > version
    stale = c.message("a")  # c holds b's record too; an older one never replaces a newer
    stale["hosted"] = [["b", version, {"t": [[3, "live", 0, [0, 1]]]}]]
    a.receive(stale)
    assert a.hosted_state("b") == second


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"node_id": ""}, "node_id"),
        ({"url": "http://elsewhere:1"}, "url"),
        ({"inc": -1}, "inc"),
        ({"updates": [["x", "gone", 1, "local://x"]]}, "updates"),
        ({"updates": [["x", "alive", 1, "http://other:1"]]}, "updates"),
        ({"hosted": [["x", 1, {"t": [[0, "live", 0, [-1]]]}]]}, "hosted"),
        ({"hosted": [["x", "1", {}]]}, "hosted"),
    ],
)
def test_a_malformed_message_is_refused_by_name_and_changes_nothing(
    change: dict[str, object], field: str
) -> None:
    a, b = member("a"), member("b")
    doc = b.message("a") | {"updates": [["x", "alive", 1, "local://x"]]} | change
    with pytest.raises(HeartbeatError) as refused:
        a.receive(doc)
    assert refused.value.field == field
    assert a.members() == {} and a.live() == ("a",)


def test_batches_alone_wait_for_the_refresh_unless_a_member_asks_for_them() -> None:
    state = {"t": {0: (3, "live", 0)}}
    b = GossipMembership("b", "local://b", [], batch_refresh=3600.0, hosted_source=lambda: state)
    a = member("a")
    b.set_own_hosted(state)
    a.receive(b.message("a"))
    version = a.hosted_version("b")
    state = {"t": {0: (9, "live", 0)}}  # only the batch moved: no new version yet
    b.set_own_hosted(state)
    a.receive(b.reply(a.message("b")))
    assert a.hosted_state("b") == {"t": {0: (3, "live", 0)}}
    a.receive(b.reply(a.message("b", fresh=True)))  # asked for its current state
    assert a.hosted_state("b") == state and a.hosted_version("b") > version
    state = {"t": {0: (9, "live", 0), 1: (0, "restoring", 4)}}  # a new partition: at once
    b.set_own_hosted(state)
    a.receive(b.reply(a.message("b")))
    assert a.hosted_state("b") == state


def test_two_sides_that_declared_each_other_dead_meet_again() -> None:
    """A healed partition: each side holds the other dead, so neither probes it in its
    round-robin; the reconnect probe of a member held dead brings both back."""
    a, b = member("a", failure_timeout=0.0), member("b", failure_timeout=0.0)
    a.receive(b.message("a"))
    b.receive(a.message("b"))
    for view, other in ((a, "b"), (b, "a")):  # the partition: each side's probes fail
        view.tick(0.0)
        view.probe_failed(other)
        for i in range(1, 20):  # ten seconds of periods: past the suspicion timeout
            view.tick(i * 0.5)
        assert view.expire() == [other]
        assert view.next_probe() is None and view.live() == (view.node_id,)
    assert a.next_reconnect() == "b"
    a.receive(b.reply(a.message("b")))  # b hears it is held dead and refutes in its ack
    assert a.live() == ("a", "b")
    b.receive(a.message("b"))  # a's next message to b carries a's own refutation
    assert b.live() == ("a", "b")
    assert a.next_reconnect() is None and b.next_reconnect() is None
