"""The App under Spark Connect: the same pipelines, answers and maintenance as with a classic
session. The Connect server is a second JVM (the `connect_spark` fixture starts it once for
this module's tests), so the tests here are few and each covers much.
"""

from __future__ import annotations

import pathlib
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from sparkiq import App, Node, RangeQuery, StateQueryRequest
from sparkiq.changelog import Changelog, open_storage
from sparkiq.changelog.snapshot import list_snapshots
from sparkiq.changelog.writer_status import read_writer_status
from sparkiq.spark.sink import TableSink, collect_arrow
from tests.changelog.helpers import wait_for_writer
from tests.spark.test_differential import (
    SCHEMA,
    batch_truth,
    full_scan,
    materialize_tables,
    normalize,
    write_orders,
)

# Starts JVMs or processes of its own: scheduled first (tests/conftest.py).
pytestmark = pytest.mark.slow

#: The differential pipeline's tables but its windowed one (materialize_tables(per_window=False)).
TABLES = ("by_product", "by_user_day", "orders")


def test_the_sink_is_plain_data(spark: Any, tmp_path: Path) -> None:
    """What foreachBatch ships holds no App, node, lock or session: it pickles with the
    standard pickle and keeps its layout."""
    from pyspark.sql import functions as F

    source = tmp_path / "in"
    source.mkdir()
    df = spark.readStream.schema("k string, n long").json(str(source))
    app = App(spark, state_dir=str(tmp_path / "state"))
    app.materialize("sums", df.groupBy("k").agg(F.sum("n").alias("n")), key="k", partitions=3)
    app.start(local_node=True)
    try:
        sink = app.tables["sums"].sink
        assert isinstance(sink, TableSink)
        copy = pickle.loads(pickle.dumps(sink))
        assert vars(copy).keys() == {
            "state_dir",
            "checkpoint_location",
            "manifest",
            "write_tasks",
            "always_shuffle",
            "write_where",  # auto, tasks or driver: read from SPARKIQ_SINK_WRITE
            "_layout",  # None, or the decision (checkpoint or refused batch; a frozen dataclass)
        }
        assert copy.manifest == sink.manifest and copy.state_dir == str(tmp_path / "state")
        assert copy.write_tasks == 3  # min(partitions, spark.sql.shuffle.partitions = 4)
    finally:
        app.stop()


def test_the_driver_collects_a_batch_in_one_round_trip_under_connect(connect_spark: Any) -> None:
    """collect_arrow, the sink's collect of a small batch, gives toArrow's rows and types of
    values without first asking the server for the schema (an AnalyzePlan call per
    micro-batch): the client still does not know the DataFrame's schema afterwards."""
    from pyspark.sql import functions as F

    def batch() -> Any:
        ids = connect_spark.range(40)
        return ids.select(
            F.col("id").cast("string").alias("k"),
            (F.col("id") * 3).alias("n"),
            F.timestamp_seconds(F.col("id") * 86_399).alias("ts"),
            F.pmod(F.hash(F.col("id").cast("string")), F.lit(4)).alias("p"),
        )

    df = batch()
    collected = collect_arrow(df)
    assert df._cached_schema is None  # toArrow would have fetched it
    assert collected.num_rows == 40
    assert collected.to_pylist() == batch().toArrow().to_pylist()


def test_readme_quickstart_and_ddl_under_connect(
    connect_spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from pyspark.sql import functions as F

    monkeypatch.chdir(tmp_path)
    spark = connect_spark
    # The README's quickstart, word for word but for the session and the state_dir.
    pathlib.Path("orders").mkdir(exist_ok=True)
    pathlib.Path("orders/1.json").write_text('{"product": "p-17", "amount": 123.0}\n')
    orders = spark.readStream.schema("product string, amount double").json(str(tmp_path / "orders"))
    app = App(spark, state_dir=str(tmp_path / "shop-state"), name="shop")
    app.materialize(
        "revenue_by_product",
        orders.groupBy("product").agg(F.sum("amount").alias("revenue")),
        key="product",
        partitions=8,
    )
    app.start()
    try:
        app.process_all_available()
        assert app.get("revenue_by_product", "p-17") == {"product": "p-17", "revenue": 123.0}
        # the writer status record, from query.isActive/lastProgress under Connect
        running = wait_for_writer(
            str(tmp_path / "shop-state"), "revenue_by_product", "running", batch_id=0
        )
        assert running.progress_batch_id is not None
        assert running.batch_duration_ms is not None and running.batch_duration_ms > 0
        res = app.query(
            StateQueryRequest.in_store("revenue_by_product").with_query(
                RangeQuery.with_range("p-10", "p-19")
            )
        )
        rows = [row for r in res.partition_results.values() for _, row in r.result]
        assert rows == [{"product": "p-17", "revenue": 123.0}]
        assert res.position.partition_offsets("revenue_by_product")
        assert app.sql("SELECT product, revenue FROM revenue_by_product WHERE revenue > 100").rows
        # DDL on the writer: a table defined in SQL over a registered stream.
        app.register_stream("orders", orders)
        app.sql(
            "CREATE TABLE big_orders WITH (KEY = 'product', PARTITIONS = 2) AS "
            "SELECT product, count(*) AS n, max(amount) AS top FROM orders "
            "WHERE amount > 10 GROUP BY product"
        )
        pathlib.Path("orders/2.json").write_text(
            '{"product": "p-17", "amount": 5.0}\n{"product": "p-3", "amount": 50.0}\n'
        )
        app.process_all_available()
        assert app.get("revenue_by_product", "p-17") == {"product": "p-17", "revenue": 128.0}
        assert app.get("big_orders", "p-17") == {"product": "p-17", "n": 1, "top": 123.0}
        assert app.get("big_orders", "p-3") == {"product": "p-3", "n": 1, "top": 50.0}
        assert [(r["table"], r["defined_by"]) for r in app.sql("SHOW TABLES").rows] == [
            ("big_orders", "sql"),
            ("revenue_by_product", "materialize"),
        ]
        app.sql("DROP TABLE big_orders")
        assert "big_orders" not in app.tables
        dropped = read_writer_status(open_storage(str(tmp_path / "shop-state")), "big_orders")
        assert dropped is not None and dropped.state == "stopped" and dropped.batch_id >= 0
    finally:
        app.stop()


def test_differential_pipeline_snapshots_and_compact_under_connect(
    connect_spark: Any, tmp_path: Path
) -> None:
    """Three tables equal Spark batch mode after every batch; process_all_available returns
    only once the local replicas applied the newest commit; snapshots are written in the
    background and by compact(), as DataFrame jobs, and a fresh node restores from them."""
    spark = connect_spark
    source = tmp_path / "in"
    source.mkdir()
    state = tmp_path / "state"
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    app = App(spark, state_dir=str(state), name="diff", snapshot_every=2, retention=None)
    materialize_tables(app, stream, per_window=False)
    app.start()
    rng = random.Random(2027)
    try:
        for index in range(3):
            write_orders(source, index, rng)
            app.process_all_available()
            # No waiting here: the replicas already hold the newest commit of every table.
            assert app.node is not None
            for name in TABLES:
                newest = Changelog(str(state), name).committed_batch_ids()[-1]
                assert newest == index == app.tables[name].committed_batch_id
                offsets = app.node.position(name).partition_offsets(name)
                assert set(offsets.values()) == {index}, (name, offsets)
            truth = batch_truth(spark, source, TABLES)
            for store in TABLES:
                scanned = {
                    k: normalize(v) for k, v in full_scan(app, store, RangeQuery.with_no_bounds())
                }
                assert scanned == {k: normalize(v) for k, v in truth[store].items()}, store
            for key, row in truth["by_product"].items():
                assert normalize(app.get("by_product", key)) == normalize(row)

        maintenance = app.tables["orders"].maintenance
        assert maintenance is not None
        maintenance.wait(120)  # batch 2 fell due (snapshot_every=2) in the background
        assert maintenance.last_error is None
        assert maintenance.last_snapshot_batch == 2
        orders_log = Changelog(str(state), "orders")
        assert all(list_snapshots(orders_log, p)[-1].batch_id == 2 for p in range(6))

        write_orders(source, 3, rng)
        app.process_all_available()
        app.compact("by_product")
        products = Changelog(str(state), "by_product")
        # an aggregation by its key into the state's 4 partitions: written in place
        sink = app.tables["by_product"].sink
        assert sink is not None and sink.layout().in_place
        assert all(list_snapshots(products, p)[-1].batch_id == 3 for p in range(4))
        truth = batch_truth(spark, source, ["by_product"])
        with Node(str(state), node_id="fresh", store="memory") as node:
            node.poll_once()
            got = {k: normalize(node.get("by_product", k)) for k in truth["by_product"]}
            assert got == {k: normalize(v) for k, v in truth["by_product"].items()}
    finally:
        app.stop()


def test_a_refused_in_place_write_falls_back_to_the_shuffle_under_connect(
    connect_spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under Connect the sink runs in the server's Python process and learns of the write
    tasks' refusal from a Connect error: the key rewritten after the aggregation still gives
    Spark's batch answer, batch 0 committed from its shuffled second write."""
    from pyspark.sql import functions as F

    from sparkiq.spark.sink import WRITE_ENV
    from sparkiq.testing import JsonSource, assert_table_matches

    monkeypatch.setenv(WRITE_ENV, "tasks")  # batch 1 too: written by tasks, not the driver

    spark = connect_spark
    source = JsonSource(tmp_path / "in", "k string, n long")

    def upper(df: Any) -> Any:
        return df.groupBy("k").agg(F.sum("n").alias("n")).withColumn("k", F.upper("k"))

    app = App(spark, state_dir=str(tmp_path / "state"), name="rewrite", snapshot_every=None)
    app.materialize("upper", upper(source.stream(spark)), key="k", partitions=4)
    app.start()
    try:
        for batch in range(2):
            source.feed(app, [{"k": f"k{(i * 7 + batch) % 23}", "n": i} for i in range(60)])
            assert_table_matches(app, "upper", upper(source.batch(spark)))
    finally:
        app.stop()
    changelog = Changelog(str(tmp_path / "state"), "upper")
    first = changelog.read_commit(0)
    assert first is not None and {s.attempt for s in first.segments.values()} == {1}
    assert changelog.committed_batch_ids() == [0, 1]
