"""Publishing a table to a compacted topic (sparkiq.publish), against the real broker, with
tables written without Spark (sparkiq.testing.write_table): the record format exactly as
docs/kafka.md states it (key bytes, murmur2 partitions computed here from the definition,
headers, the schema record, JSON type rules), refusals (a topic that is not compacted, bad
client config, batches retention deleted, a fenced publisher), and exactly once across
``kill -9`` of a ``sparkiq publish`` process, inside and outside transactions."""

from __future__ import annotations

import datetime as dt
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sparkiq.changelog import Changelog
from sparkiq.errors import ConfigError
from sparkiq.publish.errors import PublisherFencedError, PublishError, PublishGapError
from sparkiq.publish.publisher import PAUSE_VARIABLE, TablePublisher
from sparkiq.query.position import Position
from sparkiq.spark.maintenance import compact_table
from sparkiq.testing import write_table
from tests.kafka.client import create_topic
from tests.kafka.published import (
    compacted,
    default_partition,
    read_topic,
    schema_record,
)

ROOT = Path(__file__).resolve().parents[2]

TYPES_SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": False},
        {"name": "price", "type": "decimal(10,2)", "nullable": True},
        {"name": "at", "type": "timestamp", "nullable": True},
        {"name": "wall", "type": "timestamp_ntz", "nullable": True},
        {"name": "day", "type": "date", "nullable": True},
        {"name": "blob", "type": "binary", "nullable": True},
        {"name": "score", "type": "double", "nullable": True},
        {"name": "ratio", "type": "float", "nullable": True},
        {
            "name": "tags",
            "type": {"type": "array", "elementType": "string", "containsNull": True},
            "nullable": True,
        },
        {
            "name": "counts",
            "type": {
                "type": "map",
                "keyType": "string",
                "valueType": "integer",
                "valueContainsNull": True,
            },
            "nullable": True,
        },
        {
            "name": "place",
            "type": {
                "type": "struct",
                "fields": [
                    {"name": "city", "type": "string", "nullable": True},
                    {"name": "seen", "type": "timestamp", "nullable": True},
                ],
            },
            "nullable": True,
        },
        {"name": "ok", "type": "boolean", "nullable": True},
    ],
}
UTC = dt.UTC
AT = dt.datetime(2026, 11, 29, 0, 31, 5, 123456, tzinfo=UTC)
TYPED_ROWS = [
    {
        "id": 1,
        "price": Decimal("12.50"),
        "at": AT,
        "wall": dt.datetime(2026, 11, 29, 0, 31, 5, 123456),
        "day": dt.date(2026, 11, 29),
        "blob": b"\x00\x01\x02\xff",
        "score": float("nan"),
        "ratio": 0.1,
        "tags": ["a", None],
        "counts": {"x": 1},
        "place": {"city": "Oslo", "seen": dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)},
        "ok": True,
    },
    {
        "id": -7,
        "price": Decimal("-0.05"),
        "at": dt.datetime(1970, 1, 1, tzinfo=UTC),
        "wall": None,
        "day": dt.date(1, 1, 1),
        "blob": b"",
        "score": float("inf"),
        "ratio": float("-inf"),
        "tags": [],
        "counts": {},
        "place": None,
        "ok": None,
    },
    {"id": 3, "score": float("-inf"), "ratio": 2.5, "tags": None, "counts": None},
]
# What docs/kafka.md says each row becomes, written out by hand.
TYPED_VALUES = {
    1: {
        "id": 1,
        "price": "12.50",
        "at": "2026-11-29T00:31:05.123456Z",
        "wall": "2026-11-29T00:31:05.123456",
        "day": "2026-11-29",
        "blob": "AAEC/w==",
        "score": "NaN",
        "ratio": 0.1,
        "tags": ["a", None],
        "counts": {"x": 1},
        "place": {"city": "Oslo", "seen": "1969-12-31T23:59:59.000000Z"},
        "ok": True,
    },
    -7: {
        "id": -7,
        "price": "-0.05",
        "at": "1970-01-01T00:00:00.000000Z",
        "wall": None,
        "day": "0001-01-01",
        "blob": "",
        "score": "Infinity",
        "ratio": "-Infinity",
        "tags": [],
        "counts": {},
        "place": None,
        "ok": None,
    },
    3: {
        "id": 3,
        "price": None,
        "at": None,
        "wall": None,
        "day": None,
        "blob": None,
        "score": "-Infinity",
        "ratio": 2.5,
        "tags": None,
        "counts": None,
        "place": None,
        "ok": None,
    },
}


def topic_name(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def publish_once(state_dir: str, table: str, topic: str, servers: str, **options: Any) -> int:
    publisher = TablePublisher(state_dir, table, topic, {"bootstrap.servers": servers}, **options)
    try:
        return publisher.publish_available()
    finally:
        publisher.stop()


def test_record_format_types_headers_partitions_and_schema(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    state = str(tmp_path)
    writer = write_table(state, "typed", TYPED_ROWS, key="id", schema=TYPES_SCHEMA, partitions=3)
    writer.write(deletes=[3], position={"kafka:src": {0: 5, 1: 9}})
    topic = topic_name("typed")
    assert publish_once(state, "typed", topic, kafka_bootstrap) == 2

    records = read_topic(kafka_bootstrap, topic)
    assert len(records) == 4  # three rows, then a tombstone
    for record in records:
        assert record.partition == default_partition(record.key, 3), record
        assert record.headers["sparkiq.table"] == b"typed"
    values = {json.loads(r.key): json.loads(r.value) for r in records if r.value is not None}
    assert values == TYPED_VALUES
    # the raw bytes too: compact, keys in the table's column order
    first = next(r for r in records if r.key == b"1")
    assert first.value is not None and first.value.startswith(b'{"id":1,"price":"12.50","at":')
    (tombstone,) = [r for r in records if r.value is None]
    assert tombstone.key == b"3" and tombstone.batch == 1
    position = Position.from_token(tombstone.headers["sparkiq.position"].decode())
    assert position.to_map() == {"typed": {0: 1, 1: 1, 2: 1}, "kafka:src": {0: 5, 1: 9}}
    assert compacted(records) == {b"1": TYPED_VALUES[1], b"-7": TYPED_VALUES[-7]}

    assert schema_record(kafka_bootstrap, topic) == {
        "format": "sparkiq-table",
        "version": 1,
        "table": "typed",
        "topic": topic,
        "key_columns": ["id"],
        "columns": [
            {"name": "id", "type": "bigint", "nullable": False},
            {"name": "price", "type": "decimal(10,2)", "nullable": True},
            {"name": "at", "type": "timestamp", "nullable": True},
            {"name": "wall", "type": "timestamp_ntz", "nullable": True},
            {"name": "day", "type": "date", "nullable": True},
            {"name": "blob", "type": "binary", "nullable": True},
            {"name": "score", "type": "double", "nullable": True},
            {"name": "ratio", "type": "float", "nullable": True},
            {"name": "tags", "type": "array<string>", "nullable": True},
            {"name": "counts", "type": "map<string,int>", "nullable": True},
            {"name": "place", "type": "struct<city:string,seen:timestamp>", "nullable": True},
            {"name": "ok", "type": "boolean", "nullable": True},
        ],
        "key_format": "json",
        "value_format": "json",
        "partitions": 3,
    }


def test_composite_windowed_and_kafka_format_keys(kafka_bootstrap: str, tmp_path: Path) -> None:
    state = str(tmp_path)
    flights = [
        {"carrier": "AA", "flight": 17, "late": 3},
        {"carrier": "LH", "flight": 400, "late": 0},
    ]
    write_table(state, "flights", flights, key=["carrier", "flight"], partitions=2)
    write_table(state, "flights", deletes=[("LH", 400)])
    start = dt.datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    window = {"start": start, "end": start + dt.timedelta(minutes=5)}
    write_table(state, "per_window", [{"user": "u", "w": window, "n": 2}], key="user", window="w")
    write_table(state, "per_window", deletes=[("u", start)])
    write_table(state, "named", [{"name": "ü-1", "n": 1}], key="name")
    write_table(state, "numbered", [{"id": 5, "n": 1}, {"id": -2, "n": 2}], key="id")
    write_table(state, "numbered", deletes=[5])

    topics = {t: topic_name(t) for t in ("flights", "per_window", "named", "numbered")}
    for table, topic in topics.items():
        options = {"key_format": "kafka"} if table in ("named", "numbered") else {}
        publish_once(state, table, topic, kafka_bootstrap, **options)
    keys = {
        t: [(r.key, r.value is None) for r in read_topic(kafka_bootstrap, topic)]
        for t, topic in topics.items()
    }

    assert sorted(keys["flights"]) == [
        (b'{"carrier":"AA","flight":17}', False),
        (b'{"carrier":"LH","flight":400}', False),
        (b'{"carrier":"LH","flight":400}', True),  # a tombstone's key is the row's key
    ]
    window_key = b'{"user":"u","w":{"start":"2026-01-01T10:00:00.000000Z"}}'
    assert keys["per_window"] == [(window_key, False), (window_key, True)]
    assert keys["named"] == [("ü-1".encode(), False)]
    assert sorted(keys["numbered"]) == sorted(
        [
            ((-2).to_bytes(8, "big", signed=True), False),
            ((5).to_bytes(8, "big", signed=True), False),
            ((5).to_bytes(8, "big", signed=True), True),
        ]
    )
    assert schema_record(kafka_bootstrap, topics["per_window"])["key_columns"] == ["user", "w"]
    assert schema_record(kafka_bootstrap, topics["named"])["key_format"] == "kafka"
    with pytest.raises(ConfigError, match="key_format='kafka' takes one key column"):
        TablePublisher(
            state, "flights", "x", {"bootstrap.servers": kafka_bootstrap}, key_format="kafka"
        )


def test_refusals_name_the_problem(kafka_bootstrap: str, tmp_path: Path) -> None:
    state = str(tmp_path)
    write_table(state, "t", [{"k": "a", "n": 1}], key="k")
    servers = {"bootstrap.servers": kafka_bootstrap}

    plain = topic_name("plain")
    create_topic(kafka_bootstrap, plain, 2)  # cleanup.policy=delete, the broker's default
    with pytest.raises(PublishError, match=r"cleanup\.policy=delete.*compacted"):
        publish_once(state, "t", plain, kafka_bootstrap)
    assert read_topic(kafka_bootstrap, plain) == []

    with pytest.raises(ConfigError, match=r"bootstrap\.server"):
        TablePublisher(state, "t", "x", {"bootstrap.server": kafka_bootstrap})
    with pytest.raises(ConfigError, match=r'No such configuration property: "bogus\.setting"'):
        TablePublisher(state, "t", "x", {**servers, "bogus.setting": "1"}).publish_available()
    thread = TablePublisher(state, "t", "x", {**servers, "bogus.setting": "1"}).start()
    try:  # on a thread (as an App runs it): stopped, and its status says why
        assert not thread.wait_for(0, timeout=60)
        assert thread.status().state == "failed" and "bogus.setting" in str(thread.status().error)
    finally:
        thread.stop()
    with pytest.raises(ConfigError, match="partitioner"):
        TablePublisher(state, "t", "x", {**servers, "partitioner": "consistent"})
    with pytest.raises(ConfigError, match="unknown value_format 'avro'"):
        TablePublisher(state, "t", "x", servers, value_format="avro")

    # the command line says which argument is wrong, exit code 2
    command = [sys.executable, "-m", "sparkiq.cli", "publish", "--state-dir", state]
    command += ["--table", "t", "--topic", "x", "--bootstrap-servers", kafka_bootstrap]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    bad = subprocess.run([*command, "--config", "acks"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2
    assert "--config 'acks': expected NAME=VALUE" in bad.stderr
    bad = subprocess.run([*command, "--config", "acks=1"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "kafka_config sets acks='1'" in bad.stderr

    # another table's topic
    mine = topic_name("mine")
    publish_once(state, "t", mine, kafka_bootstrap)
    write_table(state, "other", [{"k": "b", "n": 2}], key="k")
    with pytest.raises(PublishError, match="table 't'"):
        publish_once(state, "other", mine, kafka_bootstrap)


def test_a_gap_left_by_retention_is_refused_and_an_empty_topic_starts_from_snapshots(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    state = str(tmp_path)
    writer = write_table(state, "t", [{"k": "a", "n": 1}, {"k": "b", "n": 1}], key="k")
    topic = topic_name("gap")
    publish_once(state, "t", topic, kafka_bootstrap)
    writer.write([{"k": "a", "n": 2}, {"k": "c", "n": 2}], deletes=["b"])
    writer.write([{"k": "c", "n": 3}])
    writer.write([{"k": "d", "n": 4}], deletes=["a"])
    compact_table(state, "t")  # snapshots at batch 3, then retention deletes what they cover
    changelog = Changelog(state, "t")
    for batch in (0, 1, 2):
        os.remove(changelog.commit_path(batch))
    with pytest.raises(PublishGapError, match=r"batches 1\.\.2 were deleted by retention"):
        publish_once(state, "t", topic, kafka_bootstrap)
    assert {r.batch for r in read_topic(kafka_bootstrap, topic)} == {0}

    # an empty topic starts with the table's rows at its newest batch, then follows it
    fresh = topic_name("fresh")
    assert publish_once(state, "t", fresh, kafka_bootstrap) == 0  # batch 3 was the start
    records = read_topic(kafka_bootstrap, fresh)
    assert sorted((r.key, r.batch) for r in records) == [(b'"c"', 3), (b'"d"', 3)]
    writer.write([{"k": "e", "n": 5}], deletes=["c"])
    assert publish_once(state, "t", fresh, kafka_bootstrap) == 1
    records = read_topic(kafka_bootstrap, fresh)
    assert compacted(records) == {b'"d"': {"k": "d", "n": 4}, b'"e"': {"k": "e", "n": 5}}
    assert sorted(r.batch for r in records) == [3, 3, 4, 4]

    # without a snapshot, a table whose first batch is gone cannot start a topic
    write_table(state, "u", [{"k": "a", "n": 1}], key="k").write([{"k": "b", "n": 2}])
    os.remove(Changelog(state, "u").commit_path(0))
    with pytest.raises(PublishGapError, match=r"no snapshot and batch 0 after it is gone"):
        publish_once(state, "u", topic_name("fresh"), kafka_bootstrap)


def test_a_complete_mode_batch_deletes_the_keys_it_no_longer_has(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    state = str(tmp_path)
    rows = [{"k": k, "n": 1} for k in "abcdef"]
    writer = write_table(state, "t", rows, key="k", partitions=2, output_mode="complete")
    writer.write([{"k": "a", "n": 2}, {"k": "z", "n": 2}])  # the whole table now
    topic = topic_name("complete")
    assert publish_once(state, "t", topic, kafka_bootstrap) == 2
    records = read_topic(kafka_bootstrap, topic)
    assert compacted(records) == {b'"a"': {"k": "a", "n": 2}, b'"z"': {"k": "z", "n": 2}}
    tombstones = sorted(r.key for r in records if r.value is None)
    assert tombstones == [json.dumps(k).encode() for k in "bcdef"]
    assert {r.batch for r in records if r.value is None} == {1}


def test_a_table_rebuilt_under_its_name_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    state = str(tmp_path)
    writer = write_table(state, "t", [{"k": "a", "n": 1}], key="k")
    writer.write([{"k": "b", "n": 2}])
    topic = topic_name("rebuilt")
    assert publish_once(state, "t", topic, kafka_bootstrap) == 2
    shutil.rmtree(Changelog(state, "t").root)
    write_table(state, "t", [{"k": "c", "n": 3}], key="k")  # batch 0 again
    with pytest.raises(PublishError, match="holds batch 1 but the table's newest committed"):
        publish_once(state, "t", topic, kafka_bootstrap)


def test_a_second_publisher_fences_the_first(kafka_bootstrap: str, tmp_path: Path) -> None:
    state = str(tmp_path)
    writer = write_table(state, "t", [{"k": "a", "n": 1}], key="k")
    topic = topic_name("fence")
    config = {"bootstrap.servers": kafka_bootstrap}
    first = TablePublisher(state, "t", topic, config)
    second = TablePublisher(state, "t", topic, config)
    try:
        assert first.publish_available() == 1
        writer.write([{"k": "b", "n": 2}])
        assert second.publish_available() == 1  # resumes after batch 0, from the topic
        writer.write([{"k": "c", "n": 3}])
        with pytest.raises(PublisherFencedError, match="took over"):
            first.publish_available()
        first.start()  # its thread stops at once, saying why
        assert not first.wait_for(2, timeout=60)
        assert first.status().state == "fenced"
        assert second.publish_available() == 1
    finally:
        first.stop()
        second.stop()
    assert sorted(r.batch for r in read_topic(kafka_bootstrap, topic)) == [0, 1, 2]


# -- exactly once across kill -9 ------------------------------------------------------------


class _Lines:
    """A process's stderr lines, read on a thread, awaited with a deadline."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        assert process.stderr is not None
        stream = process.stderr
        threading.Thread(target=lambda: [self.lines.put(x) for x in stream], daemon=True).start()

    def wait_for(self, text: str, timeout: float, times: int = 1) -> bool:
        """Whether ``text`` appeared in ``times`` lines within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if text in self.lines.get(timeout=0.2):
                    times -= 1
                    if times == 0:
                        return True
            except queue.Empty:
                pass
        return False


def test_kill_9_at_random_points_publishes_every_batch_exactly_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    rng = random.Random(31)
    state = str(tmp_path)
    topic = topic_name("crash")
    expected: dict[str, dict[str, Any]] = {}
    writer = None

    def write_batch() -> None:
        nonlocal writer
        rows = [{"k": f"k{rng.randrange(400):03d}", "n": rng.randrange(10**6)} for _ in range(150)]
        rows = list({r["k"]: r for r in rows}.values())
        deletes = sorted({k for k in expected if rng.random() < 0.15})
        deletes = [k for k in deletes if k not in {r["k"] for r in rows}]
        if writer is None:
            writer = write_table(state, "t", rows, key="k", partitions=4)
        else:
            writer.write(rows, deletes=deletes)
        for row in rows:
            expected[row["k"]] = row
        for key in deletes:
            expected.pop(key)

    for _ in range(3):
        write_batch()
    env = {**os.environ, PAUSE_VARIABLE: "0.4", "PYTHONPATH": str(ROOT / "src")}
    command = [
        sys.executable, "-m", "sparkiq.cli", "publish", "--state-dir", state, "--table", "t",
        "--topic", topic, "--bootstrap-servers", kafka_bootstrap,
    ]  # fmt: skip
    inside = 0
    for round_ in range(5):
        process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        lines = _Lines(process)
        try:
            write_batch()
            write_batch()
            if round_ % 2 == 0:  # inside the second batch's transaction: the first committed
                assert lines.wait_for("test pause", 120, times=2), "the publisher never paused"
                inside += 1
            else:  # anywhere: connecting, reading back, producing, committing, idle
                time.sleep(rng.uniform(0.3, 2.0))
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(30)
    assert inside >= 2
    # each publisher killed inside its second transaction committed its first: a new batch
    # each time, resuming where the topic stopped (not from the start, nor skipping one)
    assert len({r.batch for r in read_topic(kafka_bootstrap, topic)}) >= inside
    done = subprocess.run(
        [*command, "--once"], env={**env, PAUSE_VARIABLE: ""}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr

    records = read_topic(kafka_bootstrap, topic)
    changelog = Changelog(state, "t")
    committed = changelog.committed_batch_ids()
    counts: dict[int, int] = {}
    for record in records:
        counts[record.batch] = counts.get(record.batch, 0) + 1
    rows = {b: changelog.read_commit(b).rows for b in committed}  # type: ignore[union-attr]
    assert counts == rows  # every batch whole, exactly once
    for partition in {r.partition for r in records}:
        batches = [r.batch for r in records if r.partition == partition]
        assert batches == sorted(batches), partition
    assert compacted(records) == {json.dumps(k).encode(): v for k, v in expected.items()}
    # the kills inside transactions left aborted records that read_committed never showed
    assert len(read_topic(kafka_bootstrap, topic, committed=False)) > len(records)
