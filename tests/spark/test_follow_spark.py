"""A second application follows a table of a first one, with a filter and a projection, and a
second Spark pipeline enriches its events with lookups into it: answers equal the owner's,
restricted to the subset, at every position reported."""

from __future__ import annotations

import datetime as dt
import json
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

import sparkiq
from sparkiq import App, ConfigError
from sparkiq.changelog import Changelog
from sparkiq.schema.codec import RowCodec
from sparkiq.schema.sparkarrow import stored_to_arrow
from sparkiq.schema.types import TableSchema

PRODUCTS = [f"p{i:02d}" for i in range(24)]
KEPT = ["product", "orders", "revenue", "last_seen", "tags"]


def write_orders(folder: Path, index: int, rng: random.Random) -> None:
    lines = []
    for i in range(60):
        product = rng.choice(PRODUCTS[:-2])  # the last two products are never ordered
        lines.append(
            json.dumps(
                {
                    "product": product,
                    "amount": round(rng.uniform(1, 50), 2),
                    "tag": rng.choice(["a", "b", "c"]),
                    "ts": f"2024-03-0{index + 1}T10:{i:02d}:00Z",
                }
            )
        )
    (folder / f"{index:03d}.json").write_text("\n".join(lines) + "\n")


def sales(orders: Any) -> Any:
    from pyspark.sql import functions as F

    return orders.groupBy("product").agg(
        F.count("*").alias("orders"),
        F.sum(F.col("amount").cast("decimal(10,2)")).alias("revenue"),
        F.max("ts").alias("last_seen"),
        F.sort_array(F.collect_set("tag")).alias("tags"),
        F.struct(F.min("amount").alias("lo"), F.max("amount").alias("hi")).alias("span"),
    )


def odd_orders(row: dict[str, Any]) -> bool:
    """Keys enter and leave the subset as their order count changes parity."""
    return bool(row["orders"] % 2 == 1)


def restrict(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None or not odd_orders(row):
        return None
    return {c: row[c] for c in KEPT}


def state_at(state_dir: str, table: str, batch_id: int) -> dict[str, dict[str, Any]]:
    """The owner's table after ``batch_id``, read from its changelog: product -> row."""
    changelog = Changelog(state_dir, table, read_only=True)
    manifest = changelog.manifest()
    state: dict[bytes, bytes] = {}
    for b in range(batch_id + 1):
        record = changelog.read_commit(b)
        assert record is not None
        for partition in range(manifest.partitions):
            keys, values = changelog.read_segment(record, partition)
            for key, value in zip(keys, values, strict=True):
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = value
    codec = RowCodec(manifest.schema)
    return {row["product"]: row for row in map(codec.decode, state.values())}


def test_a_filtered_follower_equals_the_owner_and_enrich_equals_a_join(
    spark: Any, tmp_path: Path
) -> None:
    rng = random.Random(3)
    source, state, events_dir = tmp_path / "orders", tmp_path / "state", tmp_path / "events"
    source.mkdir()
    events_dir.mkdir()
    orders = (
        spark.readStream.schema("product string, amount double, tag string, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
    )
    app = App(spark, state_dir=str(state), name="owner")
    table = app.materialize("sales", sales(orders), key="product", partitions=4)
    app.start()
    follower = sparkiq.follow(
        str(state),
        "sales",
        where=odd_orders,
        columns=["orders", "revenue", "last_seen", "tags"],
        local_dir=str(tmp_path / "follower"),
    )
    enriched: list[Any] = []
    lookups = None
    try:
        moved = 0
        previous: dict[str, Any] = {}
        for index in range(3):
            write_orders(source, index, rng)
            app.process_all_available()
            last = table.committed_batch_id
            assert last == index
            assert follower.wait_for(last, timeout=30)
            for product in PRODUCTS:
                owner = app.get("sales", product)
                assert follower.get(product) == restrict(owner), (index, product)
                moved += (restrict(owner) is None) != (previous.get(product) is None)
                previous[product] = restrict(owner)
            assert app.node is not None
            assert follower.position == app.node.position("sales")
            assert follower.position.partition_offsets("sales") == dict.fromkeys(range(4), last)
        assert moved >= 4  # keys both entered and left the subset
        assert follower.get("p23") is None

        # A second pipeline enriches its events with lookups into the table.
        events = (
            spark.readStream.schema("event_id long, product string")
            .option("maxFilesPerTrigger", 1)
            .json(str(events_dir))
        )
        lookups = (
            sparkiq.spark.enrich(
                events,
                str(state),
                "sales",
                key="product",
                columns=["orders", "revenue", "last_seen", "tags", "span"],
                prefix="s_",
                local_dir=str(tmp_path / "lookup"),
            )
            .writeStream.foreachBatch(lambda df, _: enriched.extend(df.collect()))
            .option("checkpointLocation", str(tmp_path / "lookup-checkpoint"))
            .start()
        )
        for index in range(2):
            (events_dir / f"{index}.json").write_text(
                "\n".join(
                    json.dumps({"event_id": index * 100 + i, "product": p})
                    for i, p in enumerate([*PRODUCTS, None])
                )
                + "\n"
            )
            lookups.processAllAvailable()
            # The owner moves on between the two event files.
            write_orders(source, 3 + index, rng)
            app.process_all_available()
    finally:
        if lookups is not None:
            lookups.stop()
        follower.close()
        app.stop()

    assert len(enriched) == 2 * (len(PRODUCTS) + 1)
    read_at = {(row["event_id"] // 100, row["sparkiq_batch"]) for row in enriched if row["product"]}
    assert read_at == {(0, 2), (1, 3)}  # each lookup read what the owner had committed by then
    assert all(row["sparkiq_batch"] is None for row in enriched if row["product"] is None)
    # Equal to a batch join of the events with the owner's table at the reported batch.
    schema = Changelog(str(state), "sales").manifest().schema
    for batch_id in sorted(b for _, b in read_at):
        rows = list(state_at(str(state), "sales", batch_id).values())
        table_df = spark.createDataFrame(rows, schema=_spark_schema(schema))
        picked = [r for r in enriched if r["sparkiq_batch"] in (batch_id, None)]
        events_df = spark.createDataFrame(
            [(r["event_id"], r["product"]) for r in picked], "event_id long, product string"
        )
        joined = events_df.join(
            table_df.select(
                "product",
                *(table_df[c].alias(f"s_{c}") for c in ["orders", "revenue", "last_seen", "tags"]),
                table_df["span"].alias("s_span"),
            ),
            "product",
            "left",
        )
        expected = {r["event_id"]: r.asDict(recursive=True) for r in joined.collect()}
        got = {
            r["event_id"]: {
                k: v for k, v in r.asDict(recursive=True).items() if k != "sparkiq_batch"
            }
            for r in picked
            if r["product"] is None or r["sparkiq_batch"] == batch_id
        }
        assert got == {k: v for k, v in expected.items() if k in got}
        assert sum(r["s_orders"] is not None for r in got.values()) == len(PRODUCTS) - 2
    assert sorted(p.name for p in (tmp_path / "lookup").iterdir())[0] == "slot-000"


def _spark_schema(schema: TableSchema) -> Any:
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(schema.spark_json()))


def test_batch_enrich_and_its_argument_errors(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "orders"
    source.mkdir()
    write_orders(source, 0, random.Random(8))
    orders = spark.readStream.schema("product string, amount double, tag string, ts timestamp")
    app = App(spark, state_dir=str(tmp_path / "state"), name="owner")
    app.materialize("sales", sales(orders.json(str(source))), key="product", partitions=3)
    app.start()
    try:
        app.process_all_available()
        events = spark.createDataFrame(
            [(i, p) for i, p in enumerate(PRODUCTS)], "id int, product string"
        )
        state = str(tmp_path / "state")
        out = sparkiq.spark.enrich(events, state, "sales", key="product", columns=["orders"])
        assert out.columns == ["id", "product", "orders", "sparkiq_batch"]
        rows = {r["product"]: r for r in out.collect()}
        for product in PRODUCTS:
            owner = app.get("sales", product)
            assert rows[product]["orders"] == (None if owner is None else owner["orders"])
            assert rows[product]["sparkiq_batch"] == 0
        cases: list[tuple[dict[str, Any], str]] = [
            ({"key": "id"}, r"column 'id' is int but key column 'product' of 'sales' is string"),
            ({"key": ["product", "id"]}, r"1 key columns \['product'\]"),
            ({"key": "nope"}, "not a column of the DataFrame"),
            ({"key": "product", "columns": ["nope"]}, r"no column 'nope'.*'orders'"),
            ({"key": "product", "columns": ["product"]}, r"clash.*prefix="),
        ]
        for kwargs, message in cases:
            with pytest.raises(ConfigError, match=message):
                sparkiq.spark.enrich(events, state, "sales", **kwargs)
    finally:
        app.stop()


def stored_round_trip(arrow_type: pa.DataType, values: list[Any]) -> None:
    """Arrow -> stored values (the row codec) -> Arrow (enrich) gives the input back."""
    spark_json = _SPARK_TYPES[str(arrow_type)]
    schema = TableSchema.from_spark_json(
        {
            "type": "struct",
            "fields": [
                {"name": "k", "type": "integer", "nullable": True, "metadata": {}},
                {"name": "v", "type": spark_json, "nullable": True, "metadata": {}},
            ],
        },
        ["k"],
    )
    batch = pa.table(
        {"k": pa.array(range(len(values)), pa.int32()), "v": pa.array(values, arrow_type)}
    )
    stored = [msgspec.msgpack.decode(row)[1] for row in RowCodec(schema).encode_arrow(batch)]
    assert stored_to_arrow(stored, schema.field("v").type).equals(batch.column("v").chunk(0))


_SPARK_TYPES: dict[str, Any] = {
    "timestamp[us, tz=UTC]": "timestamp",
    "timestamp[us]": "timestamp_ntz",
    "date32[day]": "date",
    "decimal128(10, 2)": "decimal(10,2)",
    "float": "float",
    "binary": "binary",
    "struct<a: int32, b: list<element: string>>": {
        "type": "struct",
        "fields": [
            {"name": "a", "type": "integer", "nullable": True, "metadata": {}},
            {
                "name": "b",
                "type": {"type": "array", "elementType": "string", "containsNull": True},
                "nullable": True,
                "metadata": {},
            },
        ],
    },
    "map<string, list<element: int64>>": {
        "type": "map",
        "keyType": "string",
        "valueType": {"type": "array", "elementType": "long", "containsNull": True},
        "valueContainsNull": True,
    },
}

ROUND_TRIPS: list[tuple[pa.DataType, list[Any]]] = [
    (pa.timestamp("us", tz="UTC"), [dt.datetime(2024, 3, 1, 10, tzinfo=dt.UTC), None]),
    (pa.timestamp("us"), [dt.datetime(1969, 12, 31, 23, 59, 59, 5), None]),
    (pa.date32(), [dt.date(2024, 2, 29), None, dt.date(1900, 1, 1)]),
    (pa.decimal128(10, 2), [Decimal("12.50"), None, Decimal("-0.01")]),
    (pa.float32(), [1.5, None, -0.0]),
    (pa.binary(), [b"\x00\xff", None, b""]),
    (
        pa.struct([("a", pa.int32()), ("b", pa.list_(pa.field("element", pa.string())))]),
        [{"a": 1, "b": ["x", None]}, None, {"a": None, "b": None}, {"a": 2, "b": []}],
    ),
    (
        pa.map_(pa.string(), pa.list_(pa.field("element", pa.int64()))),
        [[("x", [1, None]), ("y", None)], None, []],
    ),
]


@pytest.mark.parametrize(("arrow_type", "values"), ROUND_TRIPS, ids=str)
def test_lookups_turn_stored_values_back_into_the_arrow_spark_sent(
    arrow_type: pa.DataType, values: list[Any]
) -> None:
    stored_round_trip(arrow_type, values)
