"""Attach over the RocksDB state store provider: an aggregation and transformWithState
variables, served through ``sparkiq.attach`` and compared with Spark's State Data Source.

The readers are tested alone in test_rocksdb.py and test_tws.py; this checks the whole path
(catalog, replica restore and apply, key encoding, routing, SQL) on what that provider writes.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import pytest

import sparkiq
from sparkiq.checkpoint import Checkpoint
from sparkiq.checkpoint.compression import decompress
from sparkiq.checkpoint.rocksdb import RocksDBEncoding, RocksDBStateFiles
from sparkiq.schema.types import parse_type
from sparkiq.testing import JsonSource
from tests.checkpoint.test_hdfs_differential import lz4_java_raw
from tests.checkpoint.test_rocksdb import rocksdb_conf
from tests.checkpoint.test_tws import BATCHES as TWS_BATCHES
from tests.checkpoint.test_tws import checkpoint, spark_rows  # noqa: F401 (a fixture)

FEEDS = [
    [{"k": "a", "n": 5}, {"k": "b", "n": 7}, {"k": "a", "n": 1}],
    [{"k": "c", "n": -4}, {"k": "a", "n": 10}, {"k": "é", "n": 0}],
    [{"k": f"key-{i}", "n": i} for i in range(30)] + [{"k": "b", "n": 1}],
]


def test_a_rocksdb_aggregation_is_served_as_spark_keeps_it(spark: Any, tmp_path: Path) -> None:
    """Changelog checkpointing on: at every batch, each served row equals the State Data
    Source's, and each key sits in the partition Spark keeps it in."""
    from pyspark.sql import functions as F

    source = JsonSource(tmp_path / "in", "k string, n long")
    with rocksdb_conf(spark, changelog=True):
        query = (
            source.stream(spark)
            .groupBy("k")
            .agg(F.sum("n").alias("total"), F.count("*").alias("rows"))
            .writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .start()
        )
    handle = None
    try:
        for rows in FEEDS:
            source.write(rows)
            query.processAllAvailable()
            batch = int(query.lastProgress["batchId"])
            if handle is None:
                handle = sparkiq.attach(str(tmp_path / "cp"), name="r", store="memory")
            assert handle.wait_for(batch, timeout=120), handle.status()
            (table,) = handle.tables
            frame = spark.read.format("statestore").option("batchId", batch)
            expected = {
                row["key"]["k"]: (row["value"].asDict(), row["partition_id"])
                for row in frame.load(str(tmp_path / "cp")).collect()
            }
            served = {r["k"]: r for r in handle.sql(f"SELECT * FROM {table}").rows}
            assert set(served) == set(expected) and expected
            for key, (value, partition) in expected.items():
                assert served[key]["sum"] == value["sum"]
                assert served[key]["count"] == value["count"]
                assert handle.partition_for_key(table, key) == partition
                assert handle.get(table, key) == served[key]
    finally:
        if handle is not None:
            handle.close()
        query.stop()


def test_transform_with_state_variables_are_served_as_spark_keeps_them(
    spark: Any,
    checkpoint: Path,  # noqa: F811 (test_tws's fixture: changelog checkpointing on and off)
) -> None:
    """Each state variable is a table: value state one row per grouping key, list state one
    row per element, map state one row per user key -- equal to the State Data Source at the
    last batch."""
    last = len(TWS_BATCHES) - 1
    with sparkiq.attach(str(checkpoint), name="t", store="memory") as handle:
        assert handle.wait_for(last, timeout=120), handle.status()
        tables = {t.rsplit("_", 1)[-1]: t for t in handle.tables}
        assert set(tables) == {"count", "items", "latest"}

        count = {
            r["key"]["k"]: r["value"]["n"] for r in spark_rows(spark, checkpoint, last, "count")
        }
        served = handle.sql(f"SELECT * FROM {tables['count']}").rows
        assert {r["k"]: r["n"] for r in served} == count

        items: dict[str, list[tuple[int, str]]] = {}
        for row in spark_rows(spark, checkpoint, last, "items"):  # one row per element, in order
            element = row["list_element"]
            items.setdefault(row["key"]["k"], []).append((element["x"], element["tag"]))
        served = handle.sql(f"SELECT * FROM {tables['items']} ORDER BY k, list_index").rows
        got: dict[str, list[tuple[int, str]]] = {}
        for r in served:
            got.setdefault(r["k"], []).append((r["x"], r["tag"]))
        assert got == items and items["a"] == [(100, "reset"), (7, "t7"), (10, "t10")]

        latest = {
            (r["key"]["k"], r["user_map_key"]["bucket"]): r["user_map_value"]["v"]
            for r in spark_rows(spark, checkpoint, last, "latest")
        }
        served = handle.sql(f"SELECT * FROM {tables['latest']}").rows
        assert latest and {(r["k"], r["bucket"]): r["v"] for r in served} == latest


@pytest.mark.parametrize("checkpoint", [True], ids=["changelog"], indirect=True)
def test_a_cut_short_map_state_key_makes_its_partition_unhealthy(
    spark: Any,
    checkpoint: Path,  # noqa: F811 (test_tws's fixture, changelog checkpointing on)
    tmp_path: Path,
) -> None:
    """One map state key of the newest changelog gets a 3-byte prefix part (its length field
    rewritten, the key's length kept), the lz4 blocks rewritten with their checksums and the
    checksum file removed: only the row framing can tell. The map state table's partition is
    reported unhealthy naming the file and keeps serving its last good batch; the other
    partitions, and the other variables' tables in the same file, go on."""
    copy = tmp_path / "cp"
    shutil.copytree(checkpoint, copy)
    last = len(TWS_BATCHES) - 1
    version = last + 1  # state version N is batch N - 1
    info = Checkpoint(str(copy)).store("latest")
    encoding = RocksDBEncoding(
        parse_type(json.loads(info.schema_json)["keySchema"]),
        column_family="latest",
        prefix_columns=1,
    )
    for broken in range(info.partitions):
        records = RocksDBStateFiles(info.directory(broken), encoding).records(version)
        if any(r.value is not None for r in records):
            break
    key = next(r.key for r in records if r.value is not None)
    path = info.directory(broken) / f"{version}.changelog"
    assert not path.with_suffix(".zip").exists()  # a replica must read this file
    data = decompress("lz4", path.read_bytes())
    at = data.index(key)
    (size,) = struct.unpack_from("<i", data, at)
    assert size > 3 and data.count(key) == 1
    path.write_bytes(lz4_java_raw(data[:at] + struct.pack("<i", 3) + data[at + 4 :]))
    for crc in path.parent.glob(f"*{path.name}*crc"):
        crc.unlink()

    with sparkiq.attach(str(copy), name="t", store="memory") as handle:
        table = next(t for t in handle.tables if t.endswith("_latest"))
        assert not handle.wait_for(last, timeout=5.0)
        deadline = time.monotonic() + 120  # for a hang, not a speed target

        def settled() -> bool:
            return all(
                s.state == "error"
                if (s.table, s.partition) == (table, broken)
                else s.batch_id >= last
                for s in handle.status()
            )

        while not settled():
            assert time.monotonic() < deadline, handle.status()
            time.sleep(0.05)
        status = {(s.table, s.partition): s for s in handle.status()}
        assert status[table, broken].batch_id == last - 1
        assert f"{version}.changelog" in (status[table, broken].error or "")
        assert "prefix-scan key" in (status[table, broken].error or "")

        # no wrong row: the broken partition serves Spark's state of the batch before, the
        # others Spark's newest
        def spark_state(batch: int) -> set[tuple[Any, ...]]:
            return {
                (
                    r["partition_id"],
                    r["key"]["k"],
                    r["user_map_key"]["bucket"],
                    r["user_map_value"]["v"],
                )
                for r in spark_rows(spark, checkpoint, batch, "latest")
            }

        newest, before = spark_state(last), spark_state(last - 1)
        assert {r for r in newest if r[0] == broken} != {r for r in before if r[0] == broken}
        want = {r[1:] for r in newest if r[0] != broken} | {r[1:] for r in before if r[0] == broken}
        served = {(r["k"], r["bucket"], r["v"]) for r in handle.sql(f"SELECT * FROM {table}").rows}
        assert served == want
