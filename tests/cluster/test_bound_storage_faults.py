"""A bounded read on a node whose changelog cannot be listed just now (a storage fault, as
an object store's throttling gives): the node answers as it would have without its look at
the changelog's head, never with an internal error (the fault harness saw 500s here)."""

from __future__ import annotations

import time
from pathlib import Path

from sparkiq import FailureReason, KeyQuery, Node, Position, PositionBound, StateQueryRequest
from tests.changelog.helpers import make_table, write_batch
from tests.faults.faultfs import Faults, install


def lookup(key: str, bound: Position) -> StateQueryRequest:
    return (
        StateQueryRequest.in_store("t")
        .with_query(KeyQuery.with_key(key))
        .with_position_bound(PositionBound.at(bound))
    )


def test_a_bounded_read_while_the_changelog_cannot_be_listed(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    changelog = make_table(state, partitions=1)
    write_batch(changelog, 0, {"a": 1}, position={"kafka:orders": {0: 10}})
    control = str(tmp_path / "faults.json")
    Faults().write(control)
    install(state, control)
    with Node(state, store="memory", node_id="f", source_wait=0.5) as node:
        node.poll_once()
        Faults(fail_lists=1.0).write(control)
        time.sleep(0.2)  # the control file is read again every 50 ms
        # a bound beyond what the replica holds: the head cannot be read to refuse it at
        # once, so the read waits for the batch as it would have, then says it is behind
        beyond = node.query(lookup("a", Position.from_map({"t": {0: 5}})))
        answer = beyond.only_partition_result()
        assert answer.failure_reason is FailureReason.NOT_UP_TO_BOUND, answer
        # a bound the replica meets reads as ever
        met = node.query(lookup("a", Position.from_map({"t": {0: 0}})))
        assert met.only_partition_result().result == {"k": "a", "n": 1}
        # a producer's read-your-writes bound: a record the table has read, and one it has not
        read = lookup("a", Position.empty()).with_position_bound(
            PositionBound.after(("orders", 0, 9))
        )
        assert node.query(read).only_partition_result().result == {"k": "a", "n": 1}
        unread = read.with_position_bound(PositionBound.after(("orders", 0, 30)))
        behind = node.query(unread).only_partition_result()
        assert behind.failure_reason is FailureReason.NOT_UP_TO_BOUND, behind
