"""``checkpointFormatVersion=2`` snapshots of the RocksDB provider, read as Spark reads them.

Under checkpoint format version 2 every attempt at a batch names its files after its own
unique id: ``N_<uniqueId>.zip`` beside ``N_<uniqueId>.changelog``, and the snapshot's SST
files in ``SSTs/`` under names the zip's ``metadata`` maps. test_rocksdb.py covers v2
changelogs (a retried batch); here real queries write v2 *snapshots*:

- changelog checkpointing off: every batch uploads a zip, and each batch is served from them;
- changelog checkpointing on: Spark's maintenance uploads a zip (a small
  ``minDeltasForSnapshot``, the session's 5 s maintenance interval), the changelogs it makes
  redundant are deleted as Spark's retention would, and a replica attached then restores from
  the zip and follows the query's later changelogs live;
- changelog checkpointing off and a batch that ran twice: two zips for one version, of which
  only the committed attempt's is read.

At each committed batch the state is compared with Spark's State Data Source, which follows
v2 lineage only with the v2 setting on (:func:`spark_v2_state`).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

import sparkiq
from sparkiq.checkpoint import Checkpoint
from sparkiq.checkpoint.rocksdb import (
    RocksDBEncoding,
    RocksDBStateFiles,
    StateFileGoneError,
    UnsupportedStateFormatError,
)
from sparkiq.checkpoint.rocksdb_stores import commit_log_ids
from sparkiq.schema.types import parse_type
from sparkiq.testing import JsonSource
from tests.checkpoint.streams import sql_conf
from tests.checkpoint.test_rocksdb import (
    BATCHES,
    FORMAT_VERSION,
    PARTITIONS,
    ROWS,
    SCHEMA,
    assert_same_as_spark,
    committed,
    decoded,
    rocksdb_conf,
    run_batches,
    spark_state,
)

V2 = {FORMAT_VERSION: "2"}
MIN_DELTAS = "spark.sql.streaming.stateStore.minDeltasForSnapshot"
#: How long a test waits for Spark's maintenance (every 5 s in the session) to upload a
#: snapshot: a bound on a hang, not a timing expectation.
SNAPSHOT_HANG_BOUND = 300.0
_V2_NAME = re.compile(r"^(\d+)_([0-9a-f-]{36})\.(zip|changelog)$")
KEY_SCHEMA = parse_type({"type": "struct", "fields": [{"name": "s", "type": "string"}]})

LATER_ROWS = [
    [
        {"s": "b", "i": 2, "v": 3, "t": "2024-01-01T00:04:00"},
        {"s": "d", "i": 9, "v": 4, "t": "2024-01-01T00:04:01"},
    ],
    [
        {"s": "a", "i": 1, "v": 6, "t": "2024-01-01T00:05:00"},
        {"s": "é", "i": 2, "v": 8, "t": "2024-01-01T00:05:01"},
    ],
]


def spark_v2_state(spark: Any, checkpoint: Path, batch: int) -> set[Any]:
    """Spark's State Data Source at ``batch`` (it follows v2 lineage only with v2 set)."""
    with sql_conf(spark, V2):
        rows, _ = spark_state(spark, checkpoint, batch)
    return rows


def assert_same_as_spark_v2(spark: Any, checkpoint: Path, batches: list[int]) -> None:
    with sql_conf(spark, V2):
        assert_same_as_spark(spark, checkpoint, batches)


def state_files(checkpoint: Path, partition: int) -> RocksDBStateFiles:
    """The partition's reader as ``Checkpoint.files`` makes it, with the commit log's ids."""
    return RocksDBStateFiles(
        checkpoint / "state" / "0" / str(partition),
        RocksDBEncoding(KEY_SCHEMA),
        partition=partition,
        committed_ids=commit_log_ids(checkpoint, 0, partition),
    )


def v2_files(checkpoint: Path, partition: int, suffix: str) -> dict[int, list[str]]:
    """The unique ids of the partition's ``N_<id>.<suffix>`` files, per version; asserts that
    every state file there has a v2 name."""
    found: dict[int, list[str]] = {}
    for path in (checkpoint / "state" / "0" / str(partition)).iterdir():
        if path.suffix not in (".zip", ".changelog"):
            continue
        match = _V2_NAME.match(path.name)
        assert match is not None, f"{path.name} is not a checkpointFormatVersion 2 name"
        if match[3] == suffix:
            found.setdefault(int(match[1]), []).append(match[2])
    return found


def committed_id(checkpoint: Path, batch: int, partition: int) -> str:
    """The unique id ``commits/<batch>`` records for operator 0's ``partition``."""
    text = (checkpoint / "commits" / str(batch)).read_text()
    ids: dict[str, list[list[str]]] = json.loads(text.splitlines()[1])["stateUniqueIds"]
    (unique_id,) = ids["0"][partition]
    return unique_id


def served(handle: Any) -> set[Any]:
    """The attached aggregation's rows as the State Data Source shows them."""
    (table,) = handle.tables
    return {((r["s"],), (r["sum"],)) for r in handle.sql(f"SELECT * FROM {table}").rows}


def aggregation(source: JsonSource, spark: Any, checkpoint: Path) -> Any:
    from pyspark.sql import functions as F

    return (
        source.stream(spark)
        .groupBy("s")
        .agg(F.sum("v").alias("total"))
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
    )


def run_once(query: Any) -> None:
    """Run an availableNow query over what its source holds now."""
    handle = query.start()
    handle.awaitTermination()
    assert handle.exception() is None


# -- (a) changelog checkpointing off: a v2 zip at every batch ---------------------------------


@pytest.fixture(scope="module")
def snapshots_v2(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("v2-snapshots")
    source = JsonSource(base / "in", SCHEMA)
    with sql_conf(spark, V2), rocksdb_conf(spark, changelog=False):
        query = aggregation(source, spark, base / "cp").trigger(availableNow=True)
        run_batches(spark, source, query, ROWS)
    return base / "cp"


def test_v2_snapshots_without_changelogs_equal_spark_state(spark: Any, snapshots_v2: Path) -> None:
    checkpoint = snapshots_v2
    assert committed(checkpoint) == list(range(BATCHES))
    for partition in range(PARTITIONS):
        assert not v2_files(checkpoint, partition, "changelog")
        zips = v2_files(checkpoint, partition, "zip")
        # one zip per batch, named after the attempt the commit log records
        assert zips == {b + 1: [committed_id(checkpoint, b, partition)] for b in range(BATCHES)}
        files = state_files(checkpoint, partition)
        assert files.versions() == files.snapshot_versions() == list(range(1, BATCHES + 1))
        # the snapshot differences replayed from nothing are each snapshot again
        state: dict[bytes, bytes] = {}
        for version in range(1, BATCHES + 1):
            for key, value in files.changes(version):
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = value
            assert state == dict(files.snapshot(version)), f"version {version}"
    assert_same_as_spark_v2(spark, checkpoint, list(range(BATCHES)))


def test_a_replica_restores_from_a_v2_snapshot(spark: Any, snapshots_v2: Path) -> None:
    last = BATCHES - 1
    with sparkiq.attach(str(snapshots_v2), name="vsnap", store="memory") as handle:
        assert handle.wait_for(last, timeout=120), handle.status()
        assert served(handle) == spark_v2_state(spark, snapshots_v2, last)


# -- (b) changelog checkpointing on: a replica attached after maintenance's v2 zip ------------


def wait_for_snapshot(checkpoint: Path, version: int) -> None:
    """Block until Spark's maintenance uploaded the zip of ``version`` in every partition."""
    deadline = time.monotonic() + SNAPSHOT_HANG_BOUND
    while not all(version in v2_files(checkpoint, p, "zip") for p in range(PARTITIONS)):
        assert time.monotonic() < deadline, (
            f"no snapshot of version {version} uploaded in {SNAPSHOT_HANG_BOUND} s"
        )
        time.sleep(0.5)


def test_a_replica_attached_after_maintenance_restores_from_the_v2_zip_and_follows(
    spark: Any, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "cp"
    source = JsonSource(tmp_path / "in", SCHEMA)
    # a snapshot after every delta: maintenance uploads the newest one it finds
    with sql_conf(spark, {**V2, MIN_DELTAS: "1"}), rocksdb_conf(spark, changelog=True):
        query = aggregation(source, spark, checkpoint).trigger(processingTime="1 second")
        running = query.start()
    try:
        for rows in ROWS:
            source.write(rows)
            running.processAllAvailable()
        wait_for_snapshot(checkpoint, BATCHES)  # the state after the last batch
    finally:
        running.stop()
    assert running.exception() is None
    assert committed(checkpoint) == list(range(BATCHES))
    assert_same_as_spark_v2(spark, checkpoint, list(range(BATCHES)))

    # Spark's retention drops the changelogs a snapshot makes redundant: with them gone, a
    # replica can only be restored from the v2 zip
    for partition in range(PARTITIONS):
        zip_ids = v2_files(checkpoint, partition, "zip")[BATCHES]
        assert zip_ids == [committed_id(checkpoint, BATCHES - 1, partition)]
        folder = checkpoint / "state" / "0" / str(partition)
        for old, ids in v2_files(checkpoint, partition, "changelog").items():
            if old < BATCHES:
                for unique_id in ids:
                    (folder / f"{old}_{unique_id}.changelog").unlink()
                    (folder / f".{old}_{unique_id}.changelog.crc").unlink(missing_ok=True)
    oldest_whole = BATCHES - 1  # the batch the zip holds: older ones are gone

    with sparkiq.attach(str(checkpoint), name="vfollow", store="memory") as handle:
        assert handle.wait_for(BATCHES - 1, timeout=120), handle.status()
        assert served(handle) == spark_v2_state(spark, checkpoint, BATCHES - 1)
        # later batches: no further snapshot, so the replica applies their v2 changelogs
        with sql_conf(spark, {**V2, MIN_DELTAS: "1000"}), rocksdb_conf(spark, changelog=True):
            query = aggregation(source, spark, checkpoint).trigger(availableNow=True)
            for offset, rows in enumerate(LATER_ROWS):
                batch = BATCHES + offset
                run_batches(spark, source, query, [rows])
                assert committed(checkpoint)[-1] == batch
                assert handle.wait_for(batch, timeout=120), handle.status()
                expected = spark_v2_state(spark, checkpoint, batch)
                assert served(handle) == expected, f"batch {batch}"
                assert expected
    last = BATCHES + len(LATER_ROWS) - 1
    for partition in range(PARTITIONS):
        assert max(v2_files(checkpoint, partition, "zip")) == BATCHES
        changelogs = v2_files(checkpoint, partition, "changelog")
        for batch in range(BATCHES, last + 1):
            assert changelogs[batch + 1] == [committed_id(checkpoint, batch, partition)]
    # replay from the checkpoint alone agrees too: the v2 zip, then the v2 changelogs
    assert_same_as_spark_v2(spark, checkpoint, list(range(oldest_whole, last + 1)))
    assert dict(decoded(checkpoint, last + 1))[("a",)] == (10 + 5 + 2 + 6,)


# -- (c) changelog checkpointing off, a batch retried: two zips for one version ---------------


@pytest.fixture(scope="module")
def retried_snapshots(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like test_rocksdb's ``retried``, with changelog checkpointing off: batch 2's commit
    is lost after its state was written, and its input reads differently the second time,
    so its two attempts upload different zips (and SST files) for state version 3."""
    base = tmp_path_factory.mktemp("v2-retried-snapshots")
    source = JsonSource(base / "in", SCHEMA)
    with sql_conf(spark, V2), rocksdb_conf(spark, changelog=False):
        query = aggregation(source, spark, base / "cp").trigger(availableNow=True)
        run_batches(spark, source, query, ROWS[:2])
        last = source.write(ROWS[2])
        run_once(query)
        commits = base / "cp" / "commits"
        for lost in (commits / "2", commits / ".2.crc"):
            lost.unlink(missing_ok=True)
        last.write_text("".join(json.dumps({**row, "v": row["v"] * 100}) + "\n" for row in ROWS[2]))
        run_once(query)
    return base / "cp"


def test_a_retried_batch_is_read_from_its_committed_zip(
    spark: Any, retried_snapshots: Path
) -> None:
    checkpoint = retried_snapshots
    assert committed(checkpoint) == [0, 1, 2]
    differ = []
    for partition in range(PARTITIONS):
        attempts = v2_files(checkpoint, partition, "zip")[BATCHES]
        assert len(attempts) == 2  # the retry uploaded a second zip beside the first
        chosen = committed_id(checkpoint, 2, partition)
        (other,) = set(attempts) - {chosen}

        def lost_attempt(version: int, other: str = other) -> frozenset[str] | None:
            return frozenset({other}) if version == BATCHES else None

        directory = checkpoint / "state" / "0" / str(partition)
        lost = RocksDBStateFiles(
            directory, RocksDBEncoding(KEY_SCHEMA), committed_ids=lost_attempt
        ).raw_snapshot(BATCHES)
        differ.append(lost != state_files(checkpoint, partition).raw_snapshot(BATCHES))
    assert any(differ)  # reading the other attempt's zip would give other rows
    assert_same_as_spark_v2(spark, checkpoint, [0, 1, 2])
    # the committed attempt is the retry, which read every value of batch 2 times 100
    assert dict(decoded(checkpoint, BATCHES))[("é",)] == (100,)
    with sparkiq.attach(str(checkpoint), name="vretry", store="memory") as handle:
        assert handle.wait_for(2, timeout=120), handle.status()
        assert served(handle) == spark_v2_state(spark, checkpoint, 2)


def test_zips_of_an_uncommitted_batch_are_not_read(retried_snapshots: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "copy"
    shutil.copytree(retried_snapshots, checkpoint)
    (checkpoint / "commits" / "2").unlink()
    files = state_files(checkpoint, 0)
    assert files.versions() == files.snapshot_versions() == [1, 2]
    with pytest.raises(StateFileGoneError, match="state version 3"):
        files.raw_snapshot(3)
    # without the commit log, two zips for one version are refused by name
    bare = RocksDBStateFiles(
        checkpoint / "state" / "0" / "0", RocksDBEncoding(KEY_SCHEMA), partition=0
    )
    with pytest.raises(UnsupportedStateFormatError, match=r"several zip files.*3_"):
        bare.snapshot_versions()
    assert Checkpoint(str(checkpoint)).committed_batches() == [0, 1]
