"""Push queries over HTTP: ``POST /query`` with ``... EMIT CHANGES`` streams NDJSON, and
``Client.stream`` resumes after a disconnect without losing or repeating changes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from sparkiq import Client, Position, SqlResult
from sparkiq.errors import InvalidQueryError, SparkiqError
from sparkiq.sql.change import Change
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import start_http_cluster
from tests.sql.push_spellings import PULL, PUSH, spell

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
    headers = {"authorization": "Bearer tok", "content-type": "application/json"}
    lines = []
    with http_calls.stream("POST", f"{nodes[0].url}/query", content=body, headers=headers) as r:
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
    response = http_calls.post(
        f"{nodes[0].url}/query",
        content=orjson.dumps({"sql": "SELECT * FROM t EMIT CHANGES"}),
        headers={"content-type": "application/json"},
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


def test_post_query_streams_exactly_the_push_spellings(cluster: Any) -> None:
    nodes, _ = cluster
    headers = {"authorization": "Bearer tok", "content-type": "application/json"}
    for template, push in [(t, True) for t in PUSH] + [(t, False) for t in PULL]:
        body = orjson.dumps({"sql": spell(template, "k, n", "t")})
        with http_calls.stream("POST", f"{nodes[0].url}/query", content=body, headers=headers) as r:
            assert r.status_code == 200, (template, r.read())
            kind = r.headers["content-type"]
            assert kind == ("application/x-ndjson" if push else "application/json"), template
            if not push:
                assert orjson.loads(r.read())["columns"][:2] == ["k", "n"]


def take(changes: Any, count: int) -> list[Change]:
    out = []
    for change in changes:
        out.append(change)
        if len(out) == count:
            break
    return out


def test_a_client_change_is_the_in_process_change(cluster: Any) -> None:
    nodes, changelog = cluster
    statement = "SELECT k, n FROM t WHERE n >= 10 EMIT CHANGES"
    snapshot = sum(1 for n in BATCHES[0].values() if n is not None and n >= 10)
    with (
        Client(nodes[1].url, token="tok") as client,
        client.stream(statement, snapshot=True) as remote,
        nodes[0].stream(statement, snapshot=True) as local,
    ):
        first_remote, first_local = take(remote, snapshot), take(local, snapshot)
        write_batch(changelog, 1, {"k05": 7, "k06": 1000, "k07": None})
        live = 1 + sum(1 for k in ("k05", "k07") if (BATCHES[0].get(k) or 0) >= 10)
        got_remote, got_local = take(remote, live), take(local, live)
    for got, want in [(first_remote, first_local), (got_remote, got_local)]:
        assert all(type(change) is Change for change in got)
        assert got == want  # key, row, batch_id, snapshot and position alike
        assert [c.position.to_token() for c in got] == [c.position.to_token() for c in want]
    assert {c.snapshot for c in first_remote} == {True}
    assert {c.batch_id for c in first_remote} == {0}
    assert {c.snapshot for c in got_remote} == {False}
    assert {c.batch_id for c in got_remote} == {1}
    assert ("k06", {"k": "k06", "n": 1000}) in [(c.key, c.row) for c in got_remote]
    assert set(got_remote[-1].position.partition_offsets("push:t")) == {1}  # within batch 1


def test_client_sql_answers_are_sql_results_like_in_process(cluster: Any) -> None:
    nodes, _ = cluster
    with Client(nodes[1].url, token="tok") as client:
        for text in [
            "SELECT k, n FROM t WHERE k = 'k01'",
            "EXPLAIN SELECT * FROM t WHERE k = 'k01'",
        ]:
            remote, local = client.sql(text), nodes[0].sql(text)
            assert type(remote) is SqlResult
            assert remote.columns == local.columns
            assert remote.rows == local.rows
            assert remote.explain == local.explain
            assert remote.next_page_token == local.next_page_token
            assert isinstance(remote.position, Position)
        assert remote.explain is not None
        assert remote.tuples() == local.tuples()
