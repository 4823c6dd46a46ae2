"""Bounds in Kafka offsets (a producer's acknowledgements) on every read path of a node.

The table's commit records carry ``kafka:orders`` end offsets, as the sink writes them for a
Kafka source; a bound made with ``PositionBound.after`` is met by the first batch that read
past the record: in process, through the REST API (``"after"``, for key requests and SQL),
the Postgres endpoint (``SET sparkiq.after``), and with the writer committing that batch
only while the read waits. The same with a real broker and pipeline is in
tests/kafka/test_read_your_writes.py.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sparkiq import (
    Client,
    FailureReason,
    InvalidQueryError,
    KeyQuery,
    Node,
    Position,
    PositionBound,
    RangeQuery,
    StateQueryRequest,
)
from sparkiq.changelog import Changelog
from sparkiq.sql.errors import SqlPartitionError
from tests.changelog.helpers import make_table, write_batch

PARTITIONS = 4
KEYS = [f"k{i}" for i in range(12)]
# Batch b sets every key to b * 100 + i and has read orders' partitions up to these offsets.
OFFSETS = [{0: 2, 1: 1}, {0: 4, 1: 3}, {0: 6, 1: 3}]


def commit(changelog: Changelog, batch_id: int) -> None:
    rows: dict[str, int | None] = {k: batch_id * 100 + i for i, k in enumerate(KEYS)}
    write_batch(changelog, batch_id, rows, position={"kafka:orders": OFFSETS[batch_id]})


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Node, Changelog]]:
    changelog = make_table(str(tmp_path), partitions=PARTITIONS)
    commit(changelog, 0)
    with Node(
        str(tmp_path), poll_interval=0.01, listen="127.0.0.1:0", pg_listen="127.0.0.1:0"
    ) as node:
        assert node.wait_for("t", 0, timeout=30)
        commit(changelog, 1)  # seen by the running node: it remembers both batches' offsets
        assert node.wait_for("t", 1, timeout=30)
        node.source_wait = 1.0
        yield node, changelog


def commit_later(changelog: Changelog, batch_id: int, delay: float = 0.3) -> threading.Thread:
    """The writer committing ``batch_id`` while a read waits for it."""
    thread = threading.Thread(target=lambda: (time.sleep(delay), commit(changelog, batch_id)))
    thread.start()
    return thread


def every_row(bound: PositionBound) -> StateQueryRequest:
    return (
        StateQueryRequest.in_store("t")
        .with_query(RangeQuery.with_no_bounds())
        .with_position_bound(bound)
    )


def values(node: Node, bound: PositionBound) -> set[int]:
    """The batches the rows of an all-partition read come from (n // 100)."""
    result = node.query(every_row(bound))
    out = set()
    for answer in result.partition_results.values():
        assert answer.is_success, answer
        out.update(row["n"] // 100 for _, row in answer.result)
    return out


def test_a_record_already_read_is_met_at_once(world: tuple[Node, Changelog]) -> None:
    node, _ = world
    started = time.monotonic()
    assert values(node, PositionBound.after("orders", 0, 3)) == {1}
    one = node.query(
        StateQueryRequest.in_store("t")
        .with_query(KeyQuery.with_key("k3"))
        .with_position_bound(PositionBound.after("orders", 1, 0))
    )
    assert one.only_partition_result().result["n"] in (3, 103)
    assert time.monotonic() - started < node.source_wait  # nothing was waited for


def test_the_first_batch_that_read_the_record_is_the_floor(
    world: tuple[Node, Changelog],
) -> None:
    """Batch 0 read orders[0] up to offset 2, so a bound after offset 1 asks for batch 0
    and one after offset 2 for batch 1: what a read pinned to a batch may go down to."""
    node, _ = world
    for offset, batch in ((1, 0), (2, 1), (3, 1)):
        resolved = node._lookup.sources.resolve("t", PositionBound.after("orders", 0, offset), 0)
        assert isinstance(resolved, PositionBound)
        assert resolved.position is not None
        assert resolved.position.partition_offsets("t") == {0: batch}


def test_a_record_not_read_yet_is_waited_for(world: tuple[Node, Changelog]) -> None:
    node, changelog = world
    writer = commit_later(changelog, 2)
    assert values(node, PositionBound.after("orders", 0, 5)) == {2}
    writer.join()


def test_a_record_never_read_is_named_behind_after_the_wait(
    world: tuple[Node, Changelog],
) -> None:
    node, _ = world
    node.source_wait = 0.3
    started = time.monotonic()
    result = node.query(every_row(PositionBound.after(("orders", 0, 9), ("orders", 2, 0))))
    assert time.monotonic() - started >= 0.3
    for answer in result.partition_results.values():
        assert answer.failure_reason is FailureReason.NOT_UP_TO_BOUND
        message = answer.failure_message or ""
        assert "partition 0 of topic 'orders' is read up to offset 4" in message
        assert "waits for offset 9 (6 records behind)" in message
        assert "partition 2 of topic 'orders' was not read yet" in message
    with pytest.raises(SqlPartitionError, match="NOT_UP_TO_BOUND"):
        node.sql("SELECT sum(n) FROM t", bound=PositionBound.after("orders", 1, 3))


def test_a_topic_the_table_does_not_read_is_refused(world: tuple[Node, Changelog]) -> None:
    node, _ = world
    with pytest.raises(InvalidQueryError, match=r"'payments'.*it reads 'orders'"):
        node.query(every_row(PositionBound.after("payments", 0, 1)))
    # a token merged from reads of several tables constrains each by what it reads only
    merged = Position.from_map({"t": {0: 1}, "kafka:payments": {0: 99}})
    assert values(node, PositionBound.at(merged)) == {1}


# -- the REST API and the Postgres endpoint ------------------------------------------------


def post(node: Node, path: str, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{node.url}{path}",
        json.dumps(doc).encode(),
        {"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_rest_reads_wait_for_the_records_named_in_after(world: tuple[Node, Changelog]) -> None:
    node, changelog = world
    writer = commit_later(changelog, 2)
    after = [{"topic": "orders", "partition": 0, "offset": 5}]
    status, doc = post(
        node, "/stores/t/query", {"query": {"type": "key", "key": "k1"}, "after": after}
    )
    writer.join()
    assert status == 200, doc
    assert [p["result"]["n"] for p in doc["partitions"].values()] == [201]
    status, doc = post(node, "/query", {"sql": "SELECT min(n) AS low FROM t", "after": after})
    assert status == 200, doc
    assert doc["rows"] == [{"low": 200}]
    with Client(node.url, bound_wait=0.0) as client:
        answer = client.sql(
            "SELECT min(n) AS low FROM t", bound=PositionBound.after("orders", 0, 5)
        )
        assert answer.rows == [{"low": 200}]


@pytest.mark.parametrize(
    ("after", "words"),
    [
        ([], "the records sent"),
        ([{"topic": "orders", "partition": 0}], "the records sent"),
        ([{"topic": "orders", "partition": 0, "offset": -1}], "has no offset"),
        ("orders:0:1", "the records sent"),
    ],
)
def test_rest_refuses_a_malformed_after(
    world: tuple[Node, Changelog], after: Any, words: str
) -> None:
    node, _ = world
    for path, doc in (
        ("/stores/t/query", {"query": {"type": "range"}, "after": after}),
        ("/query", {"sql": "SELECT 1 FROM t", "after": after}),
    ):
        status, answer = post(node, path, doc)
        assert status == 400, answer
        error = answer["error"]
        assert error["field"].startswith("after") and words in error["message"], answer


def test_postgres_sessions_bound_their_reads_with_sparkiq_after(
    world: tuple[Node, Changelog],
) -> None:
    node, changelog = world
    assert node.pg_address is not None
    host, port = node.pg_address
    with psycopg.connect(f"host={host} port={port} user=u dbname=sparkiq", autocommit=True) as c:
        c.execute("SET sparkiq.after = 'orders:0:5'")
        writer = commit_later(changelog, 2)
        assert c.execute("SELECT min(n) FROM t").fetchone() == (200,)
        writer.join()
        c.execute("SET sparkiq.after = 'orders:0:9'")
        with pytest.raises(psycopg.errors.CannotConnectNow, match="offset 9"):
            c.execute("SELECT min(n) FROM t")
        c.execute("RESET sparkiq.after")
        assert c.execute("SELECT min(n) FROM t").fetchone() == (200,)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="topic:partition:offset"):
            c.execute("SET sparkiq.after = 'orders-0-5'")
        with pytest.raises(psycopg.Error, match=r"sparkiq\.after"):
            c.execute("SET sparkiq.afterr = 'orders:0:5'")
        token = PositionBound.after("orders", 1, 2).position.to_token()  # type: ignore[union-attr]
        c.execute(f"SET sparkiq.bound = '{token}'")
        assert c.execute("SELECT min(n) FROM t").fetchone() == (200,)


def test_a_push_query_takes_no_bound(world: tuple[Node, Changelog]) -> None:
    node, _ = world
    after = [{"topic": "orders", "partition": 0, "offset": 1}]
    status, answer = post(node, "/query", {"sql": "SELECT * FROM t EMIT CHANGES", "after": after})
    assert status == 400 and answer["error"]["field"] == "after", answer
    assert "'from'" in answer["error"]["message"]


def test_source_wait_is_a_node_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_table(str(tmp_path), partitions=PARTITIONS)
    monkeypatch.setenv("SPARKIQ_SOURCE_WAIT", "2.5")
    assert Node(str(tmp_path)).source_wait == 2.5
    assert Node(str(tmp_path), source_wait=0).source_wait == 0
    with pytest.raises(ValueError, match="source_wait must be 0 to 3600 seconds"):
        Node(str(tmp_path), source_wait=-1)


def test_a_read_as_of_a_batch_before_the_producers_records_is_refused(
    world: tuple[Node, Changelog],
) -> None:
    node, _ = world
    past = every_row(PositionBound.after("orders", 0, 3)).as_of(0)  # batch 1 read offset 3
    with pytest.raises(InvalidQueryError, match="as of batch 0 but its bound asks for batch 1"):
        node.query(past)
    assert values(node, PositionBound.after("orders", 0, 1)) == {1}  # batch 0 read it too
    assert node.query(every_row(PositionBound.after("orders", 0, 1)).as_of(0)).position
