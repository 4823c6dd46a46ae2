"""What sparkiq does with checkpoints it must not trust: uncommitted batches, truncated,
corrupted or deleted state files, checksum files that disagree, codecs, providers and
locations it does not read. Each case starts from a copy of one real checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import crc32c
import pytest
from pyspark.sql import functions as F

from sparkiq.checkpoint import Checkpoint, RowDecoder, replay, version_of_batch
from sparkiq.errors import ChangelogError, ConfigError, CorruptSegmentError
from tests.checkpoint.streams import Stream, spark_state, sparkiq_state

EVENTS = "k string, n int"


@pytest.fixture(scope="module")
def original(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-batch aggregation (Hadoop's local file system writes its .crc files)."""

    def build(frame: Any) -> Any:
        return frame.groupBy("k").agg(F.sum("n").alias("total"), F.count("*").alias("rows"))

    stream = Stream(spark, tmp_path_factory.mktemp("faults"), EVENTS, build)
    stream.batch([{"k": f"key{i}", "n": i} for i in range(20)])
    stream.batch([{"k": f"key{i}", "n": 100 + i} for i in range(0, 20, 3)])
    return stream.checkpoint


@pytest.fixture
def copy(original: Path, tmp_path: Path) -> Checkpoint:
    target = tmp_path / "ck"
    shutil.copytree(original, target)
    return Checkpoint(target)


def partition_with_rows(ck: Checkpoint) -> tuple[Any, int, Path]:
    (store,) = ck.stores()
    for partition in range(store.partitions):
        delta = store.directory(partition) / "2.delta"
        if delta.stat().st_size > 100:
            return store, partition, delta
    raise AssertionError("no partition has a change in batch 1")


def spark_checksum(path: Path, data: bytes, **override: Any) -> None:
    """Write ``path``'s checksum file as Spark 4.1+'s ChecksumCheckpointFileManager does
    (the pyspark the tests run writes none for HDFS-provider files, so the test writes one)."""
    doc = {
        "algorithm": "CRC32C",
        "value": int.from_bytes(crc32c.crc32c(data).to_bytes(4, "big"), "big", signed=True),
        "mainFileSize": len(data),
        "timestampMs": 0,
        "creator": {"executorId": "driver", "taskInfo": ""},
    }
    doc.update(override)
    path.with_name(f"{path.name}.crc").write_text(json.dumps(doc))


def test_spark_checksum_files_are_verified(spark: Any, copy: Checkpoint) -> None:
    store, partition, delta = partition_with_rows(copy)
    data = delta.read_bytes()
    spark_checksum(delta, data)
    assert sparkiq_state(copy, store, 1) == spark_state(spark, copy.path, 1)
    spark_checksum(delta, data, value=12345)
    with pytest.raises(CorruptSegmentError) as caught:
        list(copy.files(store, partition).changes(2))
    assert "CRC-32C" in str(caught.value) and str(delta) in str(caught.value)
    spark_checksum(delta, data, mainFileSize=len(data) + 1)
    with pytest.raises(CorruptSegmentError, match="its checksum file says"):
        list(copy.files(store, partition).changes(2))
    spark_checksum(delta, data, algorithm="ADLER32")
    with pytest.raises(CorruptSegmentError, match="sparkiq reads CRC32C"):
        list(copy.files(store, partition).changes(2))


def drop_checksums(delta: Path) -> None:
    delta.with_name(f"{delta.name}.crc").unlink(missing_ok=True)
    delta.with_name(f".{delta.name}.crc").unlink(missing_ok=True)


@pytest.mark.parametrize("checksums", [True, False], ids=["with .crc", "without .crc"])
def test_a_truncated_delta_is_an_error_never_fewer_rows(copy: Checkpoint, checksums: bool) -> None:
    store, partition, delta = partition_with_rows(copy)
    if not checksums:
        drop_checksums(delta)
    data = delta.read_bytes()
    for cut in (len(data) - 1, len(data) - 21, len(data) // 2, 10):
        delta.write_bytes(data[:cut])
        with pytest.raises(CorruptSegmentError) as caught:
            replay(copy.files(store, partition), version_of_batch(1))
        error = caught.value
        assert str(delta) in str(error) and "operator 0 (stateStoreSave)" in str(error)
        assert (error.partition, error.position) == (partition, 2)


def test_a_corrupted_byte_fails_the_lz4_checksum(copy: Checkpoint) -> None:
    store, partition, delta = partition_with_rows(copy)
    drop_checksums(delta)
    data = bytearray(delta.read_bytes())
    data[30] ^= 0x40  # inside the first block's compressed bytes
    delta.write_bytes(bytes(data))
    with pytest.raises(CorruptSegmentError, match=r"checksum|lz4"):
        list(copy.files(store, partition).changes(2))


def test_a_corrupted_snapshot_is_an_error(copy: Checkpoint) -> None:
    # a snapshot as Spark writes one: the same records as the deltas, without removals
    store, partition, delta = partition_with_rows(copy)
    snapshot = delta.with_name("1.snapshot")
    shutil.copyfile(delta.with_name("1.delta"), snapshot)
    files = copy.files(store, partition)
    assert files.snapshot_versions() == [1]
    assert dict(files.snapshot(1)) == dict(files.changes(1))  # type: ignore[arg-type]
    snapshot.write_bytes(snapshot.read_bytes()[:-5])
    with pytest.raises(CorruptSegmentError, match=r"1\.snapshot"):
        replay(files, 2)


def test_a_batch_without_its_commit_is_not_listed(copy: Checkpoint) -> None:
    assert copy.committed_batches() == [0, 1]
    (copy.path / "commits" / "1").unlink()
    assert copy.committed_batches() == [0]
    assert copy.latest_batch() == 0
    with pytest.raises(ChangelogError, match="commit log file"):
        copy.commit(1)
    assert copy.commit_time(0) == pytest.approx((copy.path / "commits" / "0").stat().st_mtime)


def test_a_delta_deleted_by_maintenance_says_restore_from_a_newer_snapshot(
    copy: Checkpoint,
) -> None:
    store, partition, delta = partition_with_rows(copy)
    files = copy.files(store, partition)
    delta.unlink()
    with pytest.raises(ChangelogError, match="newer snapshot"):
        replay(files, 2)
    with pytest.raises(ChangelogError, match="is gone"):
        list(files.changes(2))


def rewrite_conf(ck: Checkpoint, **settings: str) -> None:
    for batch in ck.committed_batches():
        path = ck.path / "offsets" / str(batch)
        version, meta, *rest = path.read_text().split("\n")
        doc = json.loads(meta)
        doc["conf"].update(settings)
        path.write_text("\n".join([version, json.dumps(doc), *rest]))
        (path.parent / f".{batch}.crc").unlink(missing_ok=True)


def test_an_unknown_codec_is_refused_naming_the_supported_ones(copy: Checkpoint) -> None:
    rewrite_conf(copy, **{"spark.sql.streaming.stateStore.compression.codec": "brotli"})
    with pytest.raises(ChangelogError) as caught:
        copy.stores()
    assert "'brotli'" in str(caught.value) and "lz4, lzf, snappy, zstd" in str(caught.value)


def test_an_unknown_provider_is_refused(copy: Checkpoint) -> None:
    rewrite_conf(copy, **{"spark.sql.streaming.stateStore.providerClass": "com.example.Mine"})
    with pytest.raises(ChangelogError, match=r"com\.example\.Mine is not one sparkiq reads"):
        copy.stores()


def test_bytes_of_another_schema_are_refused(copy: Checkpoint) -> None:
    store, partition, _ = partition_with_rows(copy)
    decoder = RowDecoder(store)
    key, value = next(iter(replay(copy.files(store, partition), 2).items()))
    with pytest.raises(CorruptSegmentError, match="value schema"):
        decoder.value(value + bytes(8))
    assert decoder.key(key)[0].startswith("key")


def test_locations_sparkiq_does_not_read(tmp_path: Path, copy: Checkpoint) -> None:
    with pytest.raises(ConfigError, match="local file system"):
        Checkpoint("s3a://bucket/checkpoints/q1")
    with pytest.raises(ConfigError, match="no such directory"):
        Checkpoint(tmp_path / "missing")
    with pytest.raises(ConfigError, match="not a streaming query's checkpoint"):
        Checkpoint(tmp_path)
    assert Checkpoint(copy.path.as_uri()).path == copy.path
    with pytest.raises(ConfigError, match="partition 9"):
        copy.files(copy.stores()[0], 9)


def test_a_checkpoint_without_operator_metadata_lists_its_stores_from_disk(
    spark: Any, copy: Checkpoint
) -> None:
    # Spark before 3.5 wrote no state/<op>/_metadata/metadata
    (with_metadata,) = copy.stores()
    (copy.path / "state" / "0" / "_metadata" / "metadata").unlink()
    (store,) = copy.stores()
    assert (store.operator_name, store.store_name) == ("", "default")
    assert store.partitions == copy.shuffle_partitions == with_metadata.partitions
    assert store.key_schema == with_metadata.key_schema
    assert sparkiq_state(copy, store, 1) == spark_state(spark, copy.path, 1)


def test_a_missing_schema_file_is_an_error_naming_it(copy: Checkpoint) -> None:
    schema = copy.path / "state" / "0" / "0" / "_metadata" / "schema"
    schema.unlink()
    with pytest.raises(ChangelogError, match="no state schema file"):
        copy.stores()


def test_before_the_first_batch_there_are_no_stores(tmp_path: Path, copy: Checkpoint) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copyfile(copy.path / "metadata", fresh / "metadata")
    ck = Checkpoint(fresh)
    assert (ck.stores(), ck.committed_batches(), ck.latest_batch()) == ([], [], None)
    assert ck.query_id == json.loads((copy.path / "metadata").read_text())["id"]
