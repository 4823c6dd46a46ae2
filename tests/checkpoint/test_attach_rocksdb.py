"""Attach over the RocksDB state store provider: an aggregation and transformWithState
variables, served through ``sparkiq.attach`` and compared with Spark's State Data Source.

The readers are tested alone in test_rocksdb.py and test_tws.py; this checks the whole path
(catalog, replica restore and apply, key encoding, routing, SQL) on what that provider writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sparkiq
from sparkiq.testing import JsonSource
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
