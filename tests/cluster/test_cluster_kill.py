"""Real ``sparkiq serve`` processes under query load: kill -9, restart, and a node joining.

A writer commits a batch every 50 ms in which every key's value is the batch id, so every
answer can be checked on its own: the row must carry exactly the batch id of the position
it was served at. A client queries continuously through one node; we record every answer.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from sparkiq import Client, partition_for
from tests import http_calls
from tests.changelog.helpers import make_table
from tests.cluster.load import Answer, Load
from tests.cluster.serve_processes import BatchWriter, make_nodes, start_nodes, wait_cluster

KEYS = [f"k{i:03d}" for i in range(64)]
PARTITIONS = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Three nodes (and a fourth, not started) for the module: the kill test leaves them
    restarted and caught up, the join test then adds the fourth (three process starts, a
    second writer and a second settling fewer than a cluster per test)."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    state_dir = str(tmp_path / "state")
    changelog = make_table(state_dir, partitions=PARTITIONS)
    writer = BatchWriter(changelog, KEYS)
    writer.write_one()
    nodes = make_nodes(state_dir, str(tmp_path), 4)
    start_nodes(nodes[:3])
    writer.start()
    yield nodes, writer
    writer.stop()
    for node in nodes:
        node.stop()


def metadata(url: str) -> dict[str, Any]:
    nodes = http_calls.get(f"{url}/metadata", timeout=5).json()["nodes"]
    return {n["node_id"]: n for n in nodes}


def applied_batches(url: str) -> dict[int, int]:
    """The last batch each partition of ``t`` hosted at ``url`` has applied (its /metrics)."""
    text = http_calls.get(f"{url}/metrics", timeout=5).text
    applied = {}
    for labels, value in re.findall(r"^sparkiq_replica_batch_id\{(.*)\} (\S+)$", text, re.M):
        named = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if named.get("store") == "t":
            applied[int(named["partition"])] = int(float(value))
    assert applied, f"no sparkiq_replica_batch_id of t in {url}/metrics"
    return applied


def check_answers(answers: list[Answer]) -> None:
    assert answers, "the load produced no answers"
    wrong = [a for a in answers if a.ok and not a.consistent]
    assert wrong == [], f"{len(wrong)} answers disagree with their own position"
    last: dict[int, int] = {}
    for answer in answers:  # one client, in order: positions never go back
        if answer.ok:
            assert answer.batch >= last.get(answer.partition, -1), answer
            last[answer.partition] = answer.batch


def test_kill_minus_nine_of_an_active_node(cluster: Any) -> None:
    nodes, writer = cluster
    entry, victim = nodes[0], nodes[1]
    active_on_victim = metadata(entry.url)["n1"]["active"]["t"]
    assert active_on_victim, "n1 should be active for some partitions"
    with Client(entry.url) as client:
        load = Load(client, KEYS, PARTITIONS)
        load.start()
        time.sleep(1.5)
        # The resume check below needs history before the kill: wait for batches, since on
        # a loaded machine the writer's 0.05 s interval yields far fewer than 1.5 s suggests.
        deadline = time.monotonic() + 120
        while writer.next_batch <= 10 or min(applied_batches(victim.url).values()) < 5:
            assert time.monotonic() < deadline, "no 11 batches written, or n1 applied no 5"
            time.sleep(0.05)
        applied = applied_batches(victim.url)  # what its local files hold, at least
        killed_at = time.monotonic()
        victim.kill()
        time.sleep(4.0)
        victim.start()  # same id, port and local files
        victim.wait_up()
        wait_cluster([n.url for n in nodes[:3]], 3)
        time.sleep(1.0)
        answers = load.stop()
    check_answers(answers)
    # Every partition the victim was active for is answered again within 2 s of the kill.
    after = [a for a in answers if a.sent >= killed_at]
    for partition in active_on_victim:
        served = [a.sent for a in after if a.partition == partition and a.ok]
        assert served, f"partition {partition} was never answered after the kill"
        failover = served[0] - killed_at
        assert failover < 2.0, f"partition {partition} took {failover:.2f} s to fail over"
        failures = [a.sent - killed_at for a in after if a.partition == partition and not a.ok]
        assert all(f < 2.0 for f in failures), failures
    # Anything not a routed failure within the window is an answer.
    late_failures = [a for a in after if not a.ok and a.sent - killed_at >= 2.0]
    assert late_failures == []
    # The restarted node resumed from its local files (it applied only what it missed).
    status = json.loads((Path(victim.state_dir) / "replicas" / "n1" / "status.json").read_text())
    head = writer.next_batch - 1
    for partition in status["partitions"]:
        keys = sum(
            partition_for([k], ["string"], PARTITIONS) == partition["partition"] for k in KEYS
        )
        # Replaying from scratch would apply (head + 1) * keys rows; resuming applies only
        # the batches after the last it had applied (read from it just before the kill: a
        # replica trails the writer by a few batches on a busy machine), plus one in flight.
        missed = head - applied[partition["partition"]] + 1
        assert partition["restored_rows"] <= missed * keys, (partition, applied)
    wait_for_catch_up(victim.url, writer)


def wait_for_catch_up(url: str, writer: BatchWriter, timeout: float = 120.0) -> None:
    """Until the node at ``url`` has applied every batch committed when the wait began.

    The target is fixed: chasing the writer (20 batches/s) within a few batches would be a
    freshness target, which a loaded machine misses; ``timeout`` is a hang bound."""
    target = writer.next_batch - 1
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = metadata(url)
        mine = nodes[url_node(nodes, url)]["hosted"]["t"]
        if mine and all(s["batch_id"] >= target for s in mine.values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"{url} did not catch up with the writer")


def url_node(nodes: dict[str, Any], url: str) -> str:
    return next(n for n, doc in nodes.items() if doc["url"] == url)


def test_a_fourth_node_joins_under_load(cluster: Any) -> None:
    nodes, _ = cluster
    # the module's three nodes, whole and settled again after the kill test (or fresh)
    wait_cluster([n.url for n in nodes[:3]], 3)
    before = metadata(nodes[0].url)
    with Client(nodes[0].url) as client:
        load = Load(client, KEYS, PARTITIONS)
        load.start()
        time.sleep(1.0)
        joined_at = time.monotonic()
        nodes[3].start()
        nodes[3].wait_up()
        wait_cluster([n.url for n in nodes], 4)
        settled_at = time.monotonic()
        time.sleep(1.0)
        answers = load.stop()
    check_answers(answers)
    during = [a for a in answers if a.sent >= joined_at]
    assert during and all(a.ok for a in during), [a for a in during if not a.ok][:5]
    after = metadata(nodes[0].url)
    taken = after["n3"]["active"]["t"]
    assert taken, "the new node took no partition"
    for partition in range(PARTITIONS):  # only partitions the newcomer took changed hands
        if partition not in taken:
            owner = [n for n in before if partition in before[n]["active"]["t"]]
            assert partition in after[owner[0]]["active"]["t"]
    print(f"join settled in {settled_at - joined_at:.2f} s; {len(during)} answers, none failed")
