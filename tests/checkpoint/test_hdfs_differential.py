"""sparkiq's decoding of HDFS-provider state equals Spark's own State Data Source, row for row,
at every committed batch, for the stateful operators Spark runs most."""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash
from pyspark.sql import functions as F

from sparkiq.checkpoint import Checkpoint, replay, version_of_batch
from sparkiq.checkpoint.compression import decompress
from sparkiq.errors import CorruptSegmentError
from tests.checkpoint.streams import Stream, spark_state, sparkiq_state

# Snapshots as often as Spark allows, so the tests read snapshots as well as deltas.
SNAPSHOTS = {"spark.sql.streaming.stateStore.minDeltasForSnapshot": "1"}
EVENTS = "k string, n int, v double, ts timestamp"


def aggregate(keys: list[str]) -> Any:
    def build(frame: Any) -> Any:
        return frame.groupBy(*keys).agg(
            F.sum("n").alias("total"),
            F.count("*").alias("rows"),
            F.min("v").alias("low"),
            F.max("v").alias("high"),
            F.avg("v").alias("mean"),
        )

    return build


def assert_every_batch_matches(spark: Any, ck: Checkpoint) -> None:
    batches = ck.committed_batches()
    assert batches, "the query committed no batch"
    for store in ck.stores():
        for batch in batches:
            expected = spark_state(spark, ck.path, batch, operatorId=store.operator_id)
            assert sparkiq_state(ck, store, batch) == expected, (store.describe(), batch)


def assert_snapshots_equal_deltas(ck: Checkpoint) -> int:
    """Every snapshot holds what the deltas up to its version add up to; returns how many
    snapshots there were."""
    seen = 0
    for store in ck.stores():
        for partition in range(store.partitions):
            files = ck.files(store, partition)
            for version in files.snapshot_versions():
                state: dict[bytes, bytes] = {}
                for v in range(1, version + 1):
                    for key, value in files.changes(v):
                        if value is None:
                            state.pop(key, None)
                        else:
                            state[key] = value
                assert dict(files.snapshot(version)) == state
                seen += 1
    return seen


ROWS = [
    [{"k": "a", "n": 1, "v": 1.5}, {"k": "b", "n": 2, "v": 2.5}, {"k": "c", "n": None, "v": None}],
    [{"k": "a", "n": 3, "v": -0.5}, {"k": "d", "n": 4, "v": 4.0}],
    [{"k": "b", "n": 5, "v": 7.25}, {"k": "é", "n": 6, "v": 0.0}, {"k": None, "n": 7, "v": 1.0}],
]


@pytest.mark.parametrize(
    "keys",
    [["k"], ["n"], ["k", "n"]],
    ids=["string key", "int key", "composite key"],
)
def test_streaming_aggregation(spark: Any, tmp_path: Path, keys: list[str]) -> None:
    stream = Stream(spark, tmp_path, EVENTS, aggregate(keys), conf=SNAPSHOTS)
    for rows in ROWS:
        stream.batch(rows)
    ck = Checkpoint(stream.checkpoint)
    assert ck.committed_batches() == [0, 1, 2]
    (store,) = ck.stores()
    assert (store.operator_name, store.store_name, store.provider) == (
        "stateStoreSave",
        "default",
        "hdfs",
    )
    assert store.partitions == ck.shuffle_partitions
    assert [f.name for f in store.key_schema.fields] == keys
    assert_every_batch_matches(spark, ck)
    assert_snapshots_equal_deltas(ck)
    # the last batch's state, decoded, is the aggregate of every input row (plain Python)
    want: dict[tuple[Any, ...], list[Any]] = {}
    for row in (r for batch in ROWS for r in batch):
        acc = want.setdefault(tuple(row[k] for k in keys), [None, 0, None, None])
        acc[0] = row["n"] if acc[0] is None else acc[0] + (row["n"] or 0)
        acc[1] += 1
        if row["v"] is not None:
            acc[2] = row["v"] if acc[2] is None else min(acc[2], row["v"])
            acc[3] = row["v"] if acc[3] is None else max(acc[3], row["v"])
    got = {}
    for partition in range(store.partitions):
        from sparkiq.checkpoint import RowDecoder

        decoder = RowDecoder(store)
        for key, value in replay(ck.files(store, partition), version_of_batch(2)).items():
            total, rows, low, high, *_ = decoder.value(value)
            got[decoder.key(key)] = [total, rows, low, high]
    assert got == want


def test_windowed_aggregation_with_watermark(spark: Any, tmp_path: Path) -> None:
    def build(frame: Any) -> Any:
        return (
            frame.withWatermark("ts", "10 seconds")
            .groupBy(F.window("ts", "10 seconds"), "k")
            .agg(F.sum("n").alias("total"), F.count("*").alias("rows"))
        )

    stream = Stream(spark, tmp_path, EVENTS, build, output_mode="append", conf=SNAPSHOTS)
    stream.batch(
        [
            {"k": "a", "n": 1, "ts": "2024-01-01T00:00:01"},
            {"k": "b", "n": 2, "ts": "2024-01-01T00:00:05"},
        ]
    )
    stream.batch([{"k": "a", "n": 3, "ts": "2024-01-01T00:00:12"}])
    # moves the watermark past the first window: its rows leave the state
    stream.batch([{"k": "a", "n": 4, "ts": "2024-01-01T00:00:45"}])
    ck = Checkpoint(stream.checkpoint)
    (store,) = ck.stores()
    assert [f.name for f in store.key_schema.fields] == ["window", "k"]
    assert_every_batch_matches(spark, ck)
    last = sparkiq_state(ck, store, ck.committed_batches()[-1])
    assert {key[1] for _, key, _ in last} == {"a"}  # the expired windows are gone
    removed = [
        key
        for p in range(store.partitions)
        for v in ck.files(store, p).versions()
        for key, value in ck.files(store, p).changes(v)
        if value is None
    ]
    assert removed, "no delta removed an expired window"


def test_drop_duplicates(spark: Any, tmp_path: Path) -> None:
    stream = Stream(spark, tmp_path, EVENTS, lambda f: f.dropDuplicates(["k", "n"]), conf=SNAPSHOTS)
    stream.batch([{"k": "a", "n": 1}, {"k": "a", "n": 1}, {"k": "b", "n": 2}])
    stream.batch([{"k": "a", "n": 1}, {"k": "c", "n": 3}])
    ck = Checkpoint(stream.checkpoint)
    (store,) = ck.stores()
    assert store.operator_name == "dedupe"
    assert_every_batch_matches(spark, ck)
    keys = {key for _, key, _ in sparkiq_state(ck, store, 1)}
    assert keys == {("a", 1), ("b", 2), ("c", 3)}


@pytest.mark.parametrize("codec", ["snappy", "zstd", "lzf"])
def test_every_compression_codec(spark: Any, tmp_path: Path, codec: str) -> None:
    conf = {"spark.sql.streaming.stateStore.compression.codec": codec}
    stream = Stream(spark, tmp_path, EVENTS, aggregate(["k"]), conf=conf)
    stream.batch([{"k": f"key{i}", "n": i, "v": i / 4} for i in range(40)])
    ck = Checkpoint(stream.checkpoint)
    (store,) = ck.stores()
    assert store.codec == codec
    assert_every_batch_matches(spark, ck)
    assert len(sparkiq_state(ck, store, 0)) == 40


def test_snapshots_written_by_spark_maintenance(spark: Any, tmp_path: Path) -> None:
    """Spark writes ``N.snapshot`` from its maintenance thread, every
    ``spark.sql.streaming.stateStore.maintenanceInterval`` (60 s unless the session started
    it with less): wait for the first one, then read the state through it."""
    stream = Stream(spark, tmp_path, EVENTS, aggregate(["k"]), conf=SNAPSHOTS)
    stream.batch(ROWS[0])
    stream.batch(ROWS[1])
    ck = Checkpoint(stream.checkpoint)
    deadline = time.monotonic() + 240
    while not list(ck.path.glob("state/0/*/*.snapshot")):
        assert time.monotonic() < deadline, "Spark's maintenance wrote no snapshot"
        time.sleep(0.5)
    assert assert_snapshots_equal_deltas(ck) > 0
    stream.batch(ROWS[2])
    assert_every_batch_matches(spark, ck)


def lz4_java_raw(data: bytes) -> bytes:
    """``data`` in lz4-java's block framing, as stored (uncompressed) blocks: what a test
    needs to hand sparkiq a file with chosen contents."""
    out = []
    for start in range(0, len(data), 1 << 16):
        block = data[start : start + (1 << 16)]
        check = xxhash.xxh32_intdigest(block, seed=0x9747B28C) & 0x0FFFFFFF
        out.append(b"LZ4Block" + struct.pack("<Biii", 0x16, len(block), len(block), check) + block)
    out.append(b"LZ4Block" + struct.pack("<Biii", 0x16, 0, 0, 0))
    return b"".join(out)


def test_row_checksums(spark: Any, tmp_path: Path) -> None:
    conf = {"spark.sql.streaming.stateStore.rowChecksum.enabled": "true"}
    stream = Stream(spark, tmp_path, EVENTS, aggregate(["k"]), conf=conf)
    stream.batch(ROWS[0])
    stream.batch(ROWS[1])
    ck = Checkpoint(stream.checkpoint)
    assert_every_batch_matches(spark, ck)
    (store,) = ck.stores()
    for partition in range(store.partitions):
        delta = store.directory(partition) / "1.delta"
        raw = decompress("lz4", delta.read_bytes())
        if len(raw) > 100:
            break
    # flip one bit of the first value row (after: key size, key, value size, row checksum)
    (key_size,) = struct.unpack_from(">i", raw)
    at = 4 + key_size + 4 + 4 + 8
    corrupted = raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :]
    delta.write_bytes(lz4_java_raw(corrupted))
    delta.with_name(f".{delta.name}.crc").unlink()
    with pytest.raises(CorruptSegmentError, match="row checksum"):
        list(ck.files(store, partition).changes(1))
    delta.write_bytes(lz4_java_raw(raw))  # the same records, reframed: read as before
    assert len(list(ck.files(store, partition).changes(1))) > 0


def test_stream_stream_join_stores(spark: Any, tmp_path: Path) -> None:
    """A join keeps four stores per partition, each in its own directory with its own
    schema file: every one decodes as Spark's State Data Source reads it."""

    def build(frame: Any) -> Any:
        right = frame.select(F.col("k").alias("rk"), F.col("n").alias("rn"))
        return frame.join(right, frame.k == right.rk)

    stream = Stream(spark, tmp_path, EVENTS, build, output_mode="append")
    stream.batch([{"k": "a", "n": 1}, {"k": "b", "n": 2}])
    stream.batch([{"k": "a", "n": 3}])
    ck = Checkpoint(stream.checkpoint)
    stores = ck.stores()
    assert {s.store_name for s in stores} == {
        "left-keyToNumValues",
        "left-keyWithIndexToValue",
        "right-keyToNumValues",
        "right-keyWithIndexToValue",
    }
    for store in stores:
        assert store.operator_name == "symmetricHashJoin"
        assert store.directory(0).name == store.store_name
        for batch in ck.committed_batches():
            expected = spark_state(spark, ck.path, batch, storeName=store.store_name)
            assert expected, store.store_name
            assert sparkiq_state(ck, store, batch) == expected, (store.store_name, batch)
