"""Versioned key queries on a node and across a routed cluster, against a plain-Python model
of every key's history (tests/cluster/versioned_history.py): ``VersionedKeyQuery`` at every
retained batch and at times between commits, ``MultiVersionedKeyQuery`` over batch and time
ranges in both orders, a node restarted mid-history, and the failure paths."""

from __future__ import annotations

import datetime as dt
import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkiq import (
    FailureReason,
    KeyQuery,
    MultiVersionedKeyQuery,
    Node,
    StateQueryRequest,
    VersionedKeyQuery,
    VersionedRecord,
)
from sparkiq.changelog import Changelog
from sparkiq.changelog.snapshot import write_snapshot
from sparkiq.errors import InvalidQueryError
from sparkiq.stores.history import History
from sparkiq.testing import write_table
from tests.cluster.cluster_helpers import start_local_cluster, wait_until
from tests.cluster.versioned_history import KEYS, Model, make_history_table
from tests.sql.tables import WIN_ARROW

WINDOW = 6  # batches of history kept besides the newest


def ask(node: Node, query: Any, **request: Any) -> Any:
    req = StateQueryRequest.in_store("t").with_query(query)
    if "as_of" in request:
        req = req.as_of(request["as_of"])
    result = node.query(req).only_partition_result()
    assert result.is_success, result
    return result.result


def failure(node: Node, query: Any) -> tuple[FailureReason | None, str]:
    result = node.query(StateQueryRequest.in_store("t").with_query(query)).only_partition_result()
    assert result.is_failure, result
    return result.failure_reason, result.failure_message or ""


@pytest.fixture
def written(tmp_path: Path) -> tuple[str, Model]:
    changelog = make_history_table(str(tmp_path), History(batches=WINDOW))
    model = Model()
    model.write_random(changelog, 14, random.Random(11))
    return str(tmp_path), model


@pytest.fixture(params=["rocksdb", "memory"])
def node(request: pytest.FixtureRequest, written: tuple[str, Model]) -> Iterator[Node]:
    with Node(written[0], store=request.param) as started:
        started.poll_once()
        yield started


def check_against_model(node: Node, model: Model, oldest: int) -> None:
    """Every key at every retained batch, at times between commits, and its whole history."""
    for key in [*KEYS, "never"]:
        assert ask(node, VersionedKeyQuery.with_key(key)) == model.version_at(
            key, oldest, model.newest
        )
        for batch_id in range(oldest, model.newest + 1):
            expected = model.version_at(key, oldest, batch_id)
            assert ask(node, VersionedKeyQuery.with_key(key).as_of(batch_id)) == expected
            assert ask(node, VersionedKeyQuery.with_key(key).as_of(model.between(batch_id))) == (
                expected
            )
            at_commit = VersionedKeyQuery.with_key(key).as_of(model.time_of(batch_id))
            assert ask(node, at_commit) == expected
        everything = model.versions(key, oldest)
        assert ask(node, MultiVersionedKeyQuery.with_key(key)) == everything
        assert (
            ask(node, MultiVersionedKeyQuery.with_key(key).with_descending_timestamps())
            == (everything[::-1])
        )


def test_every_key_at_every_retained_batch_equals_the_model(
    node: Node, written: tuple[str, Model]
) -> None:
    model = written[1]
    oldest = model.newest - WINDOW
    check_against_model(node, model, oldest)
    some = next(k for k in KEYS if len(model.versions(k, oldest)) >= 3)
    records = ask(node, MultiVersionedKeyQuery.with_key(some))
    assert all(isinstance(r, VersionedRecord) for r in records)
    assert records[-1].valid_to is None and records[-1].valid_to_time is None
    for earlier, later in itertools.pairwise(records):
        assert earlier.valid_to is not None and earlier.valid_to <= later.valid_from


def test_multi_versioned_ranges_by_batch_and_time_equal_the_model(
    node: Node, written: tuple[str, Model]
) -> None:
    model = written[1]
    oldest = model.newest - WINDOW
    rng = random.Random(5)
    for key in KEYS:
        everything = model.versions(key, oldest)
        for _ in range(6):
            low = rng.randint(oldest, model.newest)
            high = rng.randint(low, model.newest)
            overlapping = [
                r
                for r in everything
                if r.valid_from <= high and (r.valid_to is None or r.valid_to > low)
            ]
            by_batch = MultiVersionedKeyQuery.with_key(key).from_batch(low).to_batch(high)
            assert ask(node, by_batch) == overlapping
            # the same range in time: from just after batch low's commit to just after high's
            by_time = (
                MultiVersionedKeyQuery.with_key(key)
                .from_time(model.between(low))
                .to_time(model.between(high))
                .with_ascending_timestamps()
            )
            assert ask(node, by_time) == overlapping
            assert ask(node, by_time.with_descending_timestamps()) == overlapping[::-1]


def test_a_request_as_of_a_batch_reads_the_history_as_it_was_then(
    node: Node, written: tuple[str, Model]
) -> None:
    model = written[1]
    oldest = model.newest - WINDOW
    seen_at = model.newest - 3
    for key in KEYS:
        assert ask(node, VersionedKeyQuery.with_key(key), as_of=seen_at) == model.version_at(
            key, oldest, seen_at, seen_at
        )
        assert ask(node, MultiVersionedKeyQuery.with_key(key), as_of=seen_at) == model.versions(
            key, oldest, seen_at
        )
        # the query's own as_of picks the version, the request's says when it is seen from
        query = VersionedKeyQuery.with_key(key).as_of(oldest)
        assert ask(node, query, as_of=seen_at) == model.version_at(key, oldest, oldest, seen_at)


def test_a_reported_commit_time_given_back_reads_its_own_batch(
    node: Node, written: tuple[str, Model]
) -> None:
    """valid_from_time has microseconds, the commit record more digits: a record's time given
    to as_of -- the query's or the request's -- must still read that record's batch."""
    model = written[1]
    oldest = model.newest - WINDOW
    for key in KEYS:
        for record in ask(node, MultiVersionedKeyQuery.with_key(key)):
            if record.valid_from == oldest:
                continue  # clipped: its time is the oldest batch's, not the row's
            again = ask(node, VersionedKeyQuery.with_key(key).as_of(record.valid_from_time))
            assert again == record
            request = (
                StateQueryRequest.in_store("t")
                .with_query(KeyQuery.with_key(key))
                .as_of_time(record.valid_from_time)
            )
            assert node.query(request).only_partition_result().result == record.value


def test_versions_follow_new_batches(node: Node, written: tuple[str, Model]) -> None:
    state_dir, model = written
    changelog = Changelog(state_dir, "t")
    key = KEYS[0]
    for n in (100, 100, 101, None, 102):
        model.write(changelog, {key: n})
        node.poll_once()
        oldest = model.newest - WINDOW
        assert ask(node, MultiVersionedKeyQuery.with_key(key)) == model.versions(key, oldest)
        assert ask(node, VersionedKeyQuery.with_key(key)) == model.version_at(
            key, oldest, model.newest
        )


def test_a_restarted_node_clips_versions_to_the_batch_it_reopened_at(tmp_path: Path) -> None:
    changelog = make_history_table(str(tmp_path), History(batches=100))
    model = Model()
    rng = random.Random(3)
    model.write_random(changelog, 6, rng)
    with Node(str(tmp_path)) as first:
        first.poll_once()
        assert ask(first, VersionedKeyQuery.with_key(KEYS[1]).as_of(0)) == model.version_at(
            KEYS[1], 0, 0
        )
    model.write_random(changelog, 5, rng)
    with Node(str(tmp_path)) as again:  # reopens the RocksDB files at batch 5
        again.poll_once()
        # the history starts at the batch it reopened at, whose commit time is known
        check_against_model(again, model, oldest=5)
        reason, message = failure(again, VersionedKeyQuery.with_key(KEYS[1]).as_of(2))
        assert reason is FailureReason.NOT_UP_TO_BOUND
        assert "oldest batch still readable is 5" in message
        assert model.time_of(5).isoformat() in message


def test_a_node_restored_from_a_snapshot_starts_its_history_there(tmp_path: Path) -> None:
    changelog = make_history_table(str(tmp_path), History(batches=100))
    model = Model()
    model.write_random(changelog, 10, random.Random(8))
    for partition in range(4):
        write_snapshot(changelog, partition, 6)
    with Node(str(tmp_path), store="memory") as node:  # empty: restores the snapshot of 6
        node.poll_once()
        assert {s.batch_id for s in node.status()} == {model.newest}
        assert all(s.restored_rows > 0 for s in node.status() if model.states[6])
        check_against_model(node, model, oldest=6)


def test_beyond_the_history_the_failure_names_the_oldest_batch(
    node: Node, written: tuple[str, Model]
) -> None:
    model = written[1]
    oldest = model.newest - WINDOW
    key = KEYS[0]
    for query in (
        VersionedKeyQuery.with_key(key).as_of(oldest - 1),
        VersionedKeyQuery.with_key(key).as_of(model.between(oldest - 1)),
        VersionedKeyQuery.with_key(key).as_of(dt.datetime(2000, 1, 1, tzinfo=dt.UTC)),
        MultiVersionedKeyQuery.with_key(key).to_batch(oldest - 1),
        MultiVersionedKeyQuery.with_key(key).to_time(model.between(oldest - 1)),
    ):
        reason, message = failure(node, query)
        assert reason is FailureReason.NOT_UP_TO_BOUND
        assert f"the oldest batch still readable is {oldest}" in message, message
        assert "history=" in message
    # a range reaching into the window answers with what the window holds
    reaching = MultiVersionedKeyQuery.with_key(key).from_batch(0).to_batch(oldest)
    assert ask(node, reaching) == [r for r in model.versions(key, oldest) if r.valid_from <= oldest]


def test_a_batch_not_applied_yet_is_waited_for_then_refused(
    tmp_path: Path,
) -> None:
    changelog = make_history_table(str(tmp_path), History(batches=3))
    model = Model()
    model.write_random(changelog, 3, random.Random(1))
    with Node(str(tmp_path)) as node:
        node.poll_once()
        reason, message = failure(node, VersionedKeyQuery.with_key(KEYS[0]).as_of(7))
        assert reason is FailureReason.NOT_UP_TO_BOUND
        assert "has applied batch 2, behind batch 7" in message


def test_bad_arguments_are_refused_with_what_to_do(node: Node) -> None:
    with pytest.raises(TypeError, match=r"as_of\(\) takes a batch id \(int\) or a datetime"):
        VersionedKeyQuery.with_key("a").as_of("yesterday")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="as_of_batch must be a batch id"):
        VersionedKeyQuery.with_key("a").as_of(-1)
    with pytest.raises(ValueError, match="batch_from 5 is after batch_to 2"):
        MultiVersionedKeyQuery.with_key("a").from_batch(5).to_batch(2)
    with pytest.raises(ValueError, match="is after time_to"):
        MultiVersionedKeyQuery.with_key("a").from_time(dt.datetime(2024, 1, 2)).to_time(
            dt.datetime(2024, 1, 1)
        )
    with pytest.raises(TypeError, match="time_from must be a datetime"):
        MultiVersionedKeyQuery.with_key("a").from_time(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidQueryError, match=r"key column .k. is string; got int 3"):
        node.query(StateQueryRequest.in_store("t").with_query(VersionedKeyQuery.with_key(3)))


def test_a_windowed_table_is_refused(tmp_path: Path) -> None:
    write_table(str(tmp_path), "win", key="k", window="window", schema=WIN_ARROW, partitions=2)
    with Node(str(tmp_path)) as node:
        node.poll_once()
        request = StateQueryRequest.in_store("win").with_query(VersionedKeyQuery.with_key("a"))
        with pytest.raises(InvalidQueryError, match="'win' is windowed: VersionedKeyQuery"):
            node.query(request)


def test_routed_through_a_two_node_cluster_equals_the_model(
    written: tuple[str, Model],
) -> None:
    state_dir, model = written
    nodes = start_local_cluster(state_dir, 2, standbys=0)
    try:
        oldest = model.newest - WINDOW
        routed = 0
        for key in KEYS:
            partition = nodes[0].partition_for_key("t", key)
            for node in nodes:
                if partition not in node.replica("t").partitions:
                    routed += 1
                assert ask(node, VersionedKeyQuery.with_key(key).as_of(oldest + 2)) == (
                    model.version_at(key, oldest, oldest + 2)
                )
                assert ask(node, VersionedKeyQuery.with_key(key).as_of(model.between(oldest))) == (
                    model.version_at(key, oldest, oldest)
                )
                assert ask(node, MultiVersionedKeyQuery.with_key(key)) == model.versions(
                    key, oldest
                )
        assert routed == len(KEYS)  # every key was asked once of a node not hosting it
        # a new batch reaches both nodes' answers
        changelog = Changelog(state_dir, "t")
        model.write(changelog, {KEYS[0]: 999})

        def current() -> bool:
            for node in nodes:
                node.poll_once()
            expected = model.version_at(KEYS[0], model.newest - WINDOW, model.newest)
            return all(ask(n, VersionedKeyQuery.with_key(KEYS[0])) == expected for n in nodes)

        wait_until(current, 10, "both nodes answer with the new batch")
    finally:
        for node in nodes:
            node.stop()


def test_the_guides_example_runs_as_written(tmp_path: Path) -> None:
    """docs/guide.md's versioned key query example, on a node hosting its table."""
    import re

    import pyarrow as pa

    from sparkiq import StateQueryRequest as Request

    text = (Path(__file__).resolve().parents[2] / "docs" / "guide.md").read_text()
    section = text[text.index("## Versioned key queries") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the guide's versioned section has a python example"
    schema = pa.schema([("product", pa.string()), ("revenue", pa.float64())])
    for batch_id in range(16):  # p-17 changes every fifth batch
        rows = [{"product": "p-17", "revenue": float(batch_id // 5)}]
        write_table(str(tmp_path), "revenue_by_product", rows, key="product", schema=schema)
    with Node(str(tmp_path)) as node:
        node.poll_once()
        namespace: dict[str, Any] = {"app": node, "StateQueryRequest": Request}
        exec(compile(match.group(1), "guide.md", "exec"), namespace)
        record = namespace["now"].only_partition_result().result
        assert (record.value, record.valid_from, record.valid_to) == (
            {"product": "p-17", "revenue": 3.0},
            15,
            None,
        )
        newest_first = namespace["history"].only_partition_result().result
        assert [(r.valid_from, r.valid_to) for r in newest_first] == [
            (15, None),
            (10, 15),
            (5, 10),
            (0, 5),
        ]
