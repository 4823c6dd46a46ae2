"""Differential tests: live tables equal Spark batch mode over the same input, after each batch.

One App materializes four tables from one multi-file streaming input (string keys,
composite int/date keys, windows, and a keyed stream with tombstones). After every new input
file, every key's row and a set of range queries are compared with the same computation run
by Spark in batch mode over all files written so far.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkiq import (
    App,
    KeyQuery,
    PositionBound,
    RangeQuery,
    ResultOrder,
    StateQueryRequest,
    WindowKeyQuery,
    WindowRangeQuery,
)

SCHEMA = (
    "order_id long, product string, user_id int, day date, amount double, ts timestamp, "
    "status string"
)
BASE = dt.datetime(2026, 1, 1, 12, 0, 0)


def write_orders(folder: Path, index: int, rng: random.Random, count: int = 300) -> None:
    lines = []
    for i in range(count):
        order_id = rng.randrange(0, 400)  # orders recur across files: updates and deletes
        lines.append(
            json.dumps(
                {
                    "order_id": order_id,
                    "product": f"p-{rng.randrange(0, 40)}" if rng.random() > 0.01 else None,
                    "user_id": rng.randrange(0, 30),
                    "day": str(dt.date(2026, 1, 1) + dt.timedelta(days=rng.randrange(0, 5))),
                    "amount": round(rng.uniform(-5, 100), 2),
                    "ts": (BASE + dt.timedelta(seconds=rng.randrange(0, 900))).isoformat(),
                    "status": rng.choice(["open", "paid", "shipped", "deleted"]),
                    "seq": index * 10_000 + i,
                }
            )
        )
    # Each file lists an order at most once, so "latest row wins" has one ground truth.
    latest: dict[int, str] = {}
    for line in lines:
        latest[json.loads(line)["order_id"]] = line
    tmp = folder / f".{index:03d}.json.tmp"
    tmp.write_text("\n".join(latest.values()) + "\n")
    tmp.rename(folder / f"{index:03d}.json")


def aggregations(df: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    return {
        "by_product": df.groupBy("product").agg(
            F.count("*").alias("orders"),
            F.sum("amount").alias("revenue"),
            F.max("ts").alias("last_ts"),
            F.collect_set("status").alias("statuses"),
        ),
        "by_user_day": df.groupBy("user_id", "day").agg(
            F.count("*").alias("orders"), F.min("amount").alias("smallest")
        ),
        "per_window": df.groupBy("product", F.window("ts", "5 minutes")).agg(
            F.count("*").alias("orders")
        ),
    }


def materialize_tables(app: App, stream: Any, per_window: bool = True) -> None:
    """The tables under test on ``app``: by_product, by_user_day, per_window (unless
    ``per_window`` is false) and orders, whose deleted orders are tombstones."""
    from pyspark.sql import functions as F

    tables = aggregations(stream)
    # 4 = the session's shuffle partitions: written in place, without the sink's shuffle
    app.materialize("by_product", tables["by_product"], key="product", partitions=4)
    app.materialize("by_user_day", tables["by_user_day"], key=["user_id", "day"], partitions=3)
    if per_window:
        app.materialize(
            "per_window", tables["per_window"], key="product", window="window", partitions=4
        )
    app.materialize(
        "orders",
        stream.select(
            "order_id", "product", "amount", "status", (F.col("status") == "deleted").alias("gone")
        ),
        key="order_id",
        partitions=6,
        tombstone="gone",
    )


@pytest.fixture(scope="module")
def pipeline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[App, Path]]:
    root = tmp_path_factory.mktemp("differential")
    source = root / "in"
    source.mkdir()
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    app = App(spark, state_dir=str(root / "state"), name="diff")
    materialize_tables(app, stream)
    app.start()
    yield app, source
    app.stop()


def batch_truth(
    spark: Any, source: Path, tables: Collection[str] | None = None
) -> dict[str, dict[Any, dict[str, Any]]]:
    """The same tables (all four, or those named in ``tables``) computed by Spark in batch
    mode over every file so far. Naming only the tables a test compares saves a Spark job
    per table left out, each one a round trip or more under Spark Connect."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = spark.read.schema(SCHEMA + ", seq long").json(str(source))
    truth: dict[str, dict[Any, dict[str, Any]]] = {}
    for name, frame in aggregations(df.drop("seq")).items():
        if tables is not None and name not in tables:
            continue
        rows = [r.asDict(recursive=True) for r in frame.collect()]
        if name == "by_user_day":
            truth[name] = {(r["user_id"], r["day"]): r for r in rows}
        elif name == "per_window":
            truth[name] = {(r["product"], r["window"]["start"]): r for r in rows}
        else:
            truth[name] = {r["product"]: r for r in rows}
    if tables is not None and "orders" not in tables:
        return truth
    latest = (
        df.withColumn(
            "rank", F.row_number().over(Window.partitionBy("order_id").orderBy(F.desc("seq")))
        )
        .filter("rank = 1")
        .filter("status != 'deleted'")
        .select("order_id", "product", "amount", "status")
    )
    truth["orders"] = {r["order_id"]: r.asDict(recursive=True) for r in latest.collect()}
    return truth


def normalize(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    out = dict(row)
    if "statuses" in out:  # collect_set has no defined order
        out["statuses"] = sorted(out["statuses"])
    if "revenue" in out and out["revenue"] is not None:  # float sums depend on order
        out["revenue"] = round(out["revenue"], 6)
    return out


def nulls_first(window_key: tuple[Any, Any]) -> tuple[bool, str, Any]:
    return (window_key[0] is not None, window_key[0] or "", window_key[1])


def full_scan(app: App, store: str, query: Any) -> list[tuple[Any, dict[str, Any]]]:
    result = app.query(StateQueryRequest.in_store(store).with_query(query))
    items: list[tuple[Any, dict[str, Any]]] = []
    for partition_result in result.partition_results.values():
        assert partition_result.is_success, partition_result
        with partition_result.result as rows:
            items.extend(rows)
    return items


def test_live_tables_equal_batch_mode_after_each_batch(
    pipeline: tuple[App, Path], spark: Any
) -> None:
    app, source = pipeline
    rng = random.Random(2026)
    previous_position = None
    for index in range(3):
        write_orders(source, index, rng)
        app.process_all_available()
        truth = batch_truth(spark, source)

        # Every key of every plain table, by get() and by KeyQuery, and absent keys.
        for key, row in truth["by_product"].items():
            assert normalize(app.get("by_product", key)) == normalize(row)
        for key, row in truth["by_user_day"].items():
            assert app.get("by_user_day", key) == row
        for key, row in truth["orders"].items():
            got = app.query(StateQueryRequest.in_store("orders").with_query(KeyQuery.with_key(key)))
            assert got.only_partition_result().result == row
        deleted = set(range(400)) - set(truth["orders"])
        assert all(app.get("orders", k) is None for k in deleted)
        assert app.get("by_product", "p-never") is None

        # Full scans equal the ground truth exactly (no extra and no missing keys).
        for store in ("by_product", "by_user_day", "orders"):
            scanned = {
                k: normalize(v) for k, v in full_scan(app, store, RangeQuery.with_no_bounds())
            }
            assert scanned == {k: normalize(v) for k, v in truth[store].items()}

        # Ranges follow the key's natural order (numbers numerically, nulls first).
        ranged = full_scan(app, "orders", RangeQuery.with_range(37, 211))
        assert sorted(k for k, _ in ranged) == sorted(k for k in truth["orders"] if 37 <= k <= 211)
        lower = full_scan(
            app, "by_user_day", RangeQuery.with_lower_bound((10, dt.date(2026, 1, 3)))
        )
        assert sorted(k for k, _ in lower) == sorted(
            k for k in truth["by_user_day"] if k >= (10, dt.date(2026, 1, 3))
        )
        descending = app.query(
            StateQueryRequest.in_store("orders").with_query(
                RangeQuery.with_upper_bound(100).with_result_order(ResultOrder.DESCENDING)
            )
        )
        for result in descending.partition_results.values():
            keys = [k for k, _ in result.result]
            assert keys == sorted(keys, reverse=True) and all(k <= 100 for k in keys)

        # Windows: every window of a key, and a time range across keys.
        windows = {
            (k, start): r for (k, start), r in full_scan(app, "per_window", WindowRangeQuery())
        }
        assert windows == truth["per_window"]
        for product in ["p-1", "p-17", None]:
            result = app.query(
                StateQueryRequest.in_store("per_window").with_query(
                    WindowKeyQuery.with_key(product)
                )
            ).only_partition_result()
            got = [(k, start) for (k, start), _ in result.result]
            assert got == sorted(
                (k for k in truth["per_window"] if k[0] == product), key=nulls_first
            )
        mid = BASE + dt.timedelta(minutes=5)
        in_time = full_scan(app, "per_window", WindowRangeQuery.with_window_starts(mid, mid))
        assert sorted(((k, s) for (k, s), _ in in_time), key=nulls_first) == sorted(
            (k for k in truth["per_window"] if k[1] == mid), key=nulls_first
        )

        # Positions move forward, and a bound at the last position is satisfied.
        position = app.query(
            StateQueryRequest.in_store("by_product").with_query(RangeQuery.with_no_bounds())
        ).position
        if previous_position is not None:
            assert position.dominates(previous_position)
            assert position != previous_position
        bounded = app.query(
            StateQueryRequest.in_store("by_product")
            .with_query(KeyQuery.with_key("p-1"))
            .with_position_bound(PositionBound.at(position))
        ).only_partition_result()
        assert bounded.is_success
        previous_position = position

    # the aggregation by its key into the state's 4 partitions was written without a shuffle
    in_place = {name for name, table in app.tables.items() if table.sink.layout().in_place}
    assert in_place == {"by_product"}


def test_status_reports_no_lag_after_processing(pipeline: tuple[App, Path]) -> None:
    app, _ = pipeline
    app.process_all_available()
    assert app.node is not None
    statuses = app.node.status()
    assert {s.table for s in statuses} == {"by_product", "by_user_day", "per_window", "orders"}
    assert all(s.healthy and s.lag_batches == 0 for s in statuses)
    assert os.path.isdir(os.path.join(app.state_dir, "checkpoints", "by_product"))
