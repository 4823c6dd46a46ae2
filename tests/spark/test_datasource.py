"""``spark.read.format("sparkiq")`` and ``spark.readStream.format("sparkiq")``: another Spark
job reads a table at one batch, or its change feed, straight from the changelog.

One App runs the differential pipeline's tables (string, composite int/date and windowed
keys, arrays, timestamps, a keyed stream with tombstones) over three input files; snapshots
every two batches, so reads at the newest batch start from a snapshot and reads as of older
batches from the segments. Ground truth is Spark batch mode over the input files so far and,
for change feeds, plain Python over each file.
"""

from __future__ import annotations

import json
import random
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import sparkiq
from sparkiq import App, ConfigError, Node
from sparkiq.changelog import Changelog
from sparkiq.changelog.retention import apply_retention
from sparkiq.changelog.snapshot import list_snapshots
from sparkiq.schema.partitioner import partition_for
from sparkiq.spark.datasource import (
    BATCH_COLUMN,
    COMMITTED_COLUMN,
    OP_COLUMN,
    PUSHDOWN_CONF,
    SparkiqDataSource,
)
from tests.spark.test_differential import (
    SCHEMA,
    batch_truth,
    materialize_tables,
    normalize,
    write_orders,
)

CHANGE_COLUMNS = (OP_COLUMN, BATCH_COLUMN, COMMITTED_COLUMN)
BATCHES = 4


@pytest.fixture(scope="module")
def written(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The state_dir after four batches (one input file each), the writer stopped (its idle
    queries would only compete for the CPU); every table has a snapshot at batch 2, so batch
    3 reads a snapshot plus segments. Also returns the input folder."""
    root = tmp_path_factory.mktemp("datasource")
    source = root / "in"
    source.mkdir()
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    app = App(spark, state_dir=str(root / "state"), name="ds", snapshot_every=2, retention=None)
    materialize_tables(app, stream)
    app.start(local_node=False)
    rng = random.Random(12)
    try:
        for index in range(BATCHES):
            write_orders(source, index, rng)
            app.process_all_available()
        for table in app.tables.values():
            assert table.maintenance is not None
            table.maintenance.wait(120)  # snapshot_every=2: snapshots of batch 2
    finally:
        app.stop()
    return str(root / "state"), source


def read(spark: Any, state_dir: str, table: str, **options: Any) -> Any:
    reader = spark.read.format("sparkiq").option("state_dir", state_dir)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(table)


def rows_by_key(df: Any, key: Any) -> dict[Any, dict[str, Any]]:
    """A DataFrame's (or collected rows') table columns by key; no key twice."""
    collected = df if isinstance(df, list) else df.collect()
    rows = [
        {k: v for k, v in r.asDict(recursive=True).items() if k not in CHANGE_COLUMNS}
        for r in collected
    ]
    keyed = {key(r): r for r in rows}
    assert len(keyed) == len(rows), "a key was read twice"
    return keyed


KEYS = {
    "by_product": lambda r: r["product"],
    "by_user_day": lambda r: (r["user_id"], r["day"]),
    "per_window": lambda r: (r["product"], r["window"]["start"]),
    "orders": lambda r: r["order_id"],
}


def files_up_to(source: Path, batch: int, into: Path) -> Path:
    """A folder holding the input files of batches 0..batch (one file per batch)."""
    into.mkdir(parents=True, exist_ok=True)
    for index in range(batch + 1):
        shutil.copy(source / f"{index:03d}.json", into / f"{index:03d}.json")
    return into


def test_a_batch_read_is_the_table_at_its_newest_batch(
    spark: Any, written: tuple[str, Path]
) -> None:
    state_dir, source = written
    truth = batch_truth(spark, source)
    for table, key in KEYS.items():
        df = read(spark, state_dir, table)
        # the table's own columns and types, then the change columns
        manifest = Changelog(state_dir, table).manifest()
        assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
            *((f.name, f.type.simple_string()) for f in manifest.schema.fields),
            (OP_COLUMN, "string"),
            (BATCH_COLUMN, "bigint"),
            (COMMITTED_COLUMN, "timestamp"),
        ]
        rows = df.collect()
        assert {(r[OP_COLUMN], r[BATCH_COLUMN]) for r in rows} == {("upsert", BATCHES - 1)}
        got = {k: normalize(v) for k, v in rows_by_key(rows, key).items()}
        assert got == {k: normalize(v) for k, v in truth[table].items()}, table
    # ... and what the serving side answers, row for row
    with Node(state_dir, node_id="served", store="memory") as node:
        node.poll_once()
        served = node.sql("SELECT * FROM by_user_day").rows
    got = rows_by_key(read(spark, state_dir, "by_user_day"), KEYS["by_user_day"])
    assert got == {KEYS["by_user_day"](r): r for r in served}
    # the table option is the same as load("name"); options are case-insensitive
    alt = spark.read.format("sparkiq").option("STATE_DIR", state_dir).option("table", "orders")
    assert rows_by_key(alt.load(), KEYS["orders"]) == rows_by_key(
        read(spark, state_dir, "orders"), KEYS["orders"]
    )


def test_as_of_reads_equal_batch_mode_over_the_inputs_so_far(
    spark: Any, written: tuple[str, Path], tmp_path: Path
) -> None:
    state_dir, source = written
    # batches 0 and 1 come from segments only, batch 2 from its snapshot only
    for batch, tables in ((0, ("orders", "per_window")), (1, ("by_product",)), (2, ("orders",))):
        truth = batch_truth(spark, files_up_to(source, batch, tmp_path / f"upto{batch}"), tables)
        for table in tables:
            rows = read(spark, state_dir, table, as_of=batch).collect()
            assert {r[BATCH_COLUMN] for r in rows} == {batch}
            got = {k: normalize(v) for k, v in rows_by_key(rows, KEYS[table]).items()}
            assert got == {k: normalize(v) for k, v in truth[table].items()}, (table, batch)


def test_key_filters_prune_partitions(spark: Any, written: tuple[str, Path]) -> None:
    from pyspark.sql.datasource import EqualTo, GreaterThan, In

    state_dir, source = written
    truth = batch_truth(spark, source, ["by_product", "by_user_day"])

    def planned(table: str, filters: list[Any]) -> tuple[list[int], list[Any]]:
        source_ = SparkiqDataSource({"state_dir": state_dir, "path": table})
        reader = source_.reader(source_.schema())
        left = list(reader.pushFilters(filters))
        return [p.partition for p in reader.partitions()], left

    # one key: its partition only; every filter still goes back to Spark
    product = next(k for k in truth["by_product"] if k is not None)
    eq = EqualTo(("product",), product)
    parts, left = planned("by_product", [eq, GreaterThan(("orders",), 0)])
    assert parts == [partition_for([product], ["string"], 4)]  # by_product has 4 partitions
    assert left == [eq, GreaterThan(("orders",), 0)]
    # IN over a composite key: the partitions of every combination
    days = sorted({d for _, d in truth["by_user_day"]})
    parts, _ = planned("by_user_day", [In(("user_id",), (1, 2)), In(("day",), tuple(days[:2]))])
    types = ["integer", "date"]  # a date's internal value: days since 1970-01-01
    assert parts == sorted(
        {partition_for([u, _days(d)], types, 3) for u in (1, 2) for d in days[:2]}
    )
    # a composite key fixed on one column only, or a non-key filter: every partition
    assert planned("by_user_day", [EqualTo(("user_id",), 1)])[0] == [0, 1, 2]
    assert planned("orders", [EqualTo(("status",), "paid")])[0] == list(range(6))
    # contradicting filters: no partition at all
    assert planned("orders", [EqualTo(("order_id",), 1), EqualTo(("order_id",), 2)])[0] == []

    # End to end, the answers equal batch mode.
    df = read(spark, state_dir, "by_product")
    got = [
        normalize(r.asDict(recursive=True))
        for r in df.filter(df.product == product).drop(*CHANGE_COLUMNS).collect()
    ]
    assert got == [normalize(truth["by_product"][product])]
    user, day = next(iter(truth["by_user_day"]))
    df = read(spark, state_dir, "by_user_day")
    hits = df.filter((df.user_id == user) & (df.day == day)).drop(*CHANGE_COLUMNS).collect()
    assert [r.asDict() for r in hits] == [truth["by_user_day"][(user, day)]]
    assert read(spark, state_dir, "orders").filter("order_id = 1 AND order_id = 2").count() == 0
    # Spark refuses a source that prunes while pushdown is off, naming the setting
    spark.conf.set(PUSHDOWN_CONF, "false")
    try:
        with pytest.raises(Exception, match=PUSHDOWN_CONF.replace(".", r"\.")):
            read(spark, state_dir, "orders").count()
    finally:
        spark.conf.set(PUSHDOWN_CONF, "true")


def _days(day: Any) -> int:
    import datetime as dt

    return (day - dt.date(1970, 1, 1)).days


def order_changes(source: Path) -> Counter[tuple[Any, ...]]:
    """Per input file (= table batch), the change each order line makes to ``orders``."""
    changes: Counter[tuple[Any, ...]] = Counter()
    for batch, path in enumerate(sorted(source.glob("*.json"))):
        for line in path.read_text().splitlines():
            o = json.loads(line)
            if o["status"] == "deleted":
                changes[(batch, "delete", o["order_id"], None, None, None)] += 1
            else:
                row = (o["order_id"], o["product"], o["amount"], o["status"])
                changes[(batch, "upsert", *row)] += 1
    return changes


def feed_rows(rows: list[Any]) -> Counter[tuple[Any, ...]]:
    return Counter(
        (r[BATCH_COLUMN], r[OP_COLUMN], r["order_id"], r["product"], r["amount"], r["status"])
        for r in rows
    )


def stream_all(spark: Any, state_dir: str, table: str, **options: Any) -> list[Any]:
    """Run the table's change feed to its newest batch (Trigger.AvailableNow) into a memory
    sink and return the rows."""
    name = f"feed_{uuid.uuid4().hex[:8]}"
    reader = spark.readStream.format("sparkiq").option("state_dir", state_dir)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load(table)
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    rows = spark.sql(f"SELECT * FROM {name}").collect()
    spark.sql(f"DROP VIEW IF EXISTS {name}")
    return rows


def test_the_change_feed_is_the_tables_history(spark: Any, written: tuple[str, Path]) -> None:
    state_dir, source = written
    rows = stream_all(spark, state_dir, "orders", max_batches_per_trigger=1)
    assert feed_rows(rows) == order_changes(source)
    committed = {
        b: Changelog(state_dir, "orders").read_commit(b).committed_at  # type: ignore[union-attr]
        for b in range(BATCHES)
    }
    for r in rows:
        assert abs(r[COMMITTED_COLUMN].timestamp() - committed[r[BATCH_COLUMN]]) < 1e-3
    # An update-mode aggregate: each batch's changes are the keys its input touched, with
    # their values after the batch (Spark batch mode over the files so far).
    by_batch: dict[int, dict[Any, Any]] = {}
    for r in stream_all(spark, state_dir, "by_product"):
        assert r[OP_COLUMN] == "upsert"
        row = {k: v for k, v in r.asDict(recursive=True).items() if k not in CHANGE_COLUMNS}
        assert row["product"] not in by_batch.setdefault(r[BATCH_COLUMN], {})
        by_batch[r[BATCH_COLUMN]][row["product"]] = normalize(row)
    folder = source.parent / "feed-truth"
    for batch in range(BATCHES):
        truth = batch_truth(spark, files_up_to(source, batch, folder / str(batch)), ["by_product"])
        touched = {
            json.loads(line)["product"]
            for line in (source / f"{batch:03d}.json").read_text().splitlines()
        }
        assert by_batch[batch] == {k: normalize(truth["by_product"][k]) for k in touched}
    # starting_batch: from a batch on, or only what comes after the start
    later = stream_all(spark, state_dir, "orders", starting_batch=1)
    assert feed_rows(later) == Counter(
        {k: n for k, n in order_changes(source).items() if k[0] >= 1}
    )
    assert stream_all(spark, state_dir, "orders", starting_batch="latest") == []


def test_bad_options_get_clear_errors(
    spark: Any, written: tuple[str, Path], tmp_path: Path
) -> None:
    state_dir, _ = written

    def error(**options: Any) -> str:
        table = options.pop("table", "orders")
        reader = spark.read.format("sparkiq")
        for key, value in options.items():
            reader = reader.option(key, value)
        with pytest.raises(Exception) as info:
            reader.load(table).collect()
        return str(info.value)

    assert "needs option 'state_dir'" in error()
    assert "relative path 'state'" in error(state_dir="state")
    message = error(state_dir=state_dir, table="nope")
    assert "no table 'nope'" in message and "orders" in message  # lists the tables there
    assert "unknown option(s) ['statedir']" in error(statedir=state_dir)
    assert "committed batches up to 3 only" in error(state_dir=state_dir, as_of=7)
    assert "must be an integer >= 0" in error(state_dir=state_dir, as_of="yesterday")

    # as_of beyond what retention kept: the error names the oldest readable batch
    copy = tmp_path / "state"
    shutil.copytree(Path(state_dir) / "tables" / "orders", copy / "tables" / "orders")
    log = Changelog(str(copy), "orders")
    apply_retention(log, 0, keep_snapshots=1)
    assert log.committed_batch_ids() == [3]  # every partition's snapshot covers 0..2
    # one snapshot left per partition (batch 2, or 3 if the writer snapshotted as it stopped):
    # the oldest batch every partition can be rebuilt at is the newest of them
    oldest = max(list_snapshots(log, p)[-1].batch_id for p in range(6))
    message = error(state_dir=str(copy), as_of=1)
    assert "batch 1 of table 'orders' is no longer in the changelog" in message
    assert f"the oldest readable batch is {oldest}" in message
    assert read(spark, str(copy), "orders", as_of=oldest).count() > 0
    with pytest.raises(Exception, match=r"keeps batches 3\.\.3 only"):
        stream_all(spark, str(copy), "orders")


def test_register_data_source_is_public_and_repeatable(spark: Any) -> None:
    sparkiq.register_data_source(spark)
    sparkiq.register_data_source(spark)
    assert spark.conf.get(PUSHDOWN_CONF) == "true"
    with pytest.raises(ConfigError, match="needs option 'state_dir'"):
        SparkiqDataSource({"path": "orders"}).schema()


def test_batch_reads_and_change_feeds_under_spark_connect(
    connect_spark: Any, written: tuple[str, Path]
) -> None:
    """The same reads through a Spark Connect session: the source is registered from the
    client and runs in the server's Python workers."""
    state_dir, source = written
    spark = connect_spark
    sparkiq.register_data_source(spark)
    assert spark.conf.get(PUSHDOWN_CONF) == "true"
    truth = batch_truth(spark, source, ["by_product", "orders"])
    for table in ("by_product", "orders"):
        got = rows_by_key(read(spark, state_dir, table), KEYS[table])
        assert {k: normalize(v) for k, v in got.items()} == {
            k: normalize(v) for k, v in truth[table].items()
        }, table
    df = read(spark, state_dir, "orders")
    key = next(iter(truth["orders"]))
    assert [r.asDict() for r in df.filter(df.order_id == key).drop(*CHANGE_COLUMNS).collect()] == [
        truth["orders"][key]
    ]
    assert feed_rows(stream_all(spark, state_dir, "orders")) == order_changes(source)


def test_change_feed_offsets_are_batch_ids_of_one_incarnation(written: tuple[str, Path]) -> None:
    """The stream reader's offsets, as Spark's streaming engine calls them."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

    state_dir, _ = written
    source = SparkiqDataSource({"state_dir": state_dir, "path": "orders"})
    reader = source.streamReader(source.schema())
    incarnation = Changelog(state_dir, "orders").manifest().incarnation
    start = reader.initialOffset()
    assert start == {"batch_id": -1, "incarnation": incarnation}
    assert reader.latestOffset(start, ReadMaxFiles(1)) == {**start, "batch_id": 0}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {**start, "batch_id": BATCHES - 1}
    assert [(p.first, p.last) for p in reader.partitions(start, end)] == [
        (b, b) for b in range(BATCHES)
    ]
    assert reader.partitions(end, end) == []
    assert reader.latestOffset({"batch_id": 2}, ReadAllAvailable())["batch_id"] == BATCHES - 1
    with pytest.raises(ConfigError, match="dropped and created again"):
        reader.latestOffset({"batch_id": 2, "incarnation": "another"}, ReadAllAvailable())
    with pytest.raises(ConfigError, match="starting_batch"):
        SparkiqDataSource(
            {"state_dir": state_dir, "path": "orders", "starting_batch": "soon"}
        ).schema()


def test_timestamp_and_float_keys_are_never_pruned(tmp_path: Path) -> None:
    """A filter literal's exact internal value is not certain enough for these key types to
    stake a partition on: every partition is read and Spark filters."""
    import datetime as dt

    from pyspark.sql.datasource import EqualTo

    from tests.changelog.helpers import create_changelog

    for key_type, value in (("timestamp", dt.datetime(2026, 1, 1, 12)), ("double", 0.0)):
        schema = {
            "type": "struct",
            "fields": [
                {"name": "k", "type": key_type, "nullable": True, "metadata": {}},
                {"name": "n", "type": "long", "nullable": True, "metadata": {}},
            ],
        }
        create_changelog(str(tmp_path), f"t_{key_type}", schema, partitions=4)
        source = SparkiqDataSource({"state_dir": str(tmp_path), "path": f"t_{key_type}"})
        reader = source.reader(source.schema())
        assert list(reader.pushFilters([EqualTo(("k",), value)])) == [EqualTo(("k",), value)]
        assert [p.partition for p in reader.partitions()] == [0, 1, 2, 3]
