"""The Kafka differential: three pipelines over one topic of JSON orders, materialized by an
App, checked after each round of produced records against two independent ground truths,
Spark batch mode over the same topic (``spark.read.format("kafka")``) and the same
computation in Python over the records the broker acknowledged.

The pipelines are the three shapes a Kafka pipeline usually has:

- ``totals``: a plain aggregation, per user how many orders and their sum;
- ``per_window``: a windowed aggregation (2-minute windows per user) behind a 10-minute
  watermark on the order's event time;
- ``enriched``: a stream-static join, every order with its user's tier from a static
  DataFrame, keyed by the record's Kafka partition and offset (users without a tier drop
  out, as an inner join drops them).

Round ``r``'s event times lie in ``[r * 20 min, r * 20 min + 5 min)`` after :data:`BASE`: a
round spans less than the watermark's delay, so however Spark splits a round into
micro-batches none of its records is late, and each round moves the watermark past the
windows of the round before (Spark drops them from its state; the table keeps them). A *late*
round's records fall in round 0's first window, behind the watermark: Spark drops them from
the windowed aggregation, so ``per_window`` stays what batch mode computes up to the offsets
before them, while ``totals`` and ``enriched`` (no watermark) count them.

Used by tests/kafka/test_kafka_source.py (a classic session: every round; Spark Connect: the
on-time rounds) and by tests/spark/standalone_kafka.py (a standalone cluster's
executors read the topic: the first round).
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sparkiq import App, RangeQuery, StateQueryRequest
from sparkiq.changelog.log import Changelog
from sparkiq.testing import assert_table_matches, table_rows
from tests.kafka.client import Delivered, create_topic, end_offsets, produce
from tests.kafka.pipeline import expected_totals, totals

PARTITIONS = 4
SCHEMA = "user string, amount long, ts timestamp"
TABLES = ("totals", "per_window", "enriched")
#: Event times are naive UTC (the sessions' time zone) after BASE.
BASE = dt.datetime(2026, 1, 1, 12, 0, 0)
ROUND_GAP = dt.timedelta(minutes=20)
ROUND_SPAN = dt.timedelta(minutes=5)
WATERMARK = "10 minutes"
WINDOW_SECONDS = 120
USERS = 25
#: The rounds a differential run produces: (orders, late), the late round last.
ROUNDS = ((200, False), (200, False), (20, True))
#: The static side of the join: users u-00 to u-19 have a tier, u-20 to u-24 none.
TIERS = {f"u-{i:02d}": "gold" if i % 3 == 0 else "silver" for i in range(20)}


def parse(records: Any) -> Any:
    """Kafka records (JSON values) as orders, with the record's partition and offset."""
    from pyspark.sql import functions as F

    value = F.from_json(F.col("value").cast("string"), SCHEMA)
    return records.select("partition", "offset", value.alias("o")).select(
        "partition", "offset", "o.*"
    )


def per_window(orders: Any) -> Any:
    """Per user and 2-minute window of event time, how many orders and their total; the
    watermark (ignored in batch mode) lets Spark drop old windows and late orders."""
    from pyspark.sql import functions as F

    return (
        orders.withWatermark("ts", WATERMARK)
        .groupBy("user", F.window("ts", f"{WINDOW_SECONDS} seconds"))
        .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount"))
    )


def enriched(orders: Any, tiers: Any) -> Any:
    """Every order of a user with a tier, with the tier (a stream-static inner join)."""
    return orders.join(tiers, "user").select("partition", "offset", "user", "amount", "tier")


def _utc_seconds(when: dt.datetime) -> int:
    return int(when.replace(tzinfo=dt.UTC).timestamp())


def _as_spark_shows(seconds: int) -> dt.datetime:
    """A timestamp as PySpark and sparkiq give it: naive, in this process's local time."""
    return dt.datetime.fromtimestamp(seconds)


@dataclass
class KafkaDifferential:
    """One topic, the records the broker acknowledged on it, and the checks of an App's
    three tables over it. Produce rounds with :meth:`produce_round`, wait for the App
    (``process_all_available``), then :meth:`check`."""

    spark: Any
    servers: str
    topic: str
    delivered: list[Delivered] = field(default_factory=list)
    #: The topic's end offsets before the first late round (None until there is one).
    before_late: dict[int, int] | None = None

    def create_topic(self) -> None:
        create_topic(self.servers, self.topic, PARTITIONS)

    def materialize(self, app: App) -> None:
        """The three tables on ``app``, reading the topic from its start."""
        orders = parse(
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.servers)
            .option("subscribe", self.topic)
            .option("startingOffsets", "earliest")
            .load()
        )
        app.materialize("totals", totals(orders), key="user", partitions=4)
        app.materialize("per_window", per_window(orders), key="user", window="window", partitions=4)
        app.materialize(
            "enriched", enriched(orders, self._tiers()), key=["partition", "offset"], partitions=4
        )

    def run(
        self, app: App, state_dir: str, seed: int, rounds: int = len(ROUNDS)
    ) -> Iterator[dict[str, int]]:
        """Produce each of the first ``rounds`` of :data:`ROUNDS`, wait until ``app``
        (started, with the tables of :meth:`materialize`) has applied it, and :meth:`check`;
        yields each round's row counts."""
        rng = random.Random(seed)
        for index, (count, late) in enumerate(ROUNDS[:rounds]):
            self.produce_round(rng, index, count, late)
            app.process_all_available(timeout=300)
            yield self.check(app, state_dir)

    def produce_round(self, rng: random.Random, index: int, count: int, late: bool = False) -> None:
        """Produce ``count`` orders with the event times of round ``index`` (see the module
        docstring), or, when ``late``, behind the watermark; late rounds come last."""
        if late and self.before_late is None:
            self.before_late = self.ends()
        assert late or self.before_late is None, "an on-time round after a late one"
        start = BASE if late else BASE + index * ROUND_GAP
        span = WINDOW_SECONDS if late else int(ROUND_SPAN.total_seconds())
        records = []
        for _ in range(count):
            user = f"u-{rng.randrange(USERS):02d}"
            ts = start + dt.timedelta(seconds=rng.randrange(span))
            order = {"user": user, "amount": rng.randrange(1, 1000), "ts": ts.isoformat()}
            records.append((user, json.dumps(order)))
        self.delivered += produce(self.servers, self.topic, records)

    def ends(self) -> dict[int, int]:
        """The end offset of each partition, from what the broker acknowledged."""
        return {
            p: 1 + max((d.offset for d in self.delivered if d.partition == p), default=-1)
            for p in range(PARTITIONS)
        }

    def batch(self, ending: dict[int, int] | None = None) -> Any:
        """The topic in batch mode, up to ``ending`` offsets (default: its end), parsed."""
        if ending is None:
            ending_offsets = "latest"
        else:
            ending_offsets = json.dumps({self.topic: {str(p): o for p, o in ending.items()}})
        return parse(
            self.spark.read.format("kafka")
            .option("kafka.bootstrap.servers", self.servers)
            .option("subscribe", self.topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", ending_offsets)
            .load()
        )

    def check(self, app: App, state_dir: str) -> dict[str, int]:
        """Assert that every table equals Spark batch mode over the topic and the Python
        computation over the acknowledged records, and that each table's newest commit
        record, and a query's answer, carry the topic's end offsets as ``kafka:<topic>``.
        Returns each table's row count."""
        ends = self.ends()
        # every partition holds records, so the checks cover the source's partitions
        assert all(ends.values()), ends
        assert end_offsets(self.servers, self.topic, PARTITIONS) == ends

        on_time_ends = self.before_late or ends
        on_time = [d for d in self.delivered if d.offset < on_time_ends[d.partition]]
        assert_table_matches(app, "totals", totals(self.batch()))
        assert table_rows(app, "totals") == expected_totals(self.delivered)
        assert_table_matches(app, "per_window", per_window(self.batch(on_time_ends)))
        assert_table_matches(app, "per_window", expected_per_window(on_time))
        assert_table_matches(app, "enriched", enriched(self.batch(), self._tiers()))
        assert table_rows(app, "enriched") == expected_enriched(self.delivered)

        component = f"kafka:{self.topic}"
        everything = RangeQuery.with_no_bounds()
        for name in TABLES:
            changelog = Changelog(state_dir, name)
            record = changelog.read_commit(changelog.committed_batch_ids()[-1])
            assert record is not None
            assert record.position[component] == ends, name
            answer = app.query(StateQueryRequest.in_store(name).with_query(everything))
            assert answer.position.partition_offsets(component) == ends, name
        return {name: len(table_rows(app, name)) for name in TABLES}

    def _tiers(self) -> Any:
        return self.spark.createDataFrame(sorted(TIERS.items()), "user string, tier string")


def _orders(delivered: Iterable[Delivered]) -> Iterable[tuple[Delivered, dict[str, Any]]]:
    for record in delivered:
        assert record.value is not None
        yield record, json.loads(record.value)


def expected_per_window(delivered: Iterable[Delivered]) -> list[dict[str, Any]]:
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for _, order in _orders(delivered):
        seconds = _utc_seconds(dt.datetime.fromisoformat(order["ts"]))
        start = seconds - seconds % WINDOW_SECONDS
        window = {
            "start": _as_spark_shows(start),
            "end": _as_spark_shows(start + WINDOW_SECONDS),
        }
        row = rows.setdefault(
            (order["user"], start),
            {"user": order["user"], "window": window, "orders": 0, "amount": 0},
        )
        row["orders"] += 1
        row["amount"] += order["amount"]
    return list(rows.values())


def expected_enriched(delivered: Iterable[Delivered]) -> dict[tuple[int, int], dict[str, Any]]:
    return {
        (record.partition, record.offset): {
            "partition": record.partition,
            "offset": record.offset,
            "user": order["user"],
            "amount": order["amount"],
            "tier": TIERS[order["user"]],
        }
        for record, order in _orders(delivered)
        if order["user"] in TIERS
    }
