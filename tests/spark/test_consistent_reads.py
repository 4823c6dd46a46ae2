"""Reads that span partitions see one batch: an invariant checked while Spark commits batches.

Stock moves between bins of a warehouse: every move takes ``qty`` units out of one bin and
puts them into another, as two legs in the same input file (one micro-batch). The pipeline
keeps per bin the units held and the legs seen, over 16 partitions. So after batch ``B``:

- the units of all bins sum to exactly 0 (every move is -qty and +qty), and
- the legs sum to exactly ``2 * MOVES * (B + 1)`` (each file holds ``MOVES`` moves),

which ties every answer to the batch its position names. Readers loop (20 ms apart) over SQL
aggregates, a self-join, typed all-partition range queries and multi-key lookups while files
arrive; a reader that mixed partitions of two batches would see a total other than 0 or a leg count
that does not match its position.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparkiq import App, Position, RangeQuery, StateQueryRequest
from sparkiq.sql.errors import SqlPartitionError
from sparkiq.testing import JsonSource

BINS = [f"bin{i:03d}" for i in range(200)]
MOVES = 60
BATCHES = 8
PARTITIONS = 16
#: Between two reads of a reader (here and in test_consistent_cluster). Back to back, the
#: four readers held this process's interpreter for the whole test (three quarters of its
#: Python CPU went to them), slowing the batches they wait for, and the cluster test's
#: readers and nodes kept both cores busy; 20 ms apart each still reads every batch
#: several times.
PAUSE_S = 0.02


def moves(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(MOVES):
        source, target = rng.sample(BINS, 2)
        qty = rng.randint(1, 50)
        rows.append({"bin": source, "qty": -qty})
        rows.append({"bin": target, "qty": qty})
    return rows


def batch_of(position: Position) -> int:
    """The one batch of ``bins`` an answer was served at (fails if it mixes batches)."""
    offsets = set(position.to_map()["bins"].values())
    assert len(offsets) == 1, f"partitions answered at different batches: {position!r}"
    return offsets.pop()


def check(units: int, legs: int, batch_id: int) -> None:
    assert units == 0, f"units sum to {units} at batch {batch_id}, never a state of the table"
    assert legs == 2 * MOVES * (batch_id + 1), (legs, batch_id)


def read_sql(app: App) -> int:
    result = app.sql("SELECT sum(units) AS units, sum(legs) AS legs FROM bins")
    batch_id = batch_of(result.position)
    check(result.rows[0]["units"], result.rows[0]["legs"], batch_id)
    return batch_id


def read_self_join(app: App) -> int:
    result = app.sql(
        "SELECT sum(a.units) AS units, sum(b.legs) AS legs FROM bins a JOIN bins b ON a.bin = b.bin"
    )
    batch_id = batch_of(result.position)
    check(result.rows[0]["units"], result.rows[0]["legs"], batch_id)
    return batch_id


def read_range(app: App) -> int:
    result = app.query(StateQueryRequest.in_store("bins").with_query(RangeQuery.with_no_bounds()))
    units = legs = 0
    for answer in result.partition_results.values():
        assert answer.is_success, answer
        for _, row in answer.result:
            units += row["units"]
            legs += row["legs"]
    batch_id = batch_of(result.position)
    check(units, legs, batch_id)
    return batch_id


def read_keys(app: App) -> int:
    """Every bin by key in one statement: an IN list spans every partition."""
    listed = ", ".join(f"'{b}'" for b in BINS)
    result = app.sql(f"SELECT units, legs FROM bins WHERE bin IN ({listed})")
    batch_id = batch_of(result.position)
    check(sum(r["units"] for r in result.rows), sum(r["legs"] for r in result.rows), batch_id)
    return batch_id


READERS: dict[str, Callable[[App], int]] = {
    "sql": read_sql,
    "self-join": read_self_join,
    "range": read_range,
    "keys": read_keys,
}


def test_readers_never_see_a_state_no_batch_had(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    source = JsonSource(tmp_path / "in", "bin string, qty long")
    source.write(moves(0))
    stream = source.stream(spark)
    app = App(spark, state_dir=str(tmp_path / "state"))
    app.materialize(
        "bins",
        stream.groupBy("bin").agg(F.sum("qty").alias("units"), F.count("*").alias("legs")),
        key="bin",
        partitions=PARTITIONS,
    )
    app.start()
    stop = threading.Event()
    seen: dict[str, list[int]] = {name: [] for name in READERS}
    errors: list[BaseException] = []

    def reader(name: str) -> None:
        read = READERS[name]
        try:
            while not stop.is_set():
                seen[name].append(read(app))
                stop.wait(PAUSE_S)
        except BaseException as exc:  # reported below, with the reader's name
            errors.append(AssertionError(f"{name}: {exc}"))

    try:
        app.process_all_available()
        threads = [threading.Thread(target=reader, args=(n,), daemon=True) for n in READERS]
        for thread in threads:
            thread.start()
        for seed in range(1, BATCHES):
            source.write(moves(seed))
            app.process_all_available()
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors[0]
        for name, batches in seen.items():
            assert batches == sorted(batches), f"{name} went back in time: {batches}"
            # the readers ran while batches landed, not only before or after
            assert len(set(batches)) >= 3, (name, batches)
        assert read_sql(app) == BATCHES - 1
    finally:
        stop.set()
        app.stop()


def test_as_of_equals_spark_batch_mode_over_the_input_up_to_that_batch(
    spark: Any, tmp_path: Path
) -> None:
    """AS OF b, for several past b while the pipeline keeps committing, equals Spark's batch
    answer over exactly the files of batches 0..b; a batch beyond the history is refused."""
    from pyspark.sql import functions as F

    source = JsonSource(tmp_path / "in", "bin string, qty long")
    files = [source.write(moves(100))]
    app = App(spark, state_dir=str(tmp_path / "state"))
    app.materialize(
        "bins",
        source.stream(spark)
        .groupBy("bin")
        .agg(F.sum("qty").alias("units"), F.count("*").alias("legs")),
        key="bin",
        partitions=4,
        history=6,
    )
    app.start()
    try:
        app.process_all_available()
        for seed in range(101, 109):
            files.append(source.write(moves(seed)))
            app.process_all_available()
        newest = len(files) - 1
        files.append(source.write(moves(200)))  # the pipeline keeps running meanwhile
        for batch_id in (newest - 5, newest - 3, newest - 1, newest):
            truth = (
                spark.read.schema(source.schema)
                .json([str(f) for f in files[: batch_id + 1]])
                .groupBy("bin")
                .agg(F.sum("qty").alias("units"), F.count("*").alias("legs"))
                .collect()
            )
            got = app.sql(f"SELECT bin, units, legs FROM bins AS OF {batch_id}")
            assert sorted(tuple(r.values()) for r in got.rows) == sorted(
                (r["bin"], r["units"], r["legs"]) for r in truth
            ), batch_id
            assert batch_of(got.position) == batch_id
        app.process_all_available()
        with pytest.raises(SqlPartitionError, match="oldest batch still readable"):
            app.sql(f"SELECT count(*) FROM bins AS OF {newest - 8}")
    finally:
        app.stop()
