"""Push queries over HTTP: ``POST /query`` with ``... EMIT CHANGES`` streams NDJSON, and
``Client.stream`` resumes after a disconnect without losing or repeating changes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from sparkiq import Client
from sparkiq.errors import InvalidQueryError, SparkiqError
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import start_http_cluster

BATCHES: list[dict[str, int | None]] = [
    {f"k{i:02d}": (b * 100 + i if (b + i) % 5 else None) for i in range(b % 7, 40, 3)}
    for b in range(30)
]


def committed_changes(batches: list[dict[str, int | None]]) -> list[tuple[str, Any]]:
    """Every change in commit order, the ground truth a subscriber must see."""
    out = []
    for batch in batches:
        for key, n in batch.items():
            out.append((key, None if n is None else {"k": key, "n": n}))
    return out


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    changelog = make_table(str(tmp_path), partitions=4)
    write_batch(changelog, 0, BATCHES[0])
    nodes = start_http_cluster(str(tmp_path), 2, token="tok")
    yield nodes, changelog
    for node in reversed(nodes):
        node.stop()


def by_key(changes: list[tuple[str, Any]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for key, row in changes:
        out.setdefault(key, []).append(row)
    return out


def test_a_subscriber_sees_every_committed_change_in_order_and_resumes(cluster: Any) -> None:
    nodes, changelog = cluster
    seen: list[tuple[str, Any]] = []
    with Client(nodes[1].url, token="tok") as client:
        stream = client.stream("SELECT * FROM t EMIT CHANGES")

        def write() -> None:
            for batch_id in range(1, 15):
                write_batch(changelog, batch_id, BATCHES[batch_id])
                time.sleep(0.01)

        writer = threading.Thread(target=write)
        writer.start()
        expected_first = committed_changes(BATCHES[1:15])
        token = None
        for change in stream:
            seen.append((change.key, change.row))
            token = change.position
            if len(seen) == len(expected_first) // 2:
                break  # the client disconnects half-way
        stream.close()
        writer.join()
        for batch_id in range(15, 30):
            write_batch(changelog, batch_id, BATCHES[batch_id])
        with client.stream("SELECT * FROM t EMIT CHANGES", from_position=token) as resumed:
            for change in resumed:
                seen.append((change.key, change.row))
                if len(seen) == len(committed_changes(BATCHES[1:])):
                    break
    truth = committed_changes(BATCHES[1:])
    assert sorted(map(repr, seen)) == sorted(map(repr, truth))  # nothing lost, nothing repeated
    assert by_key(seen) == by_key(truth)  # in commit order per key


def test_snapshot_then_changes_with_a_filter_as_ndjson(cluster: Any) -> None:
    nodes, changelog = cluster
    body = orjson.dumps({"sql": "SELECT k, n FROM t WHERE n >= 10 EMIT CHANGES", "snapshot": True})
    headers = {"authorization": "Bearer tok"}
    lines = []
    with httpx.stream("POST", f"{nodes[0].url}/query", content=body, headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/x-ndjson"
        write_batch(changelog, 1, {"k05": 7, "k06": 1000})
        for line in r.iter_lines():
            if line:
                lines.append(orjson.loads(line))
            if any(doc["key"] == "k06" and doc["row"] == {"k": "k06", "n": 1000} for doc in lines):
                break
    snapshot = {k: n for k, n in BATCHES[0].items() if n is not None and n >= 10}
    first = {doc["key"]: doc["row"]["n"] for doc in lines[: len(snapshot)]}
    assert first == snapshot
    assert all(doc["position"].startswith("p1.") for doc in lines)


def test_bad_push_statements_are_400_and_unauthenticated_is_401(cluster: Any) -> None:
    nodes, _ = cluster
    with Client(nodes[0].url, token="tok") as client:
        with pytest.raises(InvalidQueryError):
            client.stream("SELECT * FROM t GROUP BY k EMIT CHANGES")
        with pytest.raises(SparkiqError):
            client.stream("SELECT * FROM nope EMIT CHANGES")
    response = httpx.post(
        f"{nodes[0].url}/query", content=orjson.dumps({"sql": "SELECT * FROM t EMIT CHANGES"})
    )
    assert response.status_code == 401


def test_a_disconnected_subscriber_is_closed_on_the_node(cluster: Any) -> None:
    nodes, changelog = cluster
    node = nodes[0]
    with Client(node.url, token="tok") as client:
        for _ in range(3):
            stream = client.stream("SELECT * FROM t EMIT CHANGES")
            write_batch(changelog, changelog.committed_batch_ids()[-1] + 1, {"k01": 1})
            next(stream)
            stream.close()
    hub = node._hub
    deadline = time.monotonic() + 10
    while hub.subscriptions() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub.subscriptions() == {}  # no subscription (nor its thread) outlives its client
