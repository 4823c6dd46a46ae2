"""The sink writes a batch that already sits in the table's partitions without a shuffle.

A streaming aggregation by the key into as many state partitions as the table has
(``spark.sql.shuffle.partitions`` = 4 in the test session) is written in place; other plans
(another partition count, the key columns in another order than the grouping) take the
general path. Both give the table Spark's batch answer, with every key in the segment of
its partition. A batch that is not in the table's partitions although the checkpoint says
so (a key rewritten after the aggregation; or forced in place by the sink's test hook) is
refused by the write tasks and written again after a shuffle in the same micro-batch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from sparkiq import App
from sparkiq.changelog import Changelog
from sparkiq.schema.codec import KeyCodec
from sparkiq.schema.partitioner import Partitioner
from sparkiq.spark.sink import ASSUME_IN_PLACE_ENV, WRITE_ENV
from sparkiq.testing import JsonSource, assert_table_matches

SCHEMA = "k string, g string, n long"


@pytest.fixture(autouse=True)
def written_by_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """This file is about write tasks: small batches would otherwise be written on the
    driver from the second one on (tests/spark/test_sink_driver.py)."""
    monkeypatch.setenv(WRITE_ENV, "tasks")


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


def committed_attempts(state: Path, table: str) -> dict[int, set[int]]:
    """The write attempts (file names) of each committed batch's segments."""
    changelog = Changelog(str(state), table)
    attempts: dict[int, set[int]] = {}
    for batch_id in changelog.committed_batch_ids():
        record = changelog.read_commit(batch_id)
        assert record is not None
        attempts[batch_id] = {info.attempt for info in record.segments.values()}
    return attempts


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sparkiq.sink" and r.levelno == logging.WARNING
    ]


def test_a_key_rewritten_after_the_aggregation_falls_back_to_the_shuffle(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The aggregation's state key is "k" with the table's 4 partitions, so the checkpoint
    says in place, but upper() moves every key to another partition after it: the first
    batch's in-place write is refused by its tasks and written again after a shuffle, in the
    same micro-batch, and the later batches are shuffled at once. No setting needed; the
    table equals Spark's batch answer after every batch."""
    from pyspark.sql import functions as F

    caplog.set_level(logging.INFO, logger="sparkiq.sink")
    source = JsonSource(tmp_path / "in", SCHEMA)
    state = tmp_path / "state"
    upper = (
        source.stream(spark).groupBy("k").agg(F.sum("n").alias("n")).withColumn("k", F.upper("k"))
    )
    app = App(spark, state_dir=str(state), name="rewrite", snapshot_every=None)
    app.materialize("upper", upper, key="k", partitions=4)
    app.start()
    try:
        for batch in range(3):
            source.feed(app, rows(batch))
            truth = (
                source.batch(spark)
                .groupBy("k")
                .agg(F.sum("n").alias("n"))
                .withColumn("k", F.upper("k"))
            )
            assert_table_matches(app, "upper", truth)
        assert app.get("upper", "K3") is not None  # routed by the key's partition
        assert not app.tables["upper"].sink.layout().in_place
    finally:
        app.stop()
    # batch 0 was committed from its second write (the shuffled one), the later ones from
    # their only (shuffled) write; the refusal was logged once
    assert committed_attempts(state, "upper") == {0: {1}, 1: {0}, 2: {0}}
    warned = refusals(caplog)
    assert len(warned) == 1, warned
    assert "every later batch of this query" in warned[0], warned[0]
    assert "holds rows of partitions" in warned[0], warned[0]
    assert assert_keys_in_their_partitions(state, "upper", ["string"]) > 23


def test_a_batch_wrongly_written_in_place_is_refused_and_written_after_a_shuffle(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The table has 3 partitions and the aggregation's state 4, so the batch is not in the
    table's partitions; forced in place, the tasks holding rows of another partition than
    their own refuse it (the per-task check), and the sink writes the batch again after a
    shuffle in the same micro-batch: committed once, from the second attempt's segments, and
    the table is Spark's batch answer."""
    from pyspark.sql import functions as F

    caplog.set_level(logging.INFO, logger="sparkiq.sink")
    source = JsonSource(tmp_path / "in", SCHEMA)
    state = tmp_path / "state"
    stream = source.stream(spark).groupBy("k").agg(F.sum("n").alias("n"))
    app = App(spark, state_dir=str(state), name="wrongtask", snapshot_every=None)
    app.materialize("sums", stream, key="k", partitions=3)
    monkeypatch.setenv(ASSUME_IN_PLACE_ENV, "sums:1")
    app.start()
    try:
        source.feed(app, rows(0))  # batch 0: not forced
        source.feed(app, rows(1))
        assert_table_matches(
            app, "sums", source.batch(spark).groupBy("k").agg(F.sum("n").alias("n"))
        )
    finally:
        app.stop()
    assert committed_attempts(state, "sums") == {0: {0}, 1: {1}}
    warned = refusals(caplog)
    assert len(warned) == 1 and "batch 1 could not be written without a shuffle" in warned[0], (
        warned
    )
    assert ASSUME_IN_PLACE_ENV in warned[0] and "SPARKIQ_SINK_SHUFFLE=always" in warned[0]
    assert assert_keys_in_their_partitions(state, "sums", ["string"]) > 23
