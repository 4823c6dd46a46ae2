"""A replica opened on a node and still restoring, with no batch applied yet, answers
nothing: its empty state is no state of the table, and a key read from it would come back
as missing while the table holds it.

Found under load (``test_stalls``, heartbeats): a node that lost a member from its view
opened that member's partitions, and its router, finding the member out of the view, asked
the node itself first, whose new replica answered ``None`` for a key that exists. Here the
restore is held deterministically: the joining node's tailer applies nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkiq import KeyQuery, Node, SparkiqError, StateQueryRequest, UnknownStoreError
from sparkiq.cluster.transport import LocalTransport
from sparkiq.query.result import FailureReason
from sparkiq.serving.hosting import Hosting
from sparkiq.testing import wait_until as kit_wait_until
from tests.changelog.helpers import expected_rows, make_table, write_batch
from tests.cluster.cluster_helpers import FAST, settle, wait_until

KEYS = [f"k{i:03d}" for i in range(64)]
EXPECTED = expected_rows([{k: i for i, k in enumerate(KEYS)}])


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Node, Node]]:
    """n0 hosting every partition caught up, and n1 joined with its tailer held: the
    partitions it is assigned are opened and never restored."""
    changelog = make_table(str(tmp_path), partitions=8)
    write_batch(changelog, 0, {k: i for i, k in enumerate(KEYS)})
    original = Hosting.poll_once

    def poll_once(self: Hosting) -> int:
        return 0 if getattr(self, "held", False) else original(self)

    monkeypatch.setattr(Hosting, "poll_once", poll_once)
    transport = LocalTransport()
    options: dict[str, Any] = {"transport": transport, "standbys": 0, **FAST}
    n0 = Node(str(tmp_path), node_id="n0", **options).start()
    settle([n0])
    n1 = Node(str(tmp_path), node_id="n1", peers=["local://n0"], **options)
    n1._hosting.held = True  # type: ignore[attr-defined]
    n1.start()
    try:
        wait_until(lambda: n1.replica("t").partitions, 30, "n1 was assigned no partition")
        yield n0, n1
    finally:
        n1.stop()
        n0.stop()


def _restoring(node: Node) -> list[int]:
    partitions = node.replica("t").partitions
    return [p for p, replica in partitions.items() if replica.batch_id < 0]


def test_a_replica_that_applied_nothing_refuses_and_the_router_asks_another(
    held: tuple[Node, Node],
) -> None:
    _, n1 = held
    restoring = _restoring(n1)
    assert restoring
    request = StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(KEYS[0]))
    local = n1.query_local(request.with_partitions(set(restoring)))
    for partition in restoring:
        answer = local.partition_results[partition]
        assert answer.is_failure and answer.failure_reason is FailureReason.NOT_PRESENT
        assert "has applied no batch yet" in (answer.failure_message or "")
    # the old owner keeps answering until the new replica catches up, which it never does
    # (once n1 has heard what n0 hosts: before, n1 knows no other replica and a read fails)
    router = n1.coordinator.router  # type: ignore[union-attr]
    wait_until(
        lambda: all("n0" in router.candidates("t", p, False) for p in restoring),
        30,
        "n1 never heard that n0 still hosts the partitions it restores",
    )
    for key in KEYS:
        assert n1.get("t", key) == EXPECTED[key]


def test_with_the_old_owner_gone_a_key_is_an_error_not_missing(held: tuple[Node, Node]) -> None:
    n0, n1 = held
    n0.stop()  # every partition is now n1's, none restored
    wait_until(lambda: len(_restoring(n1)) == 8, 30, "n1 did not take every partition")
    for key in KEYS[:8]:
        with pytest.raises(SparkiqError, match="has applied no batch yet"):
            n1.get("t", key)


def test_the_testing_kits_wait_until_waits_through_a_restore(held: tuple[Node, Node]) -> None:
    """``sparkiq.testing.wait_until`` over a read of a restoring partition: the refusal is
    "not yet", named when the deadline passes; once the restore runs, the wait ends. An
    error asking again cannot fix ends the wait at once."""
    n0, n1 = held
    n0.stop()
    wait_until(lambda: len(_restoring(n1)) == 8, 30, "n1 did not take every partition")
    with pytest.raises(AssertionError, match=r"never restored.*has applied no batch yet") as late:
        kit_wait_until(lambda: n1.get("t", KEYS[0]) == EXPECTED[KEYS[0]], 0.3, "never restored")
    assert isinstance(late.value.__cause__, SparkiqError)
    with pytest.raises(UnknownStoreError):
        kit_wait_until(lambda: n1.get("nope", KEYS[0]) is not None, 30, "unreachable")
    n1._hosting.held = False  # type: ignore[attr-defined]
    kit_wait_until(lambda: n1.get("t", KEYS[0]) == EXPECTED[KEYS[0]], 60, "never restored")
