"""A node over a hand-written changelog: applying, resuming, ranges and failure values."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sparkiq import (
    FailureReason,
    KeyQuery,
    Node,
    Position,
    PositionBound,
    Query,
    QueryContext,
    QueryResult,
    RangeQuery,
    ResultOrder,
    StateQueryRequest,
    register,
)
from sparkiq.errors import ConfigError, InvalidQueryError, UnknownStoreError
from sparkiq.stores.partition import PartitionStore
from tests.changelog.helpers import expected_rows, make_table, write_batch

HISTORY: list[dict[str, int | None]] = [
    {f"k{i:03d}": i for i in range(100)},
    {f"k{i:03d}": i * 10 for i in range(0, 100, 3)},
    {f"k{i:03d}": None for i in range(0, 100, 7)} | {"new": 1},
]


@pytest.fixture(params=["rocksdb", "memory"])
def node(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Any:
    changelog = make_table(str(tmp_path))
    for batch_id, rows in enumerate(HISTORY):
        write_batch(changelog, batch_id, rows)
    with Node(str(tmp_path), store=request.param) as started:
        started.poll_once()
        yield started


def all_rows(node: Node, query: Query) -> list[tuple[Any, dict[str, Any]]]:
    result = node.query(StateQueryRequest.in_store("t").with_query(query))
    rows: list[tuple[Any, dict[str, Any]]] = []
    for partition_result in result.partition_results.values():
        assert partition_result.is_success, partition_result
        rows.extend(partition_result.result)
    return rows


def test_every_key_equals_the_ground_truth(node: Node) -> None:
    expected = expected_rows(HISTORY)
    for i in range(100):
        key = f"k{i:03d}"
        assert node.get("t", key) == expected.get(key)
        result = node.query(StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(key)))
        only = result.only_partition_result()
        assert only.result == expected.get(key)
        assert only.position.partition_offsets("t") == {node.partition_for_key("t", key): 2}
    assert node.get("t", "absent") is None


def test_ranges_equal_the_ground_truth(node: Node) -> None:
    expected = expected_rows(HISTORY)
    got = sorted(all_rows(node, RangeQuery.with_range("k010", "k050")))
    assert got == sorted((k, v) for k, v in expected.items() if "k010" <= k <= "k050")
    assert sorted(all_rows(node, RangeQuery.with_no_bounds())) == sorted(expected.items())
    assert sorted(all_rows(node, RangeQuery.with_lower_bound("k090"))) == sorted(
        (k, v) for k, v in expected.items() if k >= "k090"
    )
    per_partition = node.query(
        StateQueryRequest.in_store("t").with_query(
            RangeQuery.with_upper_bound("k020").with_result_order(ResultOrder.DESCENDING)
        )
    )
    for result in per_partition.partition_results.values():
        keys = [k for k, _ in result.result]
        assert keys == sorted(keys, reverse=True)
        assert all(k <= "k020" for k in keys)


def test_partition_failures_are_values(tmp_path: os.PathLike[str]) -> None:
    changelog = make_table(str(tmp_path), partitions=4)
    write_batch(changelog, 0, {"a": 1, "b": 2})
    with Node(str(tmp_path), store="memory", partitions={"t": [0, 1]}) as node:
        node.poll_once()
        result = node.query(
            StateQueryRequest.in_store("t")
            .with_query(RangeQuery.with_no_bounds())
            .with_partitions([0, 2, 9])
        )
        assert result.partition_results[0].is_success
        not_present = result.partition_results[2]
        assert not_present.failure_reason is FailureReason.NOT_PRESENT
        assert "not hosted" in (not_present.failure_message or "")
        missing = result.partition_results[9]
        assert missing.failure_reason is FailureReason.DOES_NOT_EXIST
        assert "0..3" in (missing.failure_message or "")


def test_a_bound_beyond_the_replica_fails_that_partition_only(node: Node) -> None:
    bound = PositionBound.at(Position.from_map({"t": {0: 2}}))
    ok = node.query(
        StateQueryRequest.in_store("t")
        .with_query(RangeQuery.with_no_bounds())
        .with_position_bound(bound)
    )
    assert all(r.is_success for r in ok.partition_results.values())
    for r in ok.partition_results.values():
        list(r.result)
    future = PositionBound.at(Position.from_map({"t": {0: 3}}))
    behind = node.query(
        StateQueryRequest.in_store("t")
        .with_query(KeyQuery.with_key("k001"))
        .with_position_bound(future)
    ).only_partition_result()
    assert behind.failure_reason is FailureReason.NOT_UP_TO_BOUND
    assert "retry" in (behind.failure_message or "")


def test_unknown_store_and_bad_keys_raise_clear_errors(node: Node) -> None:
    with pytest.raises(UnknownStoreError, match=r"'nope'.*serves \['t'\]"):
        node.get("nope", "a")
    with pytest.raises(InvalidQueryError, match="key column 'k' is string"):
        node.get("t", 5)
    with pytest.raises(InvalidQueryError):
        node.query(StateQueryRequest.in_store("t").with_query(RangeQuery.with_range(1, 2)))


class CountQuery(Query):
    """Counts the rows of a partition: an example of a user-defined query type."""

    __slots__ = ()


class UnhandledQuery(Query):
    __slots__ = ()


@register(CountQuery)
def _count(store: PartitionStore, query: CountQuery, ctx: QueryContext) -> QueryResult[int]:
    iterator, position = store.scan(None, None)
    with iterator:
        return QueryResult.for_result(sum(1 for _ in iterator), position)


def test_custom_query_types_dispatch_through_the_registry(node: Node) -> None:
    result = node.query(StateQueryRequest.in_store("t").with_query(CountQuery()))
    assert sum(r.result for r in result.partition_results.values()) == len(expected_rows(HISTORY))
    unknown = node.query(StateQueryRequest.in_store("t").with_query(UnhandledQuery()))
    for r in unknown.partition_results.values():
        assert r.failure_reason is FailureReason.UNKNOWN_QUERY_TYPE
        assert "UnhandledQuery" in (r.failure_message or "")


def test_store_failure_is_a_store_exception_value(tmp_path: os.PathLike[str]) -> None:
    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, {"a": 1})
    node = Node(str(tmp_path)).start()
    node.poll_once()
    partition = node.partition_for_key("t", "a")
    node.replica("t").partitions[partition].store.store.close()  # the disk went away
    result = node.query(StateQueryRequest.in_store("t").with_query(KeyQuery.with_key("a")))
    failure = result.only_partition_result()
    assert failure.failure_reason is FailureReason.STORE_EXCEPTION
    assert "closed" in (failure.failure_message or "")
    node.stop()


def test_execution_info_names_the_partition_and_handler(node: Node) -> None:
    result = node.query(
        StateQueryRequest.in_store("t")
        .with_query(KeyQuery.with_key("k001"))
        .enable_execution_info()
    ).only_partition_result()
    assert len(result.execution_info) == 1 and "KeyQuery on t[" in result.execution_info[0]


def test_restart_resumes_from_local_files(tmp_path: os.PathLike[str]) -> None:
    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, HISTORY[0])
    with Node(str(tmp_path)) as node:
        node.poll_once()
    write_batch(changelog, 1, HISTORY[1])
    write_batch(changelog, 2, HISTORY[2])
    node = Node(str(tmp_path))
    node.refresh_tables()
    # Before any poll, the local files already hold batch 0 for every partition.
    assert {s.batch_id for s in node.status()} == {0}
    applied = node.poll_once()
    assert applied == 2 * 4  # two new batches on four partitions, nothing re-applied
    expected = expected_rows(HISTORY)
    assert all(node.get("t", k) == v for k, v in expected.items())
    node.stop()


def test_a_corrupted_segment_stops_only_its_partition(tmp_path: os.PathLike[str]) -> None:
    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, HISTORY[0])
    record = write_batch(changelog, 1, HISTORY[1])
    write_batch(changelog, 2, HISTORY[2])
    bad = sorted(record.segments)[0]
    path = changelog.segment_path(bad, 1)
    data = bytearray(Path(path).read_bytes())
    data[-30] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    with Node(str(tmp_path), store="memory") as node:
        node.poll_once()
        status = {s.partition: s for s in node.status()}
        assert status[bad].batch_id == 0 and not status[bad].healthy
        assert path in (status[bad].error or "")
        assert all(s.batch_id == 2 and s.healthy for p, s in status.items() if p != bad)
        # The stuck partition answers only unbounded queries, at its true position.
        bound = PositionBound.at(Position.from_map({"t": {0: 2}}))
        result = node.query(
            StateQueryRequest.in_store("t")
            .with_query(RangeQuery.with_no_bounds())
            .with_position_bound(bound)
        )
        assert result.partition_results[bad].failure_reason is FailureReason.NOT_UP_TO_BOUND
        assert all(r.is_success for p, r in result.partition_results.items() if p != bad)


def test_poll_once_while_the_tailer_runs_applies_everything_once(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=8)
    for batch_id in range(40):
        write_batch(changelog, batch_id, {f"k{i}": batch_id for i in range(200)})
    for attempt in range(5):
        local = tmp_path / f"local-{attempt}"
        with Node(str(tmp_path), local_dir=str(local), poll_interval=0.001) as node:
            node.poll_once()  # races the background tailer started by the context manager
            status = node.status()
            assert all(s.batch_id == 39 and s.healthy for s in status), status
            assert node.get("t", "k7") == {"k": "k7", "n": 39}


def test_a_dropped_or_recreated_table_is_released(tmp_path: Path) -> None:
    from sparkiq.changelog import Changelog

    changelog = make_table(str(tmp_path), name="gone")
    write_batch(changelog, 0, {"a": 1})
    keep = make_table(str(tmp_path), name="kept")
    write_batch(keep, 0, {"a": 2})
    with Node(str(tmp_path)) as node:
        node.poll_once()
        assert node.get("gone", "a") == {"k": "a", "n": 1}
        Changelog(str(tmp_path), "gone").storage.delete_dir(changelog.root)
        node.refresh_tables()
        assert node.tables == ["kept"]
        with pytest.raises(UnknownStoreError):
            node.get("gone", "a")
        recreated = make_table(str(tmp_path), name="gone")  # same name, new incarnation
        write_batch(recreated, 0, {"b": 5})
        node.refresh_tables()
        node.poll_once()
        assert node.get("gone", "a") is None  # nothing of the old table survives
        assert node.get("gone", "b") == {"k": "b", "n": 5}
        assert node.get("kept", "a") == {"k": "a", "n": 2}


def test_a_released_table_leaves_the_list_only_once_its_files_are_closed(tmp_path: Path) -> None:
    """``DROP TABLE ... DELETE CHANGELOG`` removes a replica's directory as soon as the node
    no longer lists the table; the node's own refresh may be the one releasing it. If the
    table left the list before RocksDB had closed, the closing store flushed into a directory
    being deleted: the close failed and left files behind (a CI failure of test_sql_ddl)."""
    import shutil
    import threading

    from sparkiq.changelog import Changelog

    changelog = make_table(str(tmp_path), name="gone", partitions=8)
    for batch_id in range(3):
        write_batch(changelog, batch_id, {f"k{i}": batch_id for i in range(2000)})
    local = tmp_path / "local"
    node = Node(str(tmp_path), local_dir=str(local))
    node.refresh_tables()
    node.poll_once()
    assert node.tables == ["gone"] and (local / "gone").is_dir()
    removed: list[BaseException | None] = []

    def remove_once_unlisted() -> None:  # what App._drop_table does after DELETE CHANGELOG
        while "gone" in node.tables:
            pass
        try:
            shutil.rmtree(local / "gone")
            removed.append(None)
        except BaseException as exc:  # reported below, with the node's own outcome
            removed.append(exc)

    watcher = threading.Thread(target=remove_once_unlisted)
    watcher.start()
    Changelog(str(tmp_path), "gone").storage.delete_dir(changelog.root)
    try:
        node.refresh_tables()  # raised a StoreError when the directory went first
    finally:
        watcher.join(timeout=30)
        node.stop()
    assert removed == [None]
    assert not (local / "gone").exists()


def test_settings_come_from_arguments_then_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_table(str(tmp_path))
    monkeypatch.setenv("SPARKIQ_LISTEN", "127.0.0.1:0")
    monkeypatch.setenv("SPARKIQ_NODE_ID", "env-node")
    monkeypatch.setenv("SPARKIQ_STANDBYS", "2")
    from_env = Node(str(tmp_path))
    assert (from_env.clustered, from_env.node_id, from_env.standbys) == (True, "env-node", 2)
    explicit = Node(str(tmp_path), node_id="mine", listen=None, peers=None, standbys=0)
    assert (explicit.clustered, explicit.node_id, explicit.standbys) == (False, "mine", 0)
    monkeypatch.setenv("SPARKIQ_STANDBYS", "two")
    with pytest.raises(ConfigError, match="standbys must be an int"):
        Node(str(tmp_path))
