"""Following a Kafka topic as a table (sparkiq.follow_topic), against a real broker.

Ground truth is what the broker acknowledged: the last record of every key (by offset, in
its partition) computed here, independently of the follower. One topic with a composite
JSON key over three partitions is shared by the tests of this file."""

from __future__ import annotations

import datetime as dt
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import sparkiq
from sparkiq import KeyQuery, PositionBound, RangeQuery, StateQueryRequest
from sparkiq.errors import ConfigError
from sparkiq.testing import KafkaBroker
from sparkiq.topics.keys import KeyFormat, murmur2
from sparkiq.topics.records import table_schema
from tests.cluster.serve_processes import free_port
from tests.kafka.client import Delivered
from tests.kafka.topics import create_compacted, json_bytes, latest, publish_schema, send
from tests.server.serve_subprocess import serving

COLUMNS = "carrier STRING, flight INT, delay DOUBLE, note STRING, day DATE"
KEY = ("carrier", "flight")
PARTITIONS = 3
DEADLINE = 120.0  # a busy machine: generous, the condition ends the wait


def flight_key(carrier: str, flight: int) -> bytes:
    return json_bytes({"carrier": carrier, "flight": flight})


def flight_value(carrier: str, flight: int, round_: int) -> bytes:
    return json_bytes(
        {
            "carrier": carrier,
            "flight": flight,
            "delay": round_ * 1.5 + flight,
            "note": f"r{round_}-ü",
            "day": f"2026-11-{round_ + 1:02d}",
            "ignored": [1, 2],
        }
    )


@dataclass
class Flights:
    topic: str
    delivered: list[Delivered]


@pytest.fixture(scope="module")
def flights(kafka_cluster: KafkaBroker) -> Flights:
    """The shared topic: 60 keys inserted, 40 updated, 10 deleted (3 partitions)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = f"flights-{uuid.uuid4().hex[:8]}"
    create_compacted(bootstrap, topic, PARTITIONS)
    keys = [(c, n) for c in ("AA", "DL", "UA") for n in range(20)]
    records = [(flight_key(c, n), flight_value(c, n, 0)) for c, n in keys]
    records += [(flight_key(c, n), flight_value(c, n, 1)) for c, n in keys[::3] + keys[1::3]]
    records += [(flight_key(c, n), None) for c, n in keys[2::6]]
    return Flights(topic, send(bootstrap, topic, records))


def expected_rows(delivered: list[Delivered]) -> dict[tuple[str, int], dict[str, Any] | None]:
    out: dict[tuple[str, int], dict[str, Any] | None] = {}
    for key, value in latest(delivered).items():
        k = json.loads(key)
        doc = None if value is None else json.loads(value)
        out[(k["carrier"], k["flight"])] = (
            None
            if doc is None
            else {
                "carrier": doc["carrier"],
                "flight": doc["flight"],
                "delay": doc["delay"],
                "note": doc["note"],
                "day": dt.date.fromisoformat(doc["day"]),
            }
        )
    return out


@pytest.fixture
def followed(kafka_bootstrap: str, flights: Flights) -> Iterator[sparkiq.FollowedTopic]:
    with sparkiq.follow_topic(
        kafka_bootstrap, flights.topic, name="flights", key=KEY, columns=COLUMNS
    ) as handle:
        yield handle


def test_the_partition_of_a_key_is_the_one_kafka_chose(flights: Flights) -> None:
    schema = table_schema(COLUMNS, KEY)
    keys = KeyFormat(schema, "json")
    for d in flights.delivered:
        assert d.key is not None
        assert keys.write(keys.read(d.key)) == d.key  # the same bytes, so the same hash
        assert (murmur2(d.key) & 0x7FFFFFFF) % PARTITIONS == d.partition


def test_every_key_holds_the_last_acknowledged_record(
    followed: sparkiq.FollowedTopic, flights: Flights
) -> None:
    bound = PositionBound.after(*[(d.topic, d.partition, d.offset) for d in flights.delivered])
    # a read of every partition: each answers only once it has applied the records sent to
    # it (a key's read waits for its own partition only, and the others apply on their own)
    request = (
        StateQueryRequest.in_store("flights")
        .with_query(RangeQuery.with_no_bounds())
        .with_position_bound(bound)
    )
    answer = followed.query(request)
    assert len(answer.partition_results) == PARTITIONS
    assert all(r.is_success for r in answer.partition_results.values()), answer
    expected = expected_rows(flights.delivered)
    assert any(v is None for v in expected.values()) and len(expected) == 60
    ranged = {key: row for r in answer.partition_results.values() for key, row in r.result}
    assert ranged == {key: row for key, row in expected.items() if row is not None}
    for (carrier, flight), row in expected.items():
        assert followed.get("flights", (carrier, flight)) == row, (carrier, flight)
        partition = followed.partition_for_key("flights", (carrier, flight))
        sent = next(d for d in flights.delivered if d.key == flight_key(carrier, flight))
        assert partition == sent.partition
    assert followed.source.malformed == 0 and followed.source.misplaced == 0
    position = followed.position("flights")
    ends = position.partition_offsets(f"kafka:{flights.topic}")
    for d in flights.delivered:
        assert ends[d.partition] > d.offset


def test_sql_answers_from_the_followed_rows(
    followed: sparkiq.FollowedTopic, flights: Flights
) -> None:
    assert followed.wait_caught_up(DEADLINE)
    live = {k: v for k, v in expected_rows(flights.delivered).items() if v is not None}
    rows = followed.sql(
        "SELECT carrier, flight, delay FROM flights WHERE carrier = 'DL' AND flight = 4"
    ).rows
    assert [tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in rows] == [
        ("DL", 4, live[("DL", 4)]["delay"])  # type: ignore[index]
    ]
    totals = followed.sql(
        "SELECT carrier, count(*) AS n, sum(delay) AS total FROM flights GROUP BY carrier "
        "ORDER BY carrier"
    ).rows
    want = {}
    for (carrier, _), row in live.items():
        n, total = want.get(carrier, (0, 0.0))
        want[carrier] = (n + 1, total + row["delay"])
    got = {r["carrier"]: (r["n"], pytest.approx(r["total"])) for r in map(_as_dict, totals)}
    assert got == {c: (n, pytest.approx(t)) for c, (n, t) in want.items()}


def _as_dict(row: Any) -> dict[str, Any]:
    return row if isinstance(row, dict) else row.asDict()


def test_a_bounded_read_sees_a_record_just_produced(
    followed: sparkiq.FollowedTopic, flights: Flights, kafka_bootstrap: str
) -> None:
    (ack,) = send(kafka_bootstrap, flights.topic, [(flight_key("ZZ", 7), flight_value("ZZ", 7, 5))])
    request = (
        StateQueryRequest.in_store("flights")
        .with_query(KeyQuery.with_key(("ZZ", 7)))
        .with_position_bound(PositionBound.after((ack.topic, ack.partition, ack.offset)))
    )
    answer = followed.query(request).only_partition_result()
    assert answer.is_success, answer
    assert answer.result["note"] == "r5-ü"
    flights.delivered.append(ack)  # later tests compare with it too


def test_following_again_restores_the_same_rows(
    kafka_bootstrap: str, flights: Flights, followed: sparkiq.FollowedTopic
) -> None:
    assert followed.wait_caught_up(DEADLINE)
    first = followed.sql("SELECT * FROM flights ORDER BY carrier, flight").rows
    followed.close()
    with sparkiq.follow_topic(
        kafka_bootstrap,
        flights.topic,
        name="flights",
        key=KEY,
        columns=COLUMNS,
        batch_records=7,  # many small batches: a restore is not one batch
    ) as again:
        assert again.wait_caught_up(DEADLINE)
        assert again.batch_id > 5
        assert again.sql("SELECT * FROM flights ORDER BY carrier, flight").rows == first
    assert len(first) == sum(v is not None for v in expected_rows(flights.delivered).values())


def test_malformed_records_are_skipped_and_counted(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"totals-{uuid.uuid4().hex[:8]}"
    create_compacted(kafka_bootstrap, topic, 2)
    sent = send(
        kafka_bootstrap,
        topic,
        [
            (b'"u-1"', b'{"total": 10}'),
            (b'"u-2"', b'{"total": "many"}'),  # a string in a BIGINT column
            (b'"u-3"', b"not json"),
            (b"u-4", b'{"total": 4}'),  # a key that is not JSON
            (b'"u-5"', b'{"total": 5, "extra": true}'),
            (b'"u-1"', b'{"total": 1.5}'),  # a float in a BIGINT column: u-1 stays 10
            (b'"u-6"', b"{}"),  # missing: null
        ],
    )
    caplog.set_level(logging.WARNING, logger="sparkiq.topic")
    with sparkiq.follow_topic(
        kafka_bootstrap, topic, key="user", columns="user STRING, total BIGINT", store="memory"
    ) as totals:
        assert totals.wait_caught_up(DEADLINE)
        got = {u: totals.get(topic, u) for u in ("u-1", "u-2", "u-3", "u-4", "u-5", "u-6")}
        assert got == {
            "u-1": {"user": "u-1", "total": 10},
            "u-2": None,
            "u-3": None,
            "u-4": None,
            "u-5": {"user": "u-5", "total": 5},
            "u-6": {"user": "u-6", "total": None},
        }
        assert totals.source.malformed == 4
    bad = {(d.partition, d.offset) for d in (sent[1], sent[2], sent[3], sent[5])}
    logged = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(logged) == 4
    for partition, offset in bad:
        assert any(f"partition {partition} offset {offset}:" in m for m in logged), logged


def test_a_topic_sparkiq_published_needs_no_schema(kafka_bootstrap: str) -> None:
    topic = f"published-{uuid.uuid4().hex[:8]}"
    create_compacted(kafka_bootstrap, topic, 2)
    publish_schema(
        kafka_bootstrap,
        topic,
        "orders",
        ["order_id"],
        [
            {"name": "order_id", "type": "bigint", "nullable": True},
            {"name": "amount", "type": "decimal(10,2)", "nullable": True},
            {"name": "at", "type": "timestamp", "nullable": True},
            {"name": "tags", "type": "array<string>", "nullable": True},
        ],
        2,
    )
    headers = [("sparkiq.table", b"orders"), ("sparkiq.batch", b"0")]
    value = {"order_id": 1, "amount": "12.30", "at": "2026-11-29T00:31:05.123456Z", "tags": ["a"]}
    send(
        kafka_bootstrap,
        topic,
        [(b"1", json_bytes(value)), (b"2", json_bytes({**value, "order_id": 2})), (b"2", None)],
        headers=headers,
    )
    from decimal import Decimal

    with sparkiq.follow_topic(kafka_bootstrap, topic, name="orders", store="memory") as orders:
        assert orders.wait_caught_up(DEADLINE)
        assert orders.get("orders", 1) == {
            "order_id": 1,
            "amount": Decimal("12.30"),
            "at": dt.datetime(2026, 11, 29, 0, 31, 5, 123456, tzinfo=dt.UTC)
            .astimezone()
            .replace(tzinfo=None),
            "tags": ["a"],
        }
        assert orders.get("orders", 2) is None


def test_bad_arguments_get_clear_errors(kafka_bootstrap: str, flights: Flights) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        sparkiq.follow_topic(kafka_bootstrap, "no-such-topic-here", key="k", columns="k STRING")
    with pytest.raises(ConfigError, match="key column 'user' is not a column"):
        sparkiq.follow_topic(kafka_bootstrap, flights.topic, key="user", columns=COLUMNS)
    with pytest.raises(ConfigError, match="key_format='kafka' holds one key column"):
        sparkiq.follow_topic(
            kafka_bootstrap, flights.topic, key=KEY, columns=COLUMNS, key_format="kafka"
        )
    with pytest.raises(ConfigError, match="has no schema in 'sparkiq-schemas'"):
        sparkiq.follow_topic(kafka_bootstrap, flights.topic)
    with pytest.raises(ConfigError, match="unknown type 'strang'"):
        sparkiq.follow_topic(kafka_bootstrap, flights.topic, key="k", columns="k STRANG")


def http_json(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_sparkiq_serve_follows_a_topic_over_rest(
    kafka_bootstrap: str, flights: Flights, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = f"flights={flights.topic}?key=carrier,flight&columns={COLUMNS}"
    args = ["--follow-topic", spec, "--kafka-bootstrap", kafka_bootstrap]
    args += ["--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state")]
    with serving(args, tmp_path, lambda _: bool(http_json(f"{url}/stores")), errors=(OSError,)):
        (ack,) = send(
            kafka_bootstrap, flights.topic, [(flight_key("UA", 3), flight_value("UA", 3, 9))]
        )
        after = [{"topic": ack.topic, "partition": ack.partition, "offset": ack.offset}]
        doc = http_json(
            f"{url}/stores/flights/query",
            {"query": {"type": "key", "key": ["UA", 3]}, "after": after},
        )
        (answer,) = doc["partitions"].values()
        assert answer["result"]["note"] == "r9-ü", answer
        flights.delivered.append(ack)
        expected = expected_rows(flights.delivered)
        for carrier, flight in [("AA", 0), ("DL", 4), ("UA", 3), ("UA", 2)]:
            key = urllib.parse.quote(json.dumps([carrier, flight]))
            try:
                got = http_json(f"{url}/stores/flights/keys/{key}")
            except urllib.error.HTTPError as exc:
                assert exc.code == 404 and expected[(carrier, flight)] is None
                continue
            want = expected[(carrier, flight)]
            assert want is not None
            assert got["row"]["delay"] == want["delay"] and got["row"]["note"] == want["note"]
        rows = http_json(f"{url}/query", {"sql": "SELECT count(*) AS n FROM flights"})["rows"]
        assert rows == [{"n": sum(v is not None for v in expected.values())}]


def test_serve_refuses_a_followed_topic_without_a_broker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sparkiq.cli import main

    assert main(["serve", "--follow-topic", "t?key=k&columns=k STRING"]) == 2
    assert "needs kafka_bootstrap" in capsys.readouterr().err
    assert main(["serve", "--follow-topic", "t?keys=k", "--kafka-bootstrap", "x:1"]) == 2
    assert "'keys=k' is not an option" in capsys.readouterr().err


def test_push_and_postgres_serve_a_followed_topic(
    kafka_bootstrap: str, flights: Flights, tmp_path: Path
) -> None:
    import psycopg

    from sparkiq import Node
    from sparkiq.serving.topic import parse_topic_spec

    spec = parse_topic_spec(f"flights={flights.topic}?key=carrier,flight&columns={COLUMNS}")
    node = Node(
        str(tmp_path),
        store="memory",
        kafka_bootstrap=kafka_bootstrap,
        topics=[spec],
        pg_listen="127.0.0.1:0",
    )
    with node.start():
        assert node.wait_for("flights", 0, DEADLINE)
        host, port = node.pg_address or ("", 0)
        bound = PositionBound.after(*[(d.topic, d.partition, d.offset) for d in flights.delivered])
        caught_up = node.query(  # every acknowledged record is applied
            StateQueryRequest.in_store("flights")
            .with_query(KeyQuery.with_key(("AA", 0)))
            .with_position_bound(bound)
        )
        assert caught_up.only_partition_result().is_success, caught_up
        with psycopg.connect(f"host={host} port={port} user=u dbname=sparkiq") as pg:
            (count,) = pg.execute("SELECT count(*) FROM flights WHERE carrier = 'AA'").fetchone()
        want = expected_rows(flights.delivered)
        assert count == sum(v is not None and k[0] == "AA" for k, v in want.items())
        with node.stream("SELECT carrier, flight, note FROM flights EMIT CHANGES") as changes:
            sent = []
            for value in (flight_value("AA", 99, 4), None):  # one batch each, not folded
                sent += send(kafka_bootstrap, flights.topic, [(flight_key("AA", 99), value)])
                while True:
                    change = changes.poll(DEADLINE)
                    assert change is not None, f"no change in {DEADLINE} s"
                    if change.key == ("AA", 99):
                        break
                want = None if value is None else {"carrier": "AA", "flight": 99, "note": "r4-ü"}
                assert change.row == want
        flights.delivered.extend(sent)


def test_a_transactional_topic_serves_committed_records_only(kafka_bootstrap: str) -> None:
    from confluent_kafka import Producer

    topic = f"tx-{uuid.uuid4().hex[:8]}"
    create_compacted(kafka_bootstrap, topic, 2)
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": f"sparkiq-test-{topic}",
            "partitioner": "murmur2_random",
        }
    )
    producer.init_transactions(60)
    for records, commit in (
        ([(b'"a"', b'{"n": 1}'), (b'"b"', b'{"n": 2}')], True),
        ([(b'"a"', b'{"n": 9}'), (b'"c"', b'{"n": 9}')], False),  # aborted: never seen
        ([(b'"b"', None), (b'"d"', b'{"n": 4}')], True),
    ):
        producer.begin_transaction()
        for key, value in records:
            producer.produce(topic, key=key, value=value)
        if commit:
            producer.commit_transaction(60)
        else:
            producer.abort_transaction(60)
    with sparkiq.follow_topic(
        kafka_bootstrap, topic, name="tx", key="k", columns="k STRING, n INT", store="memory"
    ) as followed:
        # the end offsets lie past the last commit marker, which no record carries
        assert followed.wait_caught_up(DEADLINE)
        got = {k: followed.get("tx", k) for k in "abcd"}
    assert got == {"a": {"k": "a", "n": 1}, "b": None, "c": None, "d": {"k": "d", "n": 4}}
