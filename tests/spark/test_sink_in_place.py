"""The sink writes a batch that already sits in the table's partitions without a shuffle.

A streaming aggregation by the key into as many state partitions as the table has
(``spark.sql.shuffle.partitions`` = 4 in the test session) is written in place; other plans
(another partition count, the key columns in another order than the grouping) take the
general path. Both give the table Spark's batch answer, with every key in the segment of
its partition. A batch forced in place when it is not (the sink's test hook) fails before
anything of it is committed, and a restart without the hook commits it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkiq import App
from sparkiq.changelog import Changelog
from sparkiq.errors import SparkiqError
from sparkiq.schema.codec import KeyCodec
from sparkiq.schema.partitioner import Partitioner
from sparkiq.spark.sink import ASSUME_IN_PLACE_ENV
from sparkiq.testing import JsonSource, assert_table_matches

SCHEMA = "k string, g string, n long"


def rows(batch: int, count: int = 60) -> list[dict[str, Any]]:
    return [
        {"k": f"k{(i * 7 + batch) % 23}", "g": f"g{i % 3}", "n": i + batch} for i in range(count)
    ]


def assert_keys_in_their_partitions(state: Path, table: str, key_types: list[str]) -> int:
    """Every key of every committed segment belongs (by Spark's hash, computed in Python)
    to the segment's partition; returns the number of keys seen."""
    changelog = Changelog(str(state), table)
    manifest = changelog.manifest()
    codec = KeyCodec(manifest.schema)
    partitioner = Partitioner(key_types, manifest.partitions)
    seen = 0
    for batch_id in changelog.committed_batch_ids():
        record = changelog.read_commit(batch_id)
        assert record is not None
        for partition in record.segments:
            keys, _ = changelog.read_segment(record, partition)
            for key in keys:
                assert partitioner(codec.decode(key)) == partition, (table, batch_id, key)
                seen += 1
    return seen


def test_in_place_and_shuffled_tables_equal_batch_mode(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    source = JsonSource(tmp_path / "in", SCHEMA)
    state = tmp_path / "state"
    stream = source.stream(spark)
    by_k = stream.groupBy("k").agg(F.sum("n").alias("n"), F.count("*").alias("c"))
    by_kg = stream.groupBy("k", "g").agg(F.sum("n").alias("n"))
    app = App(spark, state_dir=str(state), name="inplace", snapshot_every=None)
    app.materialize("in_place", by_k, key="k", partitions=4)  # 4 = shuffle partitions
    app.materialize("other_count", by_k, key="k", partitions=3)
    app.materialize("other_order", by_kg, key=["g", "k"], partitions=4)
    app.materialize("same_order", by_kg, key=["k", "g"], partitions=4)
    app.start()
    try:
        for batch in range(2):
            source.feed(app, rows(batch))
        layouts = {name: table.sink.layout() for name, table in app.tables.items()}
        assert {name: layout.in_place for name, layout in layouts.items()} == {
            "in_place": True,
            "other_count": False,
            "other_order": False,
            "same_order": True,
        }, layouts
        assert "4 partitions, the table 3" in layouts["other_count"].reason
        assert "groups by ['k', 'g'], the table's key is ['g', 'k']" in (
            layouts["other_order"].reason
        )
        truth_k = (
            source.batch(spark).groupBy("k").agg(F.sum("n").alias("n"), F.count("*").alias("c"))
        )
        truth_kg = source.batch(spark).groupBy("k", "g").agg(F.sum("n").alias("n"))
        # a key each table holds (batch 0 has k3, and k3 with g0)
        for name, truth, key in (
            ("in_place", truth_k, "k3"),
            ("other_count", truth_k, "k3"),
            ("other_order", truth_kg, ("g0", "k3")),
            ("same_order", truth_kg, ("k3", "g0")),
        ):
            assert_table_matches(app, name, truth)
            assert app.get(name, key) is not None, (name, key)  # routed by the key's partition
    finally:
        app.stop()
    for name, types in (
        ("in_place", ["string"]),
        ("other_count", ["string"]),
        ("other_order", ["string", "string"]),
        ("same_order", ["string", "string"]),
    ):
        assert assert_keys_in_their_partitions(state, name, types) > 23


def test_a_batch_wrongly_written_in_place_fails_and_commits_nothing(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table has 3 partitions and the aggregation's state 4, so the batch is not in the
    table's partitions; forcing it in place must fail every task holding rows of another
    partition than its own, and the batch must not be committed."""
    from pyspark.sql import functions as F

    source = JsonSource(tmp_path / "in", SCHEMA)
    state = tmp_path / "state"

    def start() -> App:
        stream = source.stream(spark).groupBy("k").agg(F.sum("n").alias("n"))
        app = App(spark, state_dir=str(state), name="wrongtask", snapshot_every=None)
        app.materialize("sums", stream, key="k", partitions=3)
        return app.start()

    monkeypatch.setenv(ASSUME_IN_PLACE_ENV, "sums:1")
    app = start()
    try:
        source.feed(app, rows(0))  # batch 0: not forced
        source.write(rows(1))
        with pytest.raises(SparkiqError) as failed:
            app.process_all_available()
    finally:
        app.stop()
    message = str(failed.value)
    assert "was written without a shuffle" in message, message[-3000:]
    assert "SPARKIQ_SINK_SHUFFLE=always" in message, message[-3000:]
    changelog = Changelog(str(state), "sums")
    assert changelog.committed_batch_ids() == [0]

    monkeypatch.delenv(ASSUME_IN_PLACE_ENV)
    app = start()
    try:
        app.process_all_available(timeout=120)
        assert changelog.committed_batch_ids() == [0, 1]
        assert_table_matches(
            app, "sums", source.batch(spark).groupBy("k").agg(F.sum("n").alias("n"))
        )
    finally:
        app.stop()
    assert assert_keys_in_their_partitions(state, "sums", ["string"]) > 23
