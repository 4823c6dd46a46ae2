"""Followers over a hand-written changelog: subsets equal the ground truth restricted to them
after every batch, writes are refused, the owner's files are never touched, restarts resume."""

from __future__ import annotations

import datetime as dt
import functools
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import sparkiq
from sparkiq import (
    ConfigError,
    FailureReason,
    KeyQuery,
    Position,
    RangeQuery,
    ReadOnlyError,
    SparkiqError,
    StateQueryRequest,
    UnknownStoreError,
)
from sparkiq.changelog import Changelog
from sparkiq.changelog.retention import apply_retention
from sparkiq.changelog.snapshot import write_snapshot
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema
from tests.changelog.helpers import (
    WIDE_SCHEMA_JSON,
    apply_changes,
    make_table,
    make_wide_table,
    write_batch,
    write_rows,
)

Row = dict[str, Any]
Filter = Callable[[Row], bool]

COLUMNS = ["k", "n", "tag", "price", "day", "info"]
KEYS = [f"k{i:02d}" for i in range(60)]
PARTITIONS = 4


def random_row(rng: random.Random, key: str) -> Row:
    info = None
    if rng.random() < 0.8:
        info = {
            "a": rng.randrange(10),
            "tags": [rng.choice("xyz") for _ in range(rng.randrange(3))],
        }
    return {
        "k": key,
        "n": rng.randrange(100),
        "tag": rng.choice(["red", "green", None]),
        "price": round(rng.uniform(0, 100), 2),
        "day": dt.date(2024, 1, 1) + dt.timedelta(days=rng.randrange(60)),
        "info": info,
    }


def make_history(seed: int, batches: int = 6) -> list[dict[str, Row | None]]:
    """Batch 0 inserts every key; later batches update a third of the keys (so they move in
    and out of filters on ``n`` and ``tag``), delete some and bring some deleted ones back."""
    rng = random.Random(seed)
    history: list[dict[str, Row | None]] = [{k: random_row(rng, k) for k in KEYS}]
    for _ in range(1, batches):
        changes: dict[str, Row | None] = {}
        for key in rng.sample(KEYS, 20):
            changes[key] = random_row(rng, key)
        for key in rng.sample(KEYS, 6):
            changes[key] = None
        history.append(changes)
    return history


def restrict(row: Row | None, where: Filter | None, columns: list[str] | None) -> Row | None:
    """The owner's row as a follower with this filter and projection must show it."""
    if row is None or (where is not None and not where(row)):
        return None
    if columns is None:
        return row
    kept = set(columns) | {"k"}
    return {c: row[c] for c in COLUMNS if c in kept}


def by_n(row: Row) -> bool:
    return int(row["n"]) % 3 == 0


def red(row: Row) -> bool:
    return bool(row["tag"] == "red")


@functools.cache
def partition_of(key: str) -> int:
    schema = TableSchema.from_spark_json(WIDE_SCHEMA_JSON, ["k"])
    return Partitioner(schema.key_types, PARTITIONS)((key,))


def tree(root: Path) -> dict[str, tuple[bool, int, int]]:
    """Every file and directory under ``root`` with its kind, size and mtime."""
    out = {}
    for path in root.rglob("*"):
        st = path.stat()
        out[str(path.relative_to(root))] = (path.is_dir(), st.st_size, st.st_mtime_ns)
    return out


SUBSETS: dict[str, dict[str, Any]] = {
    "partitions": {"partitions": [1, 3]},
    "where": {"where": by_n},
    "columns": {"columns": ["n", "info"]},
    "everything": {"partitions": [0, 2, 3], "where": red, "columns": ["price"]},
}


@pytest.mark.parametrize("store", ["rocksdb", "memory"])
@pytest.mark.parametrize("subset", sorted(SUBSETS))
def test_a_subset_equals_the_ground_truth_restricted_after_every_batch(
    tmp_path: Path, subset: str, store: str
) -> None:
    options = SUBSETS[subset]
    where, columns = options.get("where"), options.get("columns")
    followed = set(options.get("partitions", range(PARTITIONS)))
    changelog = make_wide_table(str(tmp_path / "state"))
    history = make_history(seed=len(subset))
    write_rows(changelog, 0, history[0])
    moved = 0
    with sparkiq.follow(str(tmp_path / "state"), "w", store=store, **options) as follower:
        assert follower.partitions == tuple(sorted(followed))
        for batch_id in range(len(history)):
            if batch_id:
                write_rows(changelog, batch_id, history[batch_id])
            assert follower.wait_for(batch_id, timeout=10)
            truth = apply_changes(history[: batch_id + 1])
            before = apply_changes(history[:batch_id])
            for key in KEYS:
                expected = restrict(truth.get(key), where, columns)
                if partition_of(key) in followed:
                    assert follower.get(key) == expected, (batch_id, key)
                else:
                    result = follower.query(
                        StateQueryRequest.in_store("w").with_query(KeyQuery.with_key(key))
                    ).only_partition_result()
                    assert result.failure_reason is FailureReason.NOT_PRESENT
                was = restrict(before.get(key), where, columns)
                moved += (was is None) != (expected is None)
            # Ranges see the same subset, partition by partition, at the follower's position.
            ranged = follower.query(
                StateQueryRequest.in_store("w").with_query(RangeQuery.with_no_bounds())
            )
            rows = {}
            for partition, partial in ranged.partition_results.items():
                if partition in followed:
                    assert partial.is_success
                    rows.update(dict(partial.result))
                else:
                    assert partial.failure_reason is FailureReason.NOT_PRESENT
            assert rows == {
                k: r
                for k, r in ((k, restrict(truth.get(k), where, columns)) for k in KEYS)
                if r is not None and partition_of(k) in followed
            }
            assert follower.position == Position.from_map({"w": dict.fromkeys(followed, batch_id)})
            assert follower.batch_id == batch_id
    if where is not None:
        assert moved > 10  # keys really entered and left the filtered subset
    if columns is not None:
        got = next(r for r in rows.values())
        assert list(got) == [c for c in COLUMNS if c in set(columns) | {"k"}]
        assert follower.columns == tuple(got)


def test_complete_mode_batches_replace_the_subset(tmp_path: Path) -> None:
    changelog = make_wide_table(str(tmp_path), mode="complete")
    history = make_history(seed=7, batches=3)
    with sparkiq.follow(str(tmp_path), "w", where=by_n, columns=["n"], start=False) as follower:
        for batch_id, changes in enumerate(history):
            live = {k: r for k, r in changes.items() if r is not None}
            write_rows(changelog, batch_id, live)
            assert follower.wait_for(batch_id, timeout=10)
            assert {k: follower.get(k) for k in KEYS} == {
                k: restrict(live.get(k), by_n, ["n"]) for k in KEYS
            }


def test_a_follower_restores_from_snapshots_and_the_segments_after_them(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    changelog = make_wide_table(state)
    history = make_history(seed=3, batches=8)
    for batch_id in range(5):
        write_rows(changelog, batch_id, history[batch_id])
    for partition in range(PARTITIONS):
        write_snapshot(changelog, partition, 3)
    apply_retention(changelog, 0.0)  # batches 0..3 are gone: only the snapshots have them
    assert changelog.read_commit(0) is None
    for batch_id in range(5, 8):
        write_rows(changelog, batch_id, history[batch_id])
    truth = apply_changes(history)
    with sparkiq.follow(state, "w", where=red, columns=["tag", "day"]) as follower:
        assert follower.wait_for(7, timeout=10)
        assert {k: follower.get(k) for k in KEYS} == {
            k: restrict(truth.get(k), red, ["tag", "day"]) for k in KEYS
        }
        assert all(s.restored_rows > 0 for s in follower.status())


def test_a_follower_never_writes_and_never_touches_the_owner_files(tmp_path: Path) -> None:
    state = tmp_path / "state"
    changelog = make_wide_table(str(state))
    history = make_history(seed=11)
    for batch_id, changes in enumerate(history):
        write_rows(changelog, batch_id, changes)
    write_snapshot(changelog, 0, 2)
    before = tree(state)
    local = tmp_path / "local"
    for _ in range(2):  # a first run restores, the second resumes from local_dir
        with sparkiq.follow(
            str(state), "w", where=by_n, columns=["n"], local_dir=str(local)
        ) as follower:
            assert follower.wait_for(len(history) - 1, timeout=10)
            assert follower.changelog.read_only
            record = Changelog(str(state), "w").read_commit(1)
            assert record is not None
            with pytest.raises(ReadOnlyError, match=r"table 'w'.*read-only.*never write") as info:
                follower.changelog.write_commit(record)
            assert isinstance(info.value, PermissionError) and info.value.store == "w"
            with pytest.raises(ReadOnlyError, match=r"00000/00000000000000000009\.arrow"):
                follower.changelog.write_segment(0, 9, {b"k": b"v"})
            with pytest.raises(ReadOnlyError):  # snapshots write through the storage
                write_snapshot(follower.changelog, 1, 2)
            with pytest.raises(ReadOnlyError):  # so does retention
                apply_retention(follower.changelog, 0.0)
            with pytest.raises(ReadOnlyError):
                follower.changelog.storage.delete(changelog.commit_path(0))
    assert tree(state) == before
    assert (local / "w" / "follower.json").exists()


def test_local_dir_inside_state_dir_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    changelog = make_table(str(state))
    write_batch(changelog, 0, {"a": 1})
    (tmp_path / "link").symlink_to(state / "tables")
    before = tree(state)
    for inside in [state, state / "followers", tmp_path / "link" / "x"]:
        with pytest.raises(ConfigError, match=r"inside state_dir.*outside"):
            sparkiq.follow(str(state), "t", local_dir=str(inside))
    assert tree(state) == before
    # A sibling whose name starts with the state_dir's is not inside it.
    with sparkiq.follow(str(state), "t", local_dir=str(tmp_path / "state-follower")) as follower:
        assert follower.wait_for(0, timeout=10) and follower.get("a") == {"k": "a", "n": 1}


def test_bad_arguments_are_refused_naming_the_candidates(tmp_path: Path) -> None:
    changelog = make_wide_table(str(tmp_path))
    write_rows(changelog, 0, {"a": random_row(random.Random(1), "a")})
    state = str(tmp_path)
    temporary = set(Path(tempfile.gettempdir()).glob("sparkiq-follower-w-*"))
    cases: list[tuple[Mapping[str, Any], type[Exception], str]] = [
        ({"columns": ["price", "nope"]}, ConfigError, r"no column 'nope'.*\['k', 'n', 'tag'"),
        ({"columns": ["Price"]}, ConfigError, "no column 'Price'"),
        ({"partitions": [4]}, ConfigError, r"partitions 0\.\.3; cannot follow \[4\]"),
        ({"partitions": [-1, 2]}, ConfigError, r"cannot follow \[-1\]"),
        ({"partitions": []}, ConfigError, "empty set"),
        ({"partitions": [True]}, ConfigError, r"cannot follow \[True\]"),
        ({"partitions": 2}, ConfigError, "iterable of partition numbers"),
        ({"where": "n > 3"}, ConfigError, "function of a row dict"),
        ({"store": "sqlite"}, ConfigError, "store must be 'rocksdb' or 'memory'"),
        ({"store": "memory", "local_dir": str(tmp_path / "x")}, ConfigError, "only used"),
        ({"poll_interval": 0}, ConfigError, "poll_interval must be a positive"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            sparkiq.follow(state, "w", **kwargs)
    with pytest.raises(UnknownStoreError, match=r"no table 'nope'.*\['w'\]"):
        sparkiq.follow(state, "nope")
    assert set(Path(tempfile.gettempdir()).glob("sparkiq-follower-w-*")) == temporary


def test_unfollowed_partitions_and_closed_followers(tmp_path: Path) -> None:
    changelog = make_wide_table(str(tmp_path))
    write_rows(changelog, 0, make_history(seed=5, batches=1)[0])
    follower = sparkiq.follow(str(tmp_path), "w", partitions=[2])
    assert follower.wait_for(0, timeout=10)
    elsewhere = next(k for k in KEYS if partition_of(k) != 2)
    with pytest.raises(SparkiqError, match="is not hosted"):
        follower.get(elsewhere)
    result = follower.query(
        StateQueryRequest.in_store("w")
        .with_query(RangeQuery.with_no_bounds())
        .with_partitions([0, 2, 7])
    )
    assert result.partition_results[0].failure_reason is FailureReason.NOT_PRESENT
    assert result.partition_results[2].is_success
    assert result.partition_results[7].failure_reason is FailureReason.DOES_NOT_EXIST
    with pytest.raises(UnknownStoreError, match="'other'"):
        follower.query(StateQueryRequest.in_store("other").with_query(KeyQuery.with_key("a")))
    local = follower.local_dir
    assert local is not None and os.path.isdir(local)
    follower.close()
    follower.close()
    assert not os.path.exists(local)  # the temporary local_dir is removed
    with pytest.raises(SparkiqError, match="closed"):
        follower.get("k00")


def test_restart_with_the_same_local_dir_resumes_and_another_subset_rebuilds(
    tmp_path: Path,
) -> None:
    state, local = str(tmp_path / "state"), str(tmp_path / "local")
    changelog = make_wide_table(state)
    history = make_history(seed=9)
    for batch_id in range(3):
        write_rows(changelog, batch_id, history[batch_id])
    with sparkiq.follow(state, "w", where=by_n, partitions=[0, 1], local_dir=local) as first:
        assert first.wait_for(2, timeout=10)
    for batch_id in range(3, len(history)):
        write_rows(changelog, batch_id, history[batch_id])
    truth = apply_changes(history)

    same: dict[str, Any] = {"where": by_n, "local_dir": local, "start": False}
    with sparkiq.follow(state, "w", partitions=[0, 1], **same) as resumed:
        assert {s.batch_id for s in resumed.status()} == {2}  # from the local files
        assert resumed.poll_once() == (len(history) - 3) * 2  # only the new batches
        for key in KEYS:
            if partition_of(key) in (0, 1):
                assert resumed.get(key) == restrict(truth.get(key), by_n, None)
    # Following other partitions reuses the partitions already built.
    with sparkiq.follow(state, "w", partitions=[1, 2], **same) as f:
        assert {s.partition: s.batch_id for s in f.status()} == {1: 5, 2: -1}
    # Another projection or filter is another subset: the local files are rebuilt.
    subsets: list[tuple[Filter, list[str] | None]] = [(by_n, ["n"]), (red, None)]
    for where, columns in subsets:
        with sparkiq.follow(
            state, "w", where=where, columns=columns, local_dir=local, start=False
        ) as rebuilt:
            assert {s.batch_id for s in rebuilt.status()} == {-1}
            rebuilt.poll_once()
            assert {k: rebuilt.get(k) for k in KEYS} == {
                k: restrict(truth.get(k), where, columns) for k in KEYS
            }


def test_a_filter_that_raises_stops_its_partitions_at_the_last_good_batch(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, {f"k{i}": i for i in range(20)})

    def picky(row: Row) -> bool:
        if row["n"] == 999:
            raise ValueError("no 999s")
        return bool(row["n"] % 2)

    with sparkiq.follow(str(tmp_path), "t", where=picky, store="memory") as follower:
        assert follower.wait_for(0, timeout=10)
        write_batch(changelog, 1, {"k3": 999})
        assert not follower.wait_for(1, timeout=10)
        bad = follower.partition_for_key("k3")
        status = {s.partition: s for s in follower.status()}
        assert status[bad].batch_id == 0 and status[bad].state == "error"
        assert "where= filter" in (status[bad].error or "")
        assert "ValueError: no 999s" in (status[bad].error or "")
        assert follower.get("k3") == {"k": "k3", "n": 3}  # still serving batch 0
        # wait_for returns at the first stuck partition, maybe before the healthy ones applied
        # batch 1 (a busy machine): they must get there on their own
        deadline = time.monotonic() + 30  # a hang bound
        while not all(s.batch_id == 1 for s in follower.status() if s.partition != bad):
            assert time.monotonic() < deadline, follower.status()
            time.sleep(0.02)


def test_every_answer_equals_the_owner_at_the_position_it_reports(tmp_path: Path) -> None:
    """Read continuously while the owner commits: each answer, whatever batch it was read at,
    is the owner's row as of that batch, restricted to the subset."""
    changelog = make_wide_table(str(tmp_path / "state"))
    history = make_history(seed=13, batches=25)
    write_rows(changelog, 0, history[0])
    answers: list[tuple[str, int, Row | None]] = []
    ranges: list[tuple[int, int, dict[str, Row]]] = []
    stop = threading.Event()
    with sparkiq.follow(
        str(tmp_path / "state"), "w", where=by_n, columns=["price"], poll_interval=0.002
    ) as follower:

        def read() -> None:
            rng = random.Random(1)
            while not stop.is_set():
                key = rng.choice(KEYS)
                row, position = follower.get_with_position(key)
                (batch,) = position.partition_offsets("w").values()
                answers.append((key, batch, row))
                partition = rng.randrange(PARTITIONS)
                result = follower.query(
                    StateQueryRequest.in_store("w")
                    .with_query(RangeQuery.with_no_bounds())
                    .with_partitions([partition])
                ).partition_results[partition]
                rows = dict(result.result)
                ranges.append((partition, result.position.partition_offsets("w")[partition], rows))
                time.sleep(0.001)  # leave the tailer the GIL

        assert follower.wait_for(0, timeout=10)
        reader = threading.Thread(target=read)
        reader.start()
        try:
            for batch_id in range(1, len(history)):
                write_rows(changelog, batch_id, history[batch_id])
                time.sleep(0.01)
            assert follower.wait_for(len(history) - 1, timeout=10)
        finally:
            stop.set()
            reader.join()
    truths = [apply_changes(history[: b + 1]) for b in range(len(history))]
    for key, batch, row in answers:
        assert row == restrict(truths[batch].get(key), by_n, ["price"]), (key, batch)
    for partition, batch, rows in ranges:
        assert rows == {
            k: r
            for k in KEYS
            if partition_of(k) == partition
            and (r := restrict(truths[batch].get(k), by_n, ["price"])) is not None
        }
    assert len({batch for _, batch, _ in answers}) >= 5, "reads should span many batches"


def test_sql_over_a_followed_subset(tmp_path: Path) -> None:
    from sparkiq.sql import SqlPartitionError

    changelog = make_table(str(tmp_path / "state"), partitions=4)
    write_batch(changelog, 0, {f"k{i:02d}": i for i in range(40)})
    with sparkiq.follow(
        str(tmp_path / "state"),
        "t",
        where=lambda row: row["n"] % 2 == 0,
        columns=["n"],
        local_dir=str(tmp_path / "mine"),
    ) as whole:
        whole.wait_for(0, timeout=10)
        answer = whole.sql("SELECT count(*) AS c, sum(n) AS s FROM t WHERE n >= 10")
        assert answer.rows == [{"c": 15, "s": sum(range(10, 40, 2))}]
        assert whole.sql("SELECT * FROM t WHERE k = 'k03'").rows == []  # filtered out
    with sparkiq.follow(
        str(tmp_path / "state"), "t", partitions=[0], local_dir=str(tmp_path / "part")
    ) as part:
        part.wait_for(0, timeout=10)
        key = next(f"k{i:02d}" for i in range(40) if part.partition_for_key(f"k{i:02d}") == 0)
        assert part.sql(f"SELECT n FROM t WHERE k = '{key}'").rows == [{"n": int(key[1:])}]
        with pytest.raises(SqlPartitionError, match="partition"):
            part.sql("SELECT count(*) FROM t")
