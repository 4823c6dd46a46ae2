"""Small batches are written on the driver: the tagged batch is collected as Arrow and the
driver writes its segments with the write tasks' own function, with no Python stage in
Spark (``SPARKIQ_SINK_WRITE``: ``auto``, ``tasks``, ``driver``).

``auto`` decides from the changelog alone: the table's previous batch at most
``DRIVER_ROWS`` rows. Whoever writes them, the segments are the same bytes and the table is
Spark's batch answer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import sparkiq.spark.sink as sink
from sparkiq import App
from sparkiq.changelog import Changelog
from sparkiq.errors import ConfigError
from sparkiq.testing import JsonSource, assert_table_matches
from tests.spark.test_sink_in_place import assert_keys_in_their_partitions, rows

SCHEMA = "k string, g string, n long"


def written(caplog: pytest.LogCaptureFixture, table: str) -> list[str]:
    """Where each batch of ``table`` was written, from the sink's DEBUG record, in order."""
    return [
        r.sparkiq_written  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "sparkiq.sink" and hasattr(r, "sparkiq_written") and table in r.getMessage()
    ]


def _run(spark: Any, tmp_path: Path, name: str, batches: int) -> tuple[JsonSource, Path, Any]:
    from pyspark.sql import functions as F

    source = JsonSource(tmp_path / "in", SCHEMA)
    state = tmp_path / "state"
    sums = source.stream(spark).groupBy("k").agg(F.sum("n").alias("n"), F.count("*").alias("c"))
    app = App(spark, state_dir=str(state), name=name, snapshot_every=None)
    app.materialize("sums", sums, key="k", partitions=3)
    app.start()
    try:
        for batch in range(batches):
            source.feed(app, rows(batch))
            truth = (
                source.batch(spark).groupBy("k").agg(F.sum("n").alias("n"), F.count("*").alias("c"))
            )
            assert_table_matches(app, "sums", truth)
    finally:
        app.stop()
    return source, state, app


def test_auto_writes_small_batches_on_the_driver(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(sink.WRITE_ENV, raising=False)
    caplog.set_level(logging.DEBUG, logger="sparkiq.sink")
    _, state, _ = _run(spark, tmp_path, "small", 3)
    # batch 0 has no previous batch to go by: write tasks; the later ones are small
    assert written(caplog, "sums") == ["after a shuffle", "on the driver", "on the driver"]
    assert assert_keys_in_their_partitions(state, "sums", ["string"]) > 23


def test_auto_goes_back_to_tasks_after_a_large_batch(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(sink.WRITE_ENV, raising=False)
    monkeypatch.setattr(sink, "DRIVER_ROWS", 10)  # every batch here has 23 keys: "large"
    caplog.set_level(logging.DEBUG, logger="sparkiq.sink")
    _run(spark, tmp_path, "large", 2)
    assert written(caplog, "sums") == ["after a shuffle", "after a shuffle"]


def test_the_setting_decides_and_the_bytes_are_the_same_wherever_written(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sparkiq.sink")
    digests = {}
    for where, expected in (("driver", "on the driver"), ("tasks", "after a shuffle")):
        monkeypatch.setenv(sink.WRITE_ENV, where)
        caplog.clear()
        _, state, _ = _run(spark, tmp_path / where, f"same_{where}", 2)
        assert written(caplog, "sums") == [expected, expected]  # batch 0 too
        changelog = Changelog(str(state), "sums")
        assert changelog.committed_batch_ids() == [0, 1]
        digests[where] = {
            (b, p): info.sha256
            for b in changelog.committed_batch_ids()
            for p, info in changelog.read_commit(b).segments.items()  # type: ignore[union-attr]
        }
    assert digests["driver"] == digests["tasks"]


def test_a_bad_setting_is_refused_where_the_app_runs(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import functions as F

    monkeypatch.setenv(sink.WRITE_ENV, "executors")
    source = JsonSource(tmp_path / "in", SCHEMA)
    app = App(spark, state_dir=str(tmp_path / "state"), name="bad", snapshot_every=None)
    app.materialize("sums", source.stream(spark).groupBy("k").agg(F.sum("n")), key="k")
    try:
        with pytest.raises(ConfigError, match="SPARKIQ_SINK_WRITE must be 'auto', 'tasks'"):
            app.start()
    finally:
        app.stop()


def test_the_tag_is_sparks_hash_of_key_columns_named_anyhow(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The tag column is one SQL expression (``sink.tag_expression``): a composite key whose
    column names hold spaces is quoted right, and every key lands in the segment of the
    partition Spark's hash gives it (computed in Python), both by write tasks and on the
    driver; the table is Spark's batch answer."""
    from pyspark.sql import functions as F

    monkeypatch.delenv(sink.WRITE_ENV, raising=False)
    caplog.set_level(logging.DEBUG, logger="sparkiq.sink")
    key = ["the k", "g 2"]

    def sums(df: Any) -> Any:
        named = df.withColumnRenamed("k", key[0]).withColumnRenamed("g", key[1])
        return named.groupBy(*(F.col(sink._quoted(c)) for c in key)).agg(F.sum("n").alias("n"))

    source = JsonSource(tmp_path / "in", SCHEMA)
    state = tmp_path / "state"
    app = App(spark, state_dir=str(state), name="odd", snapshot_every=None)
    app.materialize("odd", sums(source.stream(spark)), key=key, partitions=3)
    app.start()
    try:
        for batch in range(3):
            source.feed(app, rows(batch))
            assert_table_matches(app, "odd", sums(source.batch(spark)))
    finally:
        app.stop()
    assert written(caplog, "odd") == ["after a shuffle", "on the driver", "on the driver"]
    assert assert_keys_in_their_partitions(state, "odd", ["string", "string"]) > 23


def test_the_tag_expression_quotes_every_name() -> None:
    from sparkiq.changelog import TableManifest
    from sparkiq.schema.types import TableSchema

    schema = TableSchema.from_spark_json(
        '{"type":"struct","fields":[{"name":"a`b","type":"string","nullable":true,'
        '"metadata":{}},{"name":"c","type":"long","nullable":true,"metadata":{}}]}',
        ("a`b",),
        None,
    )
    manifest = TableManifest("t", schema, partitions=6)
    assert sink.tag_expression(manifest) == "pmod(hash(`a``b`), 6) AS `__sparkiq_partition`"
