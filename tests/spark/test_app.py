"""The embedded App: bad input is refused with clear errors and nothing written; an App started
on an existing state_dir resumes where it stopped; complete mode replaces tables."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from sparkiq import (
    App,
    ConfigError,
    InvalidQueryError,
    KeyQuery,
    LayoutMismatchError,
    RangeQuery,
    SchemaError,
    StateQueryRequest,
    UnknownStoreError,
)
from sparkiq.changelog import Changelog, open_storage
from sparkiq.changelog.writer_status import read_writer_status
from tests.changelog.helpers import wait_for_writer


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.fixture
def stream(spark: Any, tmp_path: Path) -> Any:
    source = tmp_path / "in"
    source.mkdir()
    return spark.readStream.schema(
        "k string, n long, flag boolean, tags array<string>, span interval day to second"
    ).json(str(source))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"key": "missing"}, SchemaError, r"key column 'missing' is not a column.*\['k', 'n'"),
        ({"key": ["k", "k"]}, ConfigError, "twice"),
        ({"key": []}, ConfigError, "non-empty list"),
        ({"key": "tags"}, SchemaError, "array<string>, which cannot be a key"),
        ({"key": "k", "partitions": 0}, ConfigError, "positive int, got 0"),
        ({"key": "k", "partitions": -3}, ConfigError, "positive int, got -3"),
        ({"key": "k", "partitions": "8"}, ConfigError, "positive int, got '8'"),
        ({"key": "k", "partitions": 2.5}, ConfigError, "positive int, got 2.5"),
        ({"key": "k", "partitions": True}, ConfigError, "positive int, got True"),
        ({"key": "k", "partitions": 100_000}, ConfigError, "maximum"),
        ({"key": "k", "window": "n"}, SchemaError, "window column 'n' has type bigint"),
        ({"key": "k", "tombstone": "n"}, SchemaError, "must be boolean"),
        ({"key": "k", "tombstone": "nope"}, SchemaError, "tombstone column 'nope'"),
        ({"key": "k", "output_mode": "upsert"}, ConfigError, "output_mode must be one of"),
        ({"key": "k"}, SchemaError, "'span' has type interval day to second, which sparkiq cannot"),
    ],
)
def test_materialize_refuses_bad_arguments_and_writes_nothing(
    spark: Any, stream: Any, tmp_path: Path, kwargs: dict[str, Any], error: type, message: str
) -> None:
    state = tmp_path / "state"
    app = App(spark, state_dir=str(state))
    with pytest.raises(error, match=message):
        app.materialize("t", stream, **kwargs)
    assert tree(state) == []
    assert app.tables == {}


def test_bad_table_names_and_non_streaming_frames(spark: Any, stream: Any, tmp_path: Path) -> None:
    stream = stream.drop("span")
    app = App(spark, state_dir=str(tmp_path / "state"))
    for name in ["", "1abc", "a-b", "x" * 200, "../etc"]:
        with pytest.raises(ConfigError, match="invalid table name"):
            app.materialize(name, stream, key="k")
    with pytest.raises(ConfigError, match="not streaming"):
        app.materialize("t", spark.range(3), key="id")
    with pytest.raises(ConfigError, match="needs a DataFrame"):
        app.materialize("t", [1, 2], key="k")
    with pytest.raises(ConfigError, match="needs a SparkSession"):
        App("not a session", state_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="non-empty path"):
        App(spark, state_dir="")
    app.materialize("t", stream, key="k")
    with pytest.raises(ConfigError, match="already materialized"):
        app.materialize("t", stream, key="k")
    with pytest.raises(ConfigError, match="not started"):
        app.process_all_available()
    with pytest.raises(ConfigError, match="call start"):
        app.get("t", "a")


def test_queries_need_the_right_store_and_key(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (source / "0.json").write_text('{"a": 1, "b": "x", "v": 5}\n')
    df = spark.readStream.schema("a int, b string, v long").json(str(source))
    app = App(spark, state_dir=str(tmp_path / "state"))
    app.materialize("pairs", df, key=["a", "b"], partitions=2)
    app.start()
    try:
        app.process_all_available()
        assert app.get("pairs", (1, "x")) == {"a": 1, "b": "x", "v": 5}
        assert app.get("pairs", [1, "x"]) == {"a": 1, "b": "x", "v": 5}
        with pytest.raises(UnknownStoreError, match=r"'nope'.*\['pairs'\]"):
            app.get("nope", 1)
        with pytest.raises(UnknownStoreError, match="nope"):
            app.query(StateQueryRequest.in_store("nope").with_query(KeyQuery.with_key(1)))
        with pytest.raises(InvalidQueryError, match=r"2 columns \['a', 'b'\]"):
            app.get("pairs", 1)
        with pytest.raises(InvalidQueryError, match="2 columns"):
            app.get("pairs", (1, "x", 3))
        with pytest.raises(InvalidQueryError, match="key column 'a' is int"):
            app.get("pairs", ("1", "x"))
        with pytest.raises(InvalidQueryError, match=r"outside \[-2147483648, 2147483647\]"):
            app.get("pairs", (2**40, "x"))
    finally:
        app.stop()


def test_another_layout_in_state_dir_is_refused_before_anything_runs(
    spark: Any, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (source / "0.json").write_text('{"k": "a", "n": 1}\n')
    df = spark.readStream.schema("k string, n long").json(str(source))
    state = tmp_path / "state"
    first = App(spark, state_dir=str(state))
    first.materialize("t", df, key="k", partitions=4)
    first.start()
    first.process_all_available()
    first.stop()
    before = {p: (state / p).stat().st_mtime_ns for p in tree(state) if (state / p).is_file()}

    second = App(spark, state_dir=str(state))
    with pytest.raises(LayoutMismatchError, match="partitions 8 != 4") as info:
        second.materialize("t", df, key="k", partitions=8)
    assert "new name" in str(info.value)
    with pytest.raises(LayoutMismatchError, match="key columns"):
        second.materialize("t", df, key=["k", "n"], partitions=4)
    other_schema = spark.readStream.schema("k string, n double").json(str(source))
    with pytest.raises(LayoutMismatchError, match="schema"):
        second.materialize("t", other_schema, key="k", partitions=4)
    after = {p: (state / p).stat().st_mtime_ns for p in tree(state) if (state / p).is_file()}
    assert after == before


def write_counts(folder: Path, index: int, keys: list[str]) -> None:
    (folder / f"{index:03d}.json").write_text(
        "\n".join(json.dumps({"k": k, "n": 1}) for k in keys) + "\n"
    )


def test_restart_on_an_existing_state_dir_resumes(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    source = tmp_path / "in"
    source.mkdir()
    state = tmp_path / "state"

    def start() -> App:
        df = spark.readStream.schema("k string, n long").json(str(source))
        app = App(spark, state_dir=str(state))
        app.materialize("counts", df.groupBy("k").agg(F.sum("n").alias("n")), key="k", partitions=3)
        return app.start()

    write_counts(source, 0, ["a", "b", "a"])
    app = start()
    app.process_all_available()
    assert app.get("counts", "a") == {"k": "a", "n": 2}
    # the writer's side, as the driver writes it into the changelog: running, then stopped
    running = wait_for_writer(str(state), "counts", "running", batch_id=0)
    committed = Changelog(str(state), "counts").read_commit(0)
    assert committed is not None
    assert running.committed_at == committed.committed_at
    assert running.progress_batch_id is not None and running.progress_batch_id >= 0
    assert running.batch_duration_ms is not None and running.batch_duration_ms > 0
    assert running.input_rows_per_second is not None and running.reason is None
    assert running.query_name == "sparkiq.sparkiq.counts"
    app.stop()
    stopped = read_writer_status(open_storage(str(state)), "counts")
    assert stopped is not None and stopped.state == "stopped" and stopped.batch_id == 0
    assert stopped.written_at >= running.written_at and stopped.reason is None

    write_counts(source, 1, ["a", "c"])
    app = start()
    try:
        # Replicas come back from their local files before Spark processes anything new.
        assert app.node is not None
        assert {s.batch_id for s in app.node.status()} == {0}
        app.process_all_available()
        assert app.get("counts", "a") == {"k": "a", "n": 3}
        assert app.get("counts", "c") == {"k": "c", "n": 1}
        assert {s.batch_id for s in app.node.status()} == {1}
        commits = sorted(os.listdir(state / "tables" / "counts" / "commits"))
        assert commits == [f"{i:020d}.json" for i in range(2)]
    finally:
        app.stop()


def test_stop_ends_with_the_running_batch_when_batches_run_back_to_back(
    spark: Any, tmp_path: Path
) -> None:
    """Batches longer than their trigger interval start one as the other ends, so the query
    is never seen between two: ``stop`` waits for the batch running when it is called, not
    for its ``timeout`` (the demo's Ctrl-C took 10 s so on a busy machine)."""
    from pyspark.sql import functions as F

    # each row holds its batch 50 ms in a Python UDF, ten rows a second arrive, and a batch
    # is due every 100 ms: every batch runs late, and new rows wait for the next at its end
    slow = F.udf(lambda v: time.sleep(0.05) or v, "long")
    rows = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
    df = rows.select((F.col("value") % 3).cast("string").alias("k"), slow("value").alias("n"))
    app = App(spark, state_dir=str(tmp_path / "state"))
    app.materialize(
        "late",
        df.groupBy("k").agg(F.sum("n").alias("n")),
        key="k",
        partitions=2,
        trigger={"processingTime": "100 milliseconds"},
    )
    app.start()
    changelog = Changelog(str(tmp_path / "state"), "late")
    try:
        deadline = time.monotonic() + 300
        while len(changelog.committed_batch_ids()) < 3:  # running, batch after batch
            assert time.monotonic() < deadline, "three batches did not commit in 300 s"
            time.sleep(0.2)
    finally:
        at_call = len(changelog.committed_batch_ids())
        app.stop(timeout=120)
    # The batch running at the call, and at most the one that started as it ended: a
    # foreachBatch already running can finish before the stop takes hold
    # (sparkiq.spark.table_query).
    # Waiting for a pause between batches instead, the stop let 3 and 6 more commit in two
    # runs here.
    assert len(changelog.committed_batch_ids()) - at_call <= 2, "stop waited for a pause"


def test_lost_checkpoint_is_refused(spark: Any, tmp_path: Path) -> None:
    import shutil

    source = tmp_path / "in"
    source.mkdir()
    write_counts(source, 0, ["a"])
    state = tmp_path / "state"
    df = spark.readStream.schema("k string, n long").json(str(source))
    app = App(spark, state_dir=str(state))
    app.materialize("t", df, key="k")
    app.start()
    app.process_all_available()
    app.stop()
    shutil.rmtree(state / "checkpoints" / "t")
    again = App(spark, state_dir=str(state))
    again.materialize("t", df, key="k")
    with pytest.raises(ConfigError, match=r"checkpoint .* is gone"):
        again.start()


def test_complete_mode_replaces_the_table(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    source = tmp_path / "in"
    source.mkdir()
    df = spark.readStream.schema("k string, n long").json(str(source))
    # Keys whose running total is odd: a key leaves the table when its total turns even.
    odd = df.groupBy("k").agg(F.sum("n").alias("n")).filter("n % 2 = 1")
    app = App(spark, state_dir=str(tmp_path / "state"))
    app.materialize("odd", odd, key="k", partitions=2, output_mode="complete")
    app.start()
    try:
        write_counts(source, 0, ["a", "b", "b", "c"])
        app.process_all_available()
        scan = app.query(StateQueryRequest.in_store("odd").with_query(RangeQuery.with_no_bounds()))
        keys = sorted(k for r in scan.partition_results.values() for k, _ in r.result)
        assert keys == ["a", "c"]
        write_counts(source, 1, ["a", "b"])
        app.process_all_available()
        scan = app.query(StateQueryRequest.in_store("odd").with_query(RangeQuery.with_no_bounds()))
        keys = sorted(k for r in scan.partition_results.values() for k, _ in r.result)
        assert keys == ["b", "c"]
        assert app.get("odd", "a") is None
    finally:
        app.stop()


def test_snapshots_and_retention_run_as_spark_jobs(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from sparkiq import Node
    from sparkiq.changelog import Changelog
    from sparkiq.changelog.snapshot import list_snapshots

    source = tmp_path / "in"
    source.mkdir()
    state = tmp_path / "state"
    df = (
        spark.readStream.schema("k string, n long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
    )
    app = App(spark, state_dir=str(state), snapshot_every=2, retention=0)
    app.materialize("sums", df.groupBy("k").agg(F.sum("n").alias("n")), key="k", partitions=3)
    app.start()
    try:
        truth: dict[str, int] = {}
        for index in range(5):
            keys = [f"k{(index * 3 + i) % 7}" for i in range(4)]
            write_counts(source, index, keys)
            for key in keys:
                truth[key] = truth.get(key, 0) + 1
        app.process_all_available()
        app.compact()  # waits for any background run, then snapshots the newest batch
        changelog = Changelog(str(state), "sums")
        newest = changelog.committed_batch_ids()[-1]
        assert newest == 4
        assert all(list_snapshots(changelog, p)[-1].batch_id == newest for p in range(3))
        assert changelog.committed_batch_ids() == [newest]  # retention 0: history is gone
        assert not list(
            (state / "tables" / "sums" / "segments").glob("*/0000000000000000000[0-3].arrow")
        )
        with Node(str(state), node_id="fresh", store="memory") as node:
            node.poll_once()
            assert {k: node.get("sums", k) for k in truth} == {
                k: {"k": k, "n": n} for k, n in truth.items()
            }
        with pytest.raises(UnknownStoreError, match="nope"):
            app.compact("nope")
    finally:
        app.stop()


def test_maintenance_options_are_validated(spark: Any, tmp_path: Path) -> None:
    for bad in [0, -1, 1.5, True, "10"]:
        with pytest.raises(ConfigError, match="snapshot_every"):
            App(spark, state_dir=str(tmp_path), snapshot_every=bad)  # type: ignore[arg-type]
    for bad_retention in [-1, "1h", True]:
        with pytest.raises(ConfigError, match="retention"):
            App(spark, state_dir=str(tmp_path), retention=bad_retention)  # type: ignore[arg-type]
