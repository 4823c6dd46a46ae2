"""The RocksDB provider's files read back exactly as Spark's own State Data Source reads them.

Real streaming queries run on the session's SparkSession with the RocksDB provider (changelog
checkpointing on, and off), and for several batches the state decoded from the checkpoint is
compared, row for row, with ``spark.read.format("statestore").option("batchId", b)``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sparkiq.checkpoint import Checkpoint, RowDecoder, replay
from sparkiq.checkpoint.rocksdb import (
    RocksDBEncoding,
    RocksDBStateFiles,
    StateFileGoneError,
    UnsupportedStateFormatError,
)
from sparkiq.checkpoint.rocksdb_stores import commit_log_ids
from sparkiq.checkpoint.unsaferow import UnsafeRowDecoder
from sparkiq.errors import ChangelogError, CorruptSegmentError
from sparkiq.schema.types import DataType, parse_type
from sparkiq.testing import JsonSource
from tests.checkpoint.streams import sql_conf

PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
PARTITIONS = 2
BATCHES = 3


@contextmanager
def rocksdb_conf(spark: Any, *, changelog: bool) -> Iterator[None]:
    """The session configured for the RocksDB provider while a query starts; restored after."""
    settings = {
        "spark.sql.streaming.stateStore.providerClass": PROVIDER,
        CHANGELOG: "true" if changelog else "false",
        "spark.sql.shuffle.partitions": str(PARTITIONS),
    }
    before = {name: spark.conf.get(name, None) for name in settings}
    for name, value in settings.items():
        spark.conf.set(name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                spark.conf.unset(name)
            else:
                spark.conf.set(name, value)


def run_batches(
    spark: Any, source: JsonSource, query: Any, batches: list[list[dict[str, Any]]]
) -> None:
    """Write each batch and run the query to it (availableNow: one micro-batch per file)."""
    for rows in batches:
        source.write(rows)
        handle = query.start()
        handle.awaitTermination()
        assert handle.exception() is None


def struct_of(spark_type: Any) -> DataType:
    return parse_type(json.loads(spark_type.json()))


def spark_state(spark: Any, checkpoint: Path, batch: int, **options: str) -> tuple[set[Any], Any]:
    """Spark's own reading of the state after ``batch``: ({(key, value)}, the frame's schema)."""
    frame = spark.read.format("statestore").option("batchId", batch)
    for name, value in options.items():
        frame = frame.option(name, value)
    df = frame.load(str(checkpoint))
    rows = {(plain(row["key"]), plain(row["value"])) for row in df.collect()}
    return rows, df.schema


def plain(row: Any) -> tuple[Any, ...]:
    """A Row as the tuple of its fields, nested structs as dicts (what the decoder returns)."""
    return tuple(_hashable(v) for v in row.asDict(recursive=True).values())


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def decoded(checkpoint: Path, version: int, store: str | None = None) -> set[Any]:
    """The state of ``version`` read through ``Checkpoint`` (discovery, provider, decoder)."""
    cp = Checkpoint(str(checkpoint))
    info = cp.store(store) if store else cp.stores()[0]
    assert info.provider == "rocksdb"
    decoder = RowDecoder(info)
    out = set()
    for partition in range(info.partitions):
        for key, value in replay(cp.files(info, partition), version).items():
            out.add((_hashable_tuple(decoder.key(key)), _hashable_tuple(decoder.value(value))))
    return out


def _hashable_tuple(values: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(_hashable(v) for v in values)


def committed(checkpoint: Path) -> list[int]:
    return sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def assert_same_as_spark(spark: Any, checkpoint: Path, batches: list[int]) -> None:
    for batch in batches:
        expected, _ = spark_state(spark, checkpoint, batch)
        got = decoded(checkpoint, batch + 1)
        assert got == expected, f"batch {batch}"
        assert expected  # the comparison saw rows


# -- queries ---------------------------------------------------------------------------

ROWS = [
    [
        {"s": "a", "i": 1, "v": 10, "t": "2024-01-01T00:00:05"},
        {"s": "b", "i": 2, "v": 20, "t": "2024-01-01T00:00:15"},
    ],
    [
        {"s": "a", "i": 1, "v": 5, "t": "2024-01-01T00:00:25"},
        {"s": "c", "i": -3, "v": 7, "t": "2024-01-01T00:01:15"},
    ],
    [
        {"s": "é", "i": 2, "v": 1, "t": "2024-01-01T00:03:05"},
        {"s": "a", "i": 4, "v": 2, "t": "2024-01-01T00:03:06"},
    ],
]
SCHEMA = "s string, i int, v long, t timestamp"


@pytest.fixture(scope="module")
def checkpoints(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small query per operator kind, run batch by batch with the RocksDB provider."""
    from pyspark.sql import functions as F

    base = tmp_path_factory.mktemp("rocksdb")
    out: dict[str, Path] = {}

    def run(name: str, build: Any, *, changelog: bool = True, mode: str = "update") -> None:
        source = JsonSource(base / f"{name}-in", SCHEMA)
        with rocksdb_conf(spark, changelog=changelog):
            df = build(source.stream(spark))
            query = (
                df.writeStream.format("noop")
                .outputMode(mode)
                .option("checkpointLocation", str(base / name))
                .trigger(availableNow=True)
            )
            run_batches(spark, source, query, ROWS)
        out[name] = base / name

    aggs = (F.sum("v").alias("total"), F.count("v").alias("n"), F.max("v").alias("top"))
    run("string_key", lambda df: df.groupBy("s").agg(*aggs))
    run("int_key", lambda df: df.groupBy("i").agg(F.avg("v"), F.min("v")))
    run("composite_key", lambda df: df.groupBy("s", "i").agg(*aggs))
    run("dedup", lambda df: df.dropDuplicates(["s", "i"]), mode="append")
    run(
        "window",
        lambda df: (
            df.withWatermark("t", "30 seconds")
            .groupBy(F.window("t", "1 minute"), "s")
            .agg(F.sum("v"))
        ),
    )
    run("snapshots_only", lambda df: df.groupBy("s").agg(*aggs), changelog=False)
    return out


@pytest.mark.parametrize("name", ["string_key", "int_key", "composite_key", "dedup", "window"])
def test_changelog_state_equals_spark_state_source(
    spark: Any, checkpoints: dict[str, Path], name: str
) -> None:
    files = RocksDBStateFiles(
        checkpoints[name] / "state" / "0" / "0", RocksDBEncoding(DataType("struct"))
    )
    batches = committed(checkpoints[name])
    assert len(batches) >= BATCHES  # a watermark adds no-data batches
    assert files.versions() == [b + 1 for b in batches]
    assert_same_as_spark(spark, checkpoints[name], batches)


def test_windows_past_the_watermark_leave_the_state(
    spark: Any, checkpoints: dict[str, Path]
) -> None:
    first, _ = spark_state(spark, checkpoints["window"], 0)
    final = committed(checkpoints["window"])[-1]
    last, _ = spark_state(spark, checkpoints["window"], final)
    assert first - last  # the first minute's windows were evicted by the watermark
    got = decoded(checkpoints["window"], final + 1)
    assert got == last


def test_changelog_checkpointing_off_is_served_at_snapshot_granularity(
    spark: Any, checkpoints: dict[str, Path]
) -> None:
    checkpoint = checkpoints["snapshots_only"]
    expected, schema = spark_state(spark, checkpoint, BATCHES - 1)
    key_schema, value_schema = (
        struct_of(schema["key"].dataType),
        struct_of(schema["value"].dataType),
    )
    for partition in range(PARTITIONS):
        files = RocksDBStateFiles(
            checkpoint / "state" / "0" / str(partition), RocksDBEncoding(key_schema)
        )
        assert not list((checkpoint / "state" / "0" / str(partition)).glob("*.changelog"))
        assert files.versions() == files.snapshot_versions() == list(range(1, BATCHES + 1))
    # changes() are the differences between consecutive snapshots: replaying them from
    # version 0 (no snapshot used) gives Spark's state at every batch
    keys, values = UnsafeRowDecoder(key_schema), UnsafeRowDecoder(value_schema)
    for batch in range(BATCHES):
        want, _ = spark_state(spark, checkpoint, batch)
        got = set()
        for partition in range(PARTITIONS):
            files = RocksDBStateFiles(
                checkpoint / "state" / "0" / str(partition), RocksDBEncoding(key_schema)
            )
            state: dict[bytes, bytes] = {}
            for v in range(1, batch + 2):
                for key, value in files.changes(v):
                    if value is None:
                        state.pop(key, None)
                    else:
                        state[key] = value
            assert state == dict(files.snapshot(batch + 1))
            got |= {(keys.decode(k), values.decode(v)) for k, v in state.items()}
        assert got == want, f"batch {batch}"
        assert decoded(checkpoint, batch + 1) == want  # from the snapshot itself
    assert expected


# -- failures -------------------------------------------------------------------------


def _copy(checkpoint: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(checkpoint, target)
    return target


def _files(checkpoint: Path, partition: int = 0) -> RocksDBStateFiles:
    schema = parse_type({"type": "struct", "fields": [{"name": "s", "type": "string"}]})
    return RocksDBStateFiles(
        checkpoint / "state" / "0" / str(partition), RocksDBEncoding(schema), partition=partition
    )


def _partition_with_rows(checkpoint: Path) -> int:
    return next(p for p in range(PARTITIONS) if any(_files(checkpoint, p).changes(1)))


@pytest.mark.parametrize("keep_crc", [True, False])
def test_a_truncated_changelog_is_refused(
    checkpoints: dict[str, Path], tmp_path: Path, keep_crc: bool
) -> None:
    checkpoint = _copy(checkpoints["string_key"], tmp_path)
    partition = _partition_with_rows(checkpoint)
    path = checkpoint / "state" / "0" / str(partition) / "1.changelog"
    path.write_bytes(path.read_bytes()[:-9])
    if not keep_crc:
        path.with_name(".1.changelog.crc").unlink()
    with pytest.raises(CorruptSegmentError, match=r"1\.changelog"):
        list(_files(checkpoint, partition).changes(1))


@pytest.mark.parametrize("keep_crc", [True, False])
def test_a_corrupted_changelog_is_refused(
    checkpoints: dict[str, Path], tmp_path: Path, keep_crc: bool
) -> None:
    checkpoint = _copy(checkpoints["string_key"], tmp_path)
    partition = _partition_with_rows(checkpoint)
    path = checkpoint / "state" / "0" / str(partition) / "2.changelog"
    data = bytearray(path.read_bytes())
    data[30] ^= 0x41  # inside the first block's compressed bytes
    path.write_bytes(bytes(data))
    if not keep_crc:
        path.with_name(".2.changelog.crc").unlink()
    with pytest.raises(CorruptSegmentError, match=r"2\.changelog"):
        list(_files(checkpoint, partition).changes(2))


def test_a_corrupted_snapshot_is_refused(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    checkpoint = _copy(checkpoints["snapshots_only"], tmp_path)
    path = checkpoint / "state" / "0" / "0" / "2.zip"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    path.with_name(".2.zip.crc").unlink()
    with pytest.raises(CorruptSegmentError, match=r"2\.zip"):
        list(_files(checkpoint).snapshot(2))


def test_an_sst_deleted_by_maintenance_is_a_retryable_error(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    checkpoint = _copy(checkpoints["snapshots_only"], tmp_path)
    partition = _partition_with_rows(checkpoint)
    folder = checkpoint / "state" / "0" / str(partition)
    for sst in (folder / "SSTs").glob("*.sst"):
        sst.unlink()
    with pytest.raises(StateFileGoneError, match="newer snapshot") as caught:
        list(_files(checkpoint, partition).snapshot(BATCHES))
    assert caught.value.retryable
    assert isinstance(caught.value, ChangelogError)


def test_a_deleted_changelog_is_a_retryable_error(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    checkpoint = _copy(checkpoints["string_key"], tmp_path)
    (checkpoint / "state" / "0" / "0" / "1.changelog").unlink()
    files = _files(checkpoint)
    assert files.versions() == [2, 3]
    with pytest.raises(StateFileGoneError, match="state version 1"):
        list(files.changes(1))


def test_unsupported_encodings_are_refused_by_name(tmp_path: Path) -> None:
    schema = parse_type({"type": "struct", "fields": [{"name": "s", "type": "string"}]})
    with pytest.raises(UnsupportedStateFormatError, match=r"'protobuf'.*'unsaferow' and 'avro'"):
        RocksDBStateFiles(tmp_path, RocksDBEncoding(schema, row_format="protobuf"))
    with pytest.raises(ChangelogError, match="Avro-encoded state needs the store's value schema"):
        RocksDBStateFiles(tmp_path, RocksDBEncoding(schema, row_format="avro"))
    with pytest.raises(UnsupportedStateFormatError, match="RangeKeyScan"):
        RocksDBStateFiles(tmp_path, RocksDBEncoding(schema, range_scan=True))


# -- checkpointFormatVersion 2: the committed attempt of a retried batch ---------------------

FORMAT_VERSION = "spark.sql.streaming.stateStore.checkpointFormatVersion"


@pytest.fixture(scope="module")
def retried(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An aggregation with checkpointFormatVersion 2 whose last batch ran twice: its commit
    was lost (the driver died between the state files and the commit, as far as the
    checkpoint can tell) and its input file read differently the second time, so the two
    attempts wrote different changelogs for the same state version."""
    from pyspark.sql import functions as F

    base = tmp_path_factory.mktemp("format-v2")
    source = JsonSource(base / "in", SCHEMA)
    before = spark.conf.get(FORMAT_VERSION, None)
    spark.conf.set(FORMAT_VERSION, "2")
    try:
        with rocksdb_conf(spark, changelog=True):
            query = (
                source.stream(spark)
                .groupBy("s")
                .agg(F.sum("v").alias("total"))
                .writeStream.format("noop")
                .outputMode("update")
                .option("checkpointLocation", str(base / "cp"))
                .trigger(availableNow=True)
            )
            run_batches(spark, source, query, ROWS[:2])
            last = source.write(ROWS[2])
            handle = query.start()
            handle.awaitTermination()
            assert handle.exception() is None
            commits = base / "cp" / "commits"
            for lost in (commits / "2", commits / ".2.crc"):
                lost.unlink(missing_ok=True)
            last.write_text(
                "".join(json.dumps({**row, "v": row["v"] * 100}) + "\n" for row in ROWS[2])
            )
            handle = query.start()
            handle.awaitTermination()
            assert handle.exception() is None
    finally:
        if before is None:
            spark.conf.unset(FORMAT_VERSION)
        else:
            spark.conf.set(FORMAT_VERSION, before)
    return base / "cp"


def _attempts(checkpoint: Path) -> dict[int, list[Path]]:
    """Per partition, the changelog files of state version 3 (batch 2)."""
    return {
        p: sorted((checkpoint / "state" / "0" / str(p)).glob("3_*.changelog"))
        for p in range(PARTITIONS)
    }


def test_a_retried_batch_is_read_from_its_committed_attempt(spark: Any, retried: Path) -> None:
    attempts = _attempts(retried)
    twice = [p for p, files in attempts.items() if len(files) == 2]
    assert twice  # the retry wrote a second changelog beside the first
    assert any(a.read_bytes() != b.read_bytes() for a, b in (attempts[p] for p in twice))
    assert committed(retried) == [0, 1, 2]
    with sql_conf(spark, {FORMAT_VERSION: "2"}):  # Spark's reader follows lineage only then
        assert_same_as_spark(spark, retried, [0, 1, 2])
    # the committed attempt is the retry, which read every value of batch 2 times 100
    totals = dict(decoded(retried, 3))
    assert totals[("é",)] == (100,)


def test_attempts_of_an_uncommitted_batch_are_not_read(retried: Path, tmp_path: Path) -> None:
    checkpoint = _copy(retried, tmp_path)
    partition = next(p for p, files in _attempts(checkpoint).items() if len(files) == 2)
    (checkpoint / "commits" / "2").unlink()
    directory = checkpoint / "state" / "0" / str(partition)
    schema = parse_type({"type": "struct", "fields": [{"name": "s", "type": "string"}]})
    files = RocksDBStateFiles(
        directory,
        RocksDBEncoding(schema),
        partition=partition,
        committed_ids=commit_log_ids(checkpoint, 0, partition),
    )
    assert files.versions() == [1, 2]  # which attempt of version 3 counts is not known yet
    with pytest.raises(StateFileGoneError, match="state version 3"):
        files.records(3)
    # without the commit log, two files for one version are refused by name
    with pytest.raises(UnsupportedStateFormatError, match=r"several changelog files.*3_"):
        RocksDBStateFiles(directory, RocksDBEncoding(schema), partition=partition).versions()
