"""The byte bound of gossip's hosted records (sparkiq.cluster.swim): twelve views with a
big cluster state (10,000 partitions, two replicas, a batch of its own on every partition)
gossip period by period, no nodes: every message's records stay within the bound -- but
for a record larger than the whole bound, which travels alone -- and every view still comes
to hold every member's current record, after the joins and after every member changed."""

from __future__ import annotations

from typing import Any

from sparkiq.cluster.heartbeat import HostedState
from sparkiq.cluster.swim import HOSTED_BYTES_PER_MESSAGE, GossipMembership
from sparkiq.wire.values import pack

MEMBERS = 12
PARTITIONS = 10_000
BOUND = 16 * 1024
BIG = "m11"  # hosts every partition: its record alone is larger than the bound


def hosted(index: int, batch: int) -> HostedState:
    """Member ``index``'s share (two replicas a partition), each partition at a batch of
    its own so that the record does not collapse into a few groups."""
    if f"m{index}" == BIG:
        mine = range(PARTITIONS)
    else:
        mine = (p for p in range(PARTITIONS) if p % (MEMBERS - 1) in (index, index + 1))
    return {"t": {p: (batch + p % 13, "live", 0) for p in mine}}


def record_bytes(doc: dict[str, Any]) -> list[int]:
    return [len(pack(record)) for record in doc["hosted"]]


def test_every_message_stays_within_the_bound_and_a_big_state_converges() -> None:
    views = [
        GossipMembership(f"m{i}", f"local://m{i}", [], hosted_bytes=BOUND, batch_refresh=0.0)
        for i in range(MEMBERS)
    ]
    by_id = {v.node_id: v for v in views}
    sizes: list[list[int]] = []  # per message, the bytes of each record it carried

    def sent(doc: dict[str, Any]) -> dict[str, Any]:
        sizes.append(record_bytes(doc))
        return doc

    def converged() -> bool:
        return all(
            v.hosted_version(m.node_id) == m.hosted_version(m.node_id) for v in views for m in views
        )

    def gossip_until_converged() -> int:
        for period in range(1, 200):
            for view in views:
                target = view.next_probe()
                assert target is not None
                view.receive(sent(by_id[target].reply(sent(view.message(target)))))
            if converged():
                return period
        raise AssertionError("the views never came to hold every current record")

    for i, view in enumerate(views):
        view.set_own_hosted(hosted(i, 0))
    assert record_bytes(views[-1].message("m0")) > [BOUND]  # the premise: it alone is larger
    for view in views[1:]:  # each joins through m0: its ack carries what fits of every record
        view.receive(sent(views[0].reply(sent(view.message(None, join=True)))))
    joined = gossip_until_converged()

    for i, view in enumerate(views):  # every member's state changes at once
        view.set_own_hosted(hosted(i, 100))
    changed = gossip_until_converged()
    for view in views:
        for i, other in enumerate(views):
            assert view.node_id == other.node_id or view.hosted_state(other.node_id) == hosted(
                i, 100
            )

    alone = [s for s in sizes if s and max(s) > BOUND]
    shared = [s for s in sizes if s and max(s) <= BOUND]
    assert all(len(s) == 1 for s in alone), [s for s in alone if len(s) > 1][:3]
    assert max(sum(s) for s in shared) <= BOUND
    # the bound is what limited them: records waited rather than went eight to a message
    assert max(len(s) for s in shared) < 8 and max(sum(s) for s in shared) > BOUND // 2
    print(f"converged after the joins in {joined} periods, after the change in {changed}")


def test_the_default_bound_carries_several_records_of_a_large_member() -> None:
    # a member hosting 2,000 partitions on one batch (one group): several fit in a message
    state: HostedState = {"t": {p: (7, "live", 0) for p in range(2000)}}
    a = GossipMembership("a", "local://a", [])
    a.set_own_hosted(state)
    size = len(pack(a.message("b")["hosted"][0]))
    assert 3 * size < HOSTED_BYTES_PER_MESSAGE
