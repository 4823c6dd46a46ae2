"""Snapshots and retention: restores skip history, retention bounds the changelog, and a
replica that fell behind retention re-bootstraps instead of serving partial data."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from sparkiq import FailureReason, Node, Position, PositionBound, RangeQuery, StateQueryRequest
from sparkiq.changelog import Changelog
from sparkiq.changelog.retention import apply_retention
from sparkiq.changelog.snapshot import (
    data_path,
    descriptor_path,
    latest_snapshot,
    list_snapshots,
    write_snapshot,
)
from tests.changelog.helpers import expected_rows, make_table, write_batch


def random_history(batches: int, keys: int = 60, seed: int = 5) -> list[dict[str, int | None]]:
    rng = random.Random(seed)
    history = []
    for _ in range(batches):
        batch: dict[str, int | None] = {}
        for _ in range(rng.randrange(1, 25)):
            batch[f"k{rng.randrange(keys):03d}"] = (
                None if rng.random() < 0.2 else rng.randrange(1000)
            )
        history.append(batch)
    return history


def build(state: Path, history: list[dict[str, int | None]], partitions: int = 4) -> Changelog:
    changelog = make_table(str(state), partitions=partitions)
    for batch_id, rows in enumerate(history):
        write_batch(changelog, batch_id, rows)
    return changelog


def snapshot_all(changelog: Changelog, batch_id: int) -> None:
    for partition in range(changelog.manifest().partitions):
        write_snapshot(changelog, partition, batch_id)


def node_rows(state: Path, **options: object) -> tuple[dict[str, dict[str, object]], Node]:
    store = "rocksdb" if "local_dir" in options else "memory"
    node = Node(str(state), store=store, **options)  # type: ignore[arg-type]
    node.refresh_tables()
    node.poll_once()
    scan = node.query(StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds()))
    rows = {k: v for r in scan.partition_results.values() if r.is_success for k, v in r.result}
    return rows, node


def test_a_snapshot_holds_exactly_the_partition_state(tmp_path: Path) -> None:
    history = random_history(30)
    changelog = build(tmp_path, history)
    snapshot_all(changelog, 17)
    truth = expected_rows(history[:18])
    seen: dict[bytes, bytes] = {}
    for partition in range(4):
        found = latest_snapshot(changelog, partition)
        assert found is not None
        info, keys, values = found
        assert info.batch_id == 17 and info.rows == len(keys)
        assert keys == sorted(keys)
        seen.update(zip(keys, values, strict=True))
    assert len(seen) == len(truth)
    # Building on the previous snapshot gives the same bytes as building from scratch.
    write_snapshot(changelog, 0, 29)
    incremental = Path(data_path(changelog, 0, 29)).read_bytes()
    fresh = build(tmp_path / "fresh", history)
    write_snapshot(fresh, 0, 29)
    assert Path(data_path(fresh, 0, 29)).read_bytes() == incremental


def test_restore_uses_the_snapshot_then_tails(tmp_path: Path) -> None:
    history = random_history(30)
    changelog = build(tmp_path, history)
    snapshot_all(changelog, 19)
    for partition in range(4):  # prove the history before the snapshot is not read
        for batch_id in range(20):
            Path(changelog.segment_path(partition, batch_id)).unlink(missing_ok=True)
    rows, node = node_rows(tmp_path)
    assert rows == expected_rows(history)
    assert {s.batch_id for s in node.status()} == {29}
    assert all(s.state == "live" and s.restored_rows > 0 for s in node.status())
    node.stop()


def test_retention_bounds_the_changelog_and_keeps_restores_exact(tmp_path: Path) -> None:
    history = random_history(40)
    changelog = build(tmp_path, history)
    snapshot_all(changelog, 24)
    report = apply_retention(changelog, retention_seconds=0)
    assert report.commits == 25 and report.segments > 0
    assert changelog.committed_batch_ids() == list(range(25, 40))
    rows, node = node_rows(tmp_path)
    assert rows == expected_rows(history)
    node.stop()
    # Nothing younger than the retention period is deleted.
    snapshot_all(changelog, 39)
    assert apply_retention(changelog, retention_seconds=3600).commits == 0
    # The newest commit record always stays.
    apply_retention(changelog, retention_seconds=0)
    assert changelog.committed_batch_ids() == [39]


def test_a_replica_behind_retention_restores_from_the_snapshot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    history = random_history(50)
    changelog = build(tmp_path, history[:10])
    local = tmp_path / "local"
    with Node(str(tmp_path), local_dir=str(local)) as node:
        node.poll_once()
        assert {s.batch_id for s in node.status()} == {9}
    for batch_id in range(10, 50):
        write_batch(changelog, batch_id, history[batch_id])
    snapshot_all(changelog, 44)
    apply_retention(changelog, retention_seconds=0)
    assert not changelog.has_commit(10)
    with caplog.at_level(logging.WARNING, logger="sparkiq.replica"):
        rows, node = node_rows(tmp_path, local_dir=str(local))
    assert "fell behind retention" in caplog.text
    assert rows == expected_rows(history)
    assert all(s.healthy and s.batch_id == 49 for s in node.status())
    node.stop()


def test_truncated_or_half_written_snapshots_are_never_used(tmp_path: Path) -> None:
    history = random_history(30)
    changelog = build(tmp_path, history)
    snapshot_all(changelog, 9)
    snapshot_all(changelog, 19)
    # Newest snapshot of partition 0 truncated; of partition 1 its descriptor never written.
    newest = Path(data_path(changelog, 0, 19))
    newest.write_bytes(newest.read_bytes()[:-50])
    Path(descriptor_path(changelog, 1, 19)).unlink()
    assert [s.batch_id for s in list_snapshots(changelog, 1)] == [9]
    found = latest_snapshot(changelog, 0)
    assert found is not None and found[0].batch_id == 9
    rows, node = node_rows(tmp_path)
    assert rows == expected_rows(history)
    node.stop()


def test_a_missing_batch_no_snapshot_covers_stops_the_partition(tmp_path: Path) -> None:
    history = random_history(20)
    changelog = build(tmp_path, history)
    record = changelog.read_commit(7)
    assert record is not None
    partition = sorted(record.segments)[0]
    Path(changelog.segment_path(partition, 7)).unlink()  # still needed: no snapshot
    _rows, node = node_rows(tmp_path)
    status = {s.partition: s for s in node.status()}
    assert status[partition].state == "error" and status[partition].batch_id == 6
    assert "missing" in (status[partition].error or "")
    assert all(s.batch_id == 19 for p, s in status.items() if p != partition)
    bound = PositionBound.at(Position.from_map({"t": {0: 19}}))
    answer = node.query(
        StateQueryRequest.in_store("t")
        .with_query(RangeQuery.with_no_bounds())
        .with_position_bound(bound)
    )
    assert answer.partition_results[partition].failure_reason is FailureReason.NOT_UP_TO_BOUND
    node.stop()


def test_commits_deleted_without_any_snapshot_are_reported(tmp_path: Path) -> None:
    history = random_history(10)
    changelog = build(tmp_path, history)
    for batch_id in range(3):
        Path(changelog.commit_path(batch_id)).unlink()
    rows, node = node_rows(tmp_path)
    assert rows == {}
    errors = {s.error for s in node.status()}
    assert len(errors) == 1 and "no snapshot covers it" in (errors.pop() or "")
    node.stop()


def test_a_thousand_batches_keep_the_changelog_bounded(tmp_path: Path) -> None:
    history = random_history(1000, keys=200, seed=9)
    changelog = make_table(str(tmp_path), partitions=4)
    table_dir = tmp_path / "tables" / "t"
    sizes = []
    for batch_id, rows in enumerate(history):
        write_batch(changelog, batch_id, rows)
        if batch_id % 50 == 49:
            snapshot_all(changelog, batch_id)
            apply_retention(changelog, retention_seconds=0)
            sizes.append(sum(f.stat().st_size for f in table_dir.rglob("*") if f.is_file()))
    snapshot_bytes = sum(Path(data_path(changelog, p, 999)).stat().st_size for p in range(4))
    # Two snapshot generations plus at most one snapshot interval of history.
    assert max(sizes[4:]) < 4 * snapshot_bytes + 60_000
    assert max(sizes[4:]) < 1.5 * min(sizes[4:])
    rows, node = node_rows(tmp_path)
    assert rows == expected_rows(history)
    node.stop()
