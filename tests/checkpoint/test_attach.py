"""Attach: a running Spark query's state, served from its checkpoint, against Spark's answers.

One streaming aggregation runs (untouched user code: a JSON folder source, a memory sink)
while the tests feed it batch by batch; its state is attached and compared, at several
batches, with Spark's own State Data Source (``format("statestore")``) and with the query's
output rows. Failure paths use copies of the checkpoint, so the running query is never
disturbed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sparkiq
from sparkiq import KeyQuery, StateQueryRequest
from sparkiq.errors import ConfigError
from sparkiq.testing import JsonSource

PARTITIONS = 3
BATCHES = [
    [{"k": "a", "g": 1, "n": 5}, {"k": "b", "g": 2, "n": 7}, {"k": "a", "g": 1, "n": 1}],
    [{"k": "c", "g": 1, "n": -4}, {"k": "a", "g": 2, "n": 10}, {"k": "é", "g": 3, "n": 0}],
    [{"k": f"key-{i}", "g": i % 4, "n": i} for i in range(40)] + [{"k": "b", "g": 2, "n": 1}],
]


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the SHA-256 of its bytes."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


class RunningQuery:
    """``groupBy(k, g).agg(sum, count, min, max)`` on a JSON folder, written to a memory
    sink in complete mode, with its own checkpoint; fed one batch per :meth:`feed`."""

    def __init__(self, spark: Any, root: Path) -> None:
        self.spark = spark
        self.checkpoint = root / "checkpoint"
        self.source = JsonSource(root / "input", "k string, g int, n long")
        self.start()
        self.batch = -1

    def start(self) -> None:
        """Start (or restart, from the same checkpoint) the query."""
        from pyspark.sql import functions as F

        spark = self.spark
        previous = spark.conf.get("spark.sql.shuffle.partitions")
        spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
        try:
            counts = (
                self.source.stream(spark)
                .groupBy("k", "g")
                .agg(F.sum("n").alias("total"), F.count("*").alias("rows"),
                     F.min("n").alias("low"), F.max("n").alias("high"))
            )  # fmt: skip
            self.query = (
                counts.writeStream.format("memory")
                .queryName("attach_counts")
                .outputMode("complete")
                .option("checkpointLocation", str(self.checkpoint))
                .start()
            )
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", previous)

    def feed(self, rows: list[dict[str, Any]]) -> int:
        self.source.write(rows)
        self.query.processAllAvailable()
        self.batch = int(self.query.lastProgress["batchId"])
        return self.batch

    def output(self) -> dict[tuple[str, int], dict[str, Any]]:
        rows = self.spark.sql("SELECT * FROM attach_counts").collect()
        return {(r["k"], r["g"]): r.asDict() for r in rows}

    def state(self, batch_id: int) -> dict[tuple[str, int], tuple[dict[str, Any], int]]:
        """Spark's State Data Source at ``batch_id``: key -> (value buffer, partition)."""
        frame = (
            self.spark.read.format("statestore")
            .option("batchId", batch_id)
            .load(str(self.checkpoint))
        )
        out = {}
        for row in frame.collect():
            key = row["key"].asDict()
            out[(key["k"], key["g"])] = (row["value"].asDict(), row["partition_id"])
        return out

    def stop(self) -> None:
        self.query.stop()


@pytest.fixture(scope="module")
def running(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningQuery]:
    query = RunningQuery(spark, tmp_path_factory.mktemp("attach"))
    try:
        yield query
    finally:
        query.stop()


def attached_rows(handle: sparkiq.Attached, table: str) -> dict[tuple[str, int], dict[str, Any]]:
    result = handle.sql(f"SELECT * FROM {table}")
    return {(r["k"], r["g"]): r for r in result.rows}


def test_aggregation_matches_state_source_and_output_while_running(
    running: RunningQuery, tmp_path: Path
) -> None:
    handle = sparkiq.attach(str(running.checkpoint), name="clicks", local_dir=str(tmp_path))
    try:
        for rows in BATCHES:
            batch = running.feed(rows)
            assert handle.wait_for(batch, timeout=60), handle.status()
            assert handle.tables == ["clicks_agg"]
            served = attached_rows(handle, "clicks_agg")
            state = running.state(batch)
            # every key, every buffer value, exactly as Spark's own reader sees batch `batch`
            assert set(served) == set(state)
            for key, (value, partition) in state.items():
                assert served[key] == {"k": key[0], "g": key[1], "sum": value["sum"],
                                       "count": value["count"], "min": value["min"],
                                       "max": value["max"]}  # fmt: skip
                # sparkiq's partitioner puts the composite key where Spark keeps its state
                assert handle.partition_for_key("clicks_agg", key) == partition
            # and the buffer is the query's output here (sum, count, min, max)
            output = running.output()
            assert {k: (o["total"], o["rows"], o["low"], o["high"]) for k, o in output.items()} == {
                k: (r["sum"], r["count"], r["min"], r["max"]) for k, r in served.items()
            }
        # typed queries answer too, with the batch id as the position
        result = handle.query(
            StateQueryRequest.in_store("clicks_agg").with_query(KeyQuery.with_key(("b", 2)))
        )
        only = result.only_partition_result()
        assert only.result == {"k": "b", "g": 2, "sum": 8, "count": 2, "min": 1, "max": 7}
        assert only.position.to_map()["clicks_agg"][only_partition(result)] == running.batch
        assert handle.get("clicks_agg", ("nope", 0)) is None
    finally:
        handle.close()
    # the checkpoint is only read: a fresh attach + restore changes no byte of it
    digest = tree_digest(running.checkpoint)
    with sparkiq.attach(str(running.checkpoint), name="clicks", local_dir=str(tmp_path)) as again:
        assert again.wait_for(running.batch, timeout=60)
        assert again.get("clicks_agg", ("é", 3)) == {
            "k": "é", "g": 3, "sum": 0, "count": 1, "min": 0, "max": 0
        }  # fmt: skip
    assert tree_digest(running.checkpoint) == digest


def wait_settled(handle: sparkiq.Attached, broken: int, batch: int, timeout: float = 60.0) -> None:
    """Until partition ``broken`` reports its error and every other one applied ``batch``.
    ``wait_for`` returns False as soon as one partition is stuck, while the others may still
    be restoring (seconds on a loaded machine); the deadline is for a hang, not a speed
    target."""
    deadline = time.monotonic() + timeout

    def settled() -> bool:
        return all(
            s.state == "error" if s.partition == broken else s.batch_id >= batch
            for s in handle.status()
        )

    while not settled():
        assert time.monotonic() < deadline, handle.status()
        time.sleep(0.05)


def only_partition(result: Any) -> int:
    (partition,) = result.partition_results
    return int(partition)


def copy_checkpoint(running: RunningQuery, target: Path) -> Path:
    shutil.copytree(running.checkpoint, target)
    return target


def test_a_batch_without_its_commit_is_not_served(running: RunningQuery, tmp_path: Path) -> None:
    if running.batch < 1:
        running.feed(BATCHES[0])
        running.feed(BATCHES[1])
    copy = copy_checkpoint(running, tmp_path / "chk")
    newest = running.batch
    os.remove(copy / "commits" / str(newest))
    with sparkiq.attach(str(copy), name="c", store="memory") as handle:
        assert handle.wait_for(newest - 1, timeout=60)
        assert not handle.wait_for(newest, timeout=1.0)
        assert {s.batch_id for s in handle.status()} == {newest - 1}
        assert handle.sql("SELECT count(*) AS n FROM c_agg").rows == [
            {"n": len(running.state(newest - 1))}
        ]


def test_a_corrupted_state_file_makes_its_partition_unhealthy(
    running: RunningQuery, tmp_path: Path
) -> None:
    if running.batch < 1:
        running.feed(BATCHES[0])
        running.feed(BATCHES[1])
    copy = copy_checkpoint(running, tmp_path / "chk")
    newest = running.batch
    # the newest version's file of partition 0: cut it in half
    partition_dir = copy / "state" / "0" / "0"
    victim = partition_dir / f"{newest + 1}.delta"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    for crc in partition_dir.glob(f".{newest + 1}.delta.crc"):
        crc.unlink()
    with sparkiq.attach(str(copy), name="c", store="memory") as handle:
        handle.wait_for(newest - 1, timeout=60)
        assert not handle.wait_for(newest, timeout=2.0)
        wait_settled(handle, 0, newest)
        status = {s.partition: s for s in handle.status()}
        assert status[0].state == "error" and status[0].batch_id == newest - 1
        assert f"{newest + 1}.delta" in (status[0].error or "")
        # the other partitions went on; partition 0 keeps serving its last good batch
        assert all(s.batch_id == newest and s.healthy for p, s in status.items() if p != 0)


def test_attach_refuses_bad_arguments(running: RunningQuery, tmp_path: Path) -> None:
    if running.batch < 0:
        running.feed(BATCHES[0])
    with pytest.raises(ConfigError, match="inside the checkpoint"):
        sparkiq.attach(str(running.checkpoint), name="c", local_dir=str(running.checkpoint / "x"))
    with pytest.raises(ConfigError, match=r"operators \[7\] are not in the checkpoint"):
        sparkiq.attach(str(running.checkpoint), name="c", operators=[7], store="memory")


def test_windowed_aggregation_and_dedupe_match_spark(spark: Any, tmp_path: Path) -> None:
    """A windowed count with a watermark (expired windows leave the state) and a
    dropDuplicates, in one query each: every served row equals Spark's State Data Source at
    every batch, and each key sits in the partition Spark keeps it in."""
    import datetime as dt

    from pyspark.sql import functions as F

    source = JsonSource(tmp_path / "events", "user string, at timestamp")
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    try:
        events = source.stream(spark).withWatermark("at", "10 seconds")
        windowed = (
            events.groupBy(F.window("at", "10 seconds"), "user").count()
            .writeStream.format("noop").outputMode("update")
            .option("checkpointLocation", str(tmp_path / "windowed")).start()
        )  # fmt: skip
        deduped = (
            events.dropDuplicates(["user", "at"])
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "deduped")).start()
        )  # fmt: skip
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    base = dt.datetime(2026, 1, 1, 12, 0, 0)
    feeds = [
        [{"user": "a", "at": base}, {"user": "b", "at": base + dt.timedelta(seconds=3)},
         {"user": "a", "at": base}],
        [{"user": "a", "at": base + dt.timedelta(seconds=12)},
         {"user": "c", "at": base + dt.timedelta(seconds=15)}],
        [{"user": "b", "at": base + dt.timedelta(seconds=41)}],  # moves the watermark past 0-10 s
    ]  # fmt: skip
    handles = {
        "w": sparkiq.attach(str(tmp_path / "windowed"), name="w", store="memory"),
        "d": sparkiq.attach(str(tmp_path / "deduped"), name="d", store="memory"),
    }
    try:
        for rows in feeds:
            source.write(rows)
            for running in (windowed, deduped):
                running.processAllAvailable()
            for prefix, running, table in (("w", windowed, "w_window"), ("d", deduped, "d_dedupe")):
                # the newest batch that ran: on a slow machine lastProgress may be an idle
                # trigger's (reported every 10 s), whose batchId is the next, unrun batch
                batch = max(
                    int(p["batchId"])
                    for p in running.recentProgress
                    if "addBatch" in p["durationMs"]
                )
                handle = handles[prefix]
                assert handle.wait_for(batch, timeout=60), handle.status()
                assert handle.tables == [table]
                frame = (
                    spark.read.format("statestore")
                    .option("batchId", batch)
                    .load(str(tmp_path / ("windowed" if prefix == "w" else "deduped")))
                )
                expected = {}
                for row in frame.collect():
                    key = row["key"].asDict(recursive=True)
                    flat = (
                        (key["window"]["start"], key["window"]["end"], key["user"])
                        if prefix == "w"
                        else (key["user"], key["at"])
                    )
                    expected[flat] = (row["value"], row["partition_id"])
                served = handle.sql(f"SELECT * FROM {table}").rows
                if prefix == "w":
                    got = {(r["window_start"], r["window_end"], r["user"]): r for r in served}
                    assert {k: r["count"] for k, r in got.items()} == {
                        k: v["count"] for k, (v, _) in expected.items()
                    }
                else:
                    got = {(r["user"], r["at"]): r for r in served}
                    assert set(got) == set(expected)
                for key, (_, partition) in expected.items():
                    assert handle.partition_for_key(table, key) == partition
        # the 0-10 s windows expired with the watermark: gone from Spark's state and from ours
        starts = {r["window_start"] for r in handles["w"].sql("SELECT * FROM w_window").rows}
        assert base not in starts
    finally:
        for handle in handles.values():
            handle.close()
        windowed.stop()
        deduped.stop()


def test_a_query_restarted_from_its_checkpoint_is_followed_on(
    running: RunningQuery, tmp_path: Path
) -> None:
    if running.batch < 0:
        running.feed(BATCHES[0])
    with sparkiq.attach(str(running.checkpoint), name="clicks", store="memory") as handle:
        assert handle.wait_for(running.batch, timeout=60)
        running.stop()
        running.start()  # the same checkpoint: Spark goes on with the next batch id
        batch = running.feed([{"k": "after-restart", "g": 9, "n": 3}, {"k": "a", "g": 1, "n": 1}])
        assert handle.wait_for(batch, timeout=60), handle.status()
        served = attached_rows(handle, "clicks_agg")
        assert {k: (r["sum"], r["count"]) for k, r in served.items()} == {
            k: (v["sum"], v["count"]) for k, (v, _) in running.state(batch).items()
        }
        assert served[("after-restart", 9)]["sum"] == 3


def test_a_state_file_deleted_before_it_was_read_is_reported_not_skipped(
    running: RunningQuery, tmp_path: Path
) -> None:
    """Spark's maintenance deleted version 1 of partition 1 (no snapshot covers it): that
    partition cannot be restored and says which file is gone; the others serve."""
    if running.batch < 1:
        running.feed(BATCHES[0])
        running.feed(BATCHES[1])
    copy = copy_checkpoint(running, tmp_path / "chk")
    (copy / "state" / "0" / "1" / "1.delta").unlink()
    for crc in (copy / "state" / "0" / "1").glob(".1.delta.crc"):
        crc.unlink()
    with sparkiq.attach(str(copy), name="c", store="memory") as handle:
        assert not handle.wait_for(running.batch, timeout=3.0)
        wait_settled(handle, 1, running.batch)
        status = {s.partition: s for s in handle.status()}
        assert status[1].state == "error" and status[1].batch_id == -1
        assert "1.delta" in (status[1].error or "")
        assert all(s.batch_id == running.batch for p, s in status.items() if p != 1)


def test_push_queries_deliver_sparks_own_state_changes(
    running: RunningQuery, tmp_path: Path
) -> None:
    """``EMIT CHANGES`` on an attached table: each batch's changed keys, as Spark's state
    has them after the batch, at the query's batch id."""
    if running.batch < 0:
        running.feed(BATCHES[0])
    node = sparkiq.Node(
        str(tmp_path / "state"), checkpoints={"clicks": str(running.checkpoint)}, store="memory"
    ).start()
    try:
        assert node.tables == ["clicks_agg"]
        with node.stream("SELECT k, g, sum, count FROM clicks_agg WHERE g = 7 EMIT CHANGES") as sub:
            batch = running.feed(
                [
                    {"k": "p1", "g": 7, "n": 4},
                    {"k": "p2", "g": 7, "n": 1},
                    {"k": "p1", "g": 8, "n": 9},
                ]
            )
            changes = [sub.poll(timeout=60), sub.poll(timeout=60)]
            assert all(c is not None for c in changes)
            assert sorted((c.key, c.row, c.batch_id) for c in changes if c is not None) == [
                (("p1", 7), {"k": "p1", "g": 7, "sum": 4, "count": 1}, batch),
                (("p2", 7), {"k": "p2", "g": 7, "sum": 1, "count": 1}, batch),
            ]
            batch = running.feed([{"k": "p1", "g": 7, "n": 6}])
            change = sub.poll(timeout=60)
            assert change is not None
            assert (change.key, change.row, change.batch_id) == (
                ("p1", 7), {"k": "p1", "g": 7, "sum": 10, "count": 2}, batch
            )  # fmt: skip
    finally:
        node.stop()


def test_app_attach_serves_a_query_it_did_not_start(
    spark: Any, running: RunningQuery, tmp_path: Path
) -> None:
    if running.batch < 0:
        running.feed(BATCHES[0])
    app = sparkiq.App(spark, state_dir=str(tmp_path / "state"), name="host")
    app.start()
    try:
        # the query's checkpoint is found by its id under Spark's default location...
        key = "spark.sql.streaming.checkpointLocation"
        previous = spark.conf.get(key, None)
        spark.conf.set(key, str(running.checkpoint.parent))
        try:
            assert app.attach(running.query, "clicks") == ["clicks_agg"]
        finally:
            if previous is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, previous)
        assert app.node is not None and app.node.wait_for("clicks_agg", running.batch, 60)
        expected = {k: v["sum"] for k, (v, _) in running.state(running.batch).items()}
        rows = app.sql("SELECT k, g, sum FROM clicks_agg").rows
        assert {(r["k"], r["g"]): r["sum"] for r in rows} == expected
        row = app.get("clicks_agg", ("a", 1))
        assert row is not None and (row["k"], row["g"], row["sum"]) == ("a", 1, expected[("a", 1)])
        # ... and without it, the error says what to pass
        with pytest.raises(ConfigError, match="pass checkpoint="):
            app.attach(running.query, "again")
    finally:
        app.stop()
