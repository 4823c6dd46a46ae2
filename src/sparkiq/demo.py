"""``sparkiq demo``: a shop pipeline on Spark's built-in ``rate`` source, queried live.

The generator turns each ``rate`` row into an order: a product ``p-0``..``p-49``, a user
``u-0``..``u-199`` and an amount. Three tables are materialized:

- ``revenue_by_product`` (key ``product``): orders and revenue per product;
- ``orders_by_user`` (key ``user``): orders and last order time per user;
- ``revenue_per_window`` (key ``product``, 10-second tumbling windows).

Every two seconds the demo prints a key lookup, a range query and a window query with the
positions they were served at.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from typing import Any

__all__ = ["build_orders", "run_demo"]


def build_orders(spark: Any, rate: int) -> Any:
    """The demo's order stream: deterministic per ``rate`` row value."""
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .load()
        .select(
            F.col("timestamp").alias("ts"),
            F.concat(F.lit("p-"), (F.col("value") % 50).cast("string")).alias("product"),
            F.concat(F.lit("u-"), ((F.col("value") * 31) % 200).cast("string")).alias("user"),
            (((F.col("value") * 7919) % 1000) / 10.0).alias("amount"),
        )
    )


def _spark() -> Any:
    from sparkiq.testing import spark_session

    # The tests' local session, with the UI on: the demo is for watching
    return spark_session("sparkiq-demo", config={"spark.ui.enabled": "true"})


def run_demo(state_dir: str, duration: float, rate: int, partitions: int, fresh: bool) -> int:
    from pyspark.sql import functions as F

    import sparkiq
    from sparkiq import PositionBound, RangeQuery, StateQueryRequest, WindowKeyQuery

    if fresh and os.path.isdir(state_dir):
        shutil.rmtree(state_dir)
    print(f"sparkiq demo: state in {os.path.abspath(state_dir)}; starting Spark...", flush=True)
    spark = _spark()
    orders = build_orders(spark, rate)
    app = sparkiq.App(spark, state_dir=state_dir, name="shop")
    app.materialize(
        "revenue_by_product",
        orders.groupBy("product").agg(
            F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("revenue")
        ),
        key="product",
        partitions=partitions,
        trigger={"processingTime": "1 second"},
    )
    app.materialize(
        "orders_by_user",
        orders.groupBy("user").agg(F.count("*").alias("orders"), F.max("ts").alias("last_order")),
        key="user",
        partitions=partitions,
        trigger={"processingTime": "1 second"},
    )
    app.materialize(
        "revenue_per_window",
        orders.groupBy("product", F.window("ts", "10 seconds")).agg(
            F.round(F.sum("amount"), 2).alias("revenue")
        ),
        key="product",
        window="window",
        partitions=partitions,
        trigger={"processingTime": "1 second"},
    )

    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    previous = signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    app.start()
    print(
        "Tables: revenue_by_product, orders_by_user, revenue_per_window. Query them from Python:\n"
        "  app.get('revenue_by_product', 'p-7')\n"
        "  app.query(StateQueryRequest.in_store('revenue_by_product')"
        ".with_query(RangeQuery.with_range('p-10', 'p-19')))\n"
        "Press Ctrl-C to stop.\n",
        flush=True,
    )
    started = time.monotonic()
    try:
        while not stopping and (duration <= 0 or time.monotonic() - started < duration):
            time.sleep(0.25)
            if int((time.monotonic() - started) * 4) % 8:
                continue
            if app.node is not None and max(s.batch_id for s in app.node.status()) < 0:
                print(f"[{time.strftime('%H:%M:%S')}] waiting for the first micro-batch...")
                continue
            row = app.get("revenue_by_product", "p-7")
            ranged = app.query(
                StateQueryRequest.in_store("revenue_by_product")
                .with_query(RangeQuery.with_range("p-10", "p-14"))
                .with_position_bound(PositionBound.unbounded())
            )
            in_range = sorted(
                (key, r["revenue"])
                for result in ranged.partition_results.values()
                if result.is_success and result.result is not None
                for key, r in result.result
            )
            windows = app.query(
                StateQueryRequest.in_store("revenue_per_window").with_query(
                    WindowKeyQuery.with_key("p-7")
                )
            ).only_partition_result()
            last_windows = list(windows.result or ())[-3:]
            user = app.get("orders_by_user", "u-0")
            batch = ranged.position.to_map().get("revenue_by_product", {})
            print(f"[{time.strftime('%H:%M:%S')}] batch {max(batch.values(), default=-1)}")
            print(f"  get revenue_by_product 'p-7'      -> {row}")
            print(f"  range revenue 'p-10'..'p-14'      -> {in_range}")
            print(f"  get orders_by_user 'u-0'          -> {user}")
            for (_, start), w in last_windows:
                print(f"  window p-7 {start:%H:%M:%S}             -> revenue {w['revenue']}")
            sys.stdout.flush()
    finally:
        print("stopping...", flush=True)
        app.stop()
        spark.stop()
        signal.signal(signal.SIGINT, previous)
    print(f"stopped. Run `sparkiq status --state-dir {state_dir}` to inspect the changelog.")
    return 0
