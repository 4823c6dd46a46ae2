"""A Spark writer (no local node) and three ``sparkiq serve`` processes sharing state_dir:
every key and range of every table, asked of every node, equals Spark's batch answer."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from sparkiq import App, Client, Position, PositionBound, RangeQuery, StateQueryRequest
from sparkiq.changelog import Changelog
from tests.cluster.serve_processes import ServeProcess, make_nodes, start_nodes

# Starts JVMs or processes of its own: scheduled first (tests/conftest.py).
pytestmark = pytest.mark.slow

USERS = [f"user{i:02d}" for i in range(40)]
ITEMS = ["apple", "pear", "fig", "kiwi"]


def write_events(source: Path, index: int, count: int) -> None:
    rng = random.Random(index)
    rows = [
        {"user": rng.choice(USERS), "item": rng.choice(ITEMS), "qty": rng.randint(1, 9)}
        for _ in range(count)
    ]
    (source / f"{index:03d}.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def truth(spark: Any, source: Path) -> tuple[dict[Any, Any], dict[Any, Any]]:
    from pyspark.sql import functions as F

    events = spark.read.schema("user string, item string, qty long").json(str(source))
    by_user = {
        r["user"]: r.asDict()
        for r in events.groupBy("user")
        .agg(F.count("*").alias("n"), F.sum("qty").alias("qty"))
        .collect()
    }
    by_pair = {
        (r["user"], r["item"]): r.asDict()
        for r in events.groupBy("user", "item").agg(F.sum("qty").alias("qty")).collect()
    }
    return by_user, by_pair


def every_row(client: Client, store: str) -> dict[Any, Any]:
    result = client.query(StateQueryRequest.in_store(store).with_query(RangeQuery.with_no_bounds()))
    rows = {}
    for partition_result in result.partition_results.values():
        assert partition_result.is_success, partition_result
        rows.update(partition_result.result)
    return rows


def test_writer_and_three_serving_processes(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    state, source = tmp_path / "state", tmp_path / "in"
    source.mkdir()
    write_events(source, 0, 500)
    events = spark.readStream.schema("user string, item string, qty long").json(str(source))
    app = App(spark, state_dir=str(state))
    app.materialize(
        "by_user",
        events.groupBy("user").agg(F.count("*").alias("n"), F.sum("qty").alias("qty")),
        key="user",
        partitions=6,
    )
    app.materialize(
        "by_pair",
        events.groupBy("user", "item").agg(F.sum("qty").alias("qty")),
        key=["user", "item"],
        partitions=4,
    )
    app.start(local_node=False)
    nodes: list[ServeProcess] = []
    try:
        app.process_all_available()
        assert app.node is None  # the writer serves nothing
        nodes = make_nodes(str(state), str(tmp_path), 3)
        start_nodes(nodes)
        for round_ in range(2):
            if round_:
                write_events(source, round_, 300)
                app.process_all_available()
            head = max(Changelog(str(state), "by_user").committed_batch_ids())
            bound = PositionBound.at(Position.from_map({"by_user": {0: head}}))
            by_user, by_pair = truth(spark, source)
            for node in nodes:
                with Client(node.url) as client:
                    # read-your-writes: wait for the writer's last batch on every partition
                    fresh = client.query(
                        StateQueryRequest.in_store("by_user")
                        .with_query(RangeQuery.with_no_bounds())
                        .with_position_bound(bound)
                    )
                    assert all(r.is_success for r in fresh.partition_results.values())
                    for user in USERS:
                        assert client.get("by_user", user) == by_user.get(user)
                    for pair, row in by_pair.items():
                        assert client.get("by_pair", pair) == row
                    assert every_row(client, "by_user") == by_user
                    assert every_row(client, "by_pair") == by_pair
    finally:
        app.stop()
        for node in nodes:
            node.stop()
