"""Operating a followed topic, against a real broker: its lag and bad records where users
look (``GET /stats``, ``/metrics``, ``sparkiq status``), a schema a publisher changes
later, client settings from the command line, and a node stopped and started again.

Ground truth is what the broker acknowledged: the end offsets its acknowledgements imply
(the last offset + 1 per partition) and the last record of every key."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

import sparkiq
from sparkiq import Node
from sparkiq.serving.topic import topic_spec
from sparkiq.testing import KafkaBroker, wait_until
from sparkiq.topics.consumer import redact
from sparkiq.topics.keys import murmur2
from sparkiq.topics.lag import topic_lag
from tests import http_calls
from tests.browser import chromium, needs_chromium, open_first_table
from tests.browser import wait_until as page_wait_until
from tests.cluster.serve_processes import free_port
from tests.kafka.client import Delivered
from tests.kafka.topics import create_compacted, json_bytes, publish_schema, send
from tests.server.serve_subprocess import serving

PARTITIONS = 2
COLUMNS = "user STRING, total BIGINT"
DEADLINE = 120.0  # a busy machine: generous, the condition ends the wait


def ends_of(delivered: list[Delivered]) -> dict[int, int]:
    """Per partition, the end offset the acknowledged records imply."""
    ends = dict.fromkeys(range(PARTITIONS), 0)
    for d in delivered:
        ends[d.partition] = max(ends[d.partition], d.offset + 1)
    return ends


def totals(start: int, count: int) -> list[tuple[bytes, bytes | None]]:
    return [(json_bytes(f"u-{i % 5}"), json_bytes({"total": i})) for i in range(start, count)]


def send_to(bootstrap: str, topic: str, partition: int, key: bytes, value: bytes) -> Delivered:
    """One record into ``partition``, whatever its key (a producer that does not place keys
    by murmur2)."""
    out: list[Delivered] = []
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(
        topic,
        key=key,
        value=value,
        partition=partition,
        on_delivery=lambda e, m: out.append(
            Delivered(m.topic(), m.partition(), m.offset(), m.key(), m.value())
        ),
    )
    assert producer.flush(60) == 0 and len(out) == 1
    return out[0]


def metric_samples(url: str) -> dict[str, dict[tuple[str, ...], float]]:
    """``{sample name: {label values (sorted by label name): value}}`` of ``/metrics``,
    read with Prometheus' own parser."""
    out: dict[str, dict[tuple[str, ...], float]] = {}
    text = http_calls.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(s.labels[k] for k in sorted(s.labels))
            out.setdefault(s.name, {})[labels] = s.value
    return out


# -- lag and bad records -------------------------------------------------------------------


@dataclass
class Served:
    """A node following ``topic`` as table ``totals``, and what was acknowledged."""

    topic: str
    node: Node
    state_dir: Path
    delivered: list[Delivered]
    malformed: list[Delivered]
    misplaced: Delivered

    @property
    def url(self) -> str:
        assert self.node.url is not None
        return self.node.url


@pytest.fixture(scope="module")
def served(
    kafka_cluster: KafkaBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    bootstrap = kafka_cluster.bootstrap_servers
    topic = f"lagged-{uuid.uuid4().hex[:8]}"
    create_compacted(bootstrap, topic, PARTITIONS)
    delivered = send(bootstrap, topic, totals(0, 20))
    malformed = send(bootstrap, topic, [(json_bytes("u-bad"), b"not json"), (b"u-", b"{}")])
    key = json_bytes("u-9")  # a record in the partition murmur2 does not give its key
    elsewhere = 1 - (murmur2(key) & 0x7FFFFFFF) % PARTITIONS
    misplaced = send_to(bootstrap, topic, elsewhere, key, b'{"total": 9}')
    state_dir = tmp_path_factory.mktemp("followed-ops")
    spec = topic_spec(topic, name="totals", key="user", columns=COLUMNS)
    with Node(
        str(state_dir),
        node_id="follower",
        listen="127.0.0.1:0",
        standbys=0,
        topics=[spec],
        kafka_bootstrap=bootstrap,
        kafka_interval=0.5,
    ) as node:  # RocksDB stores: a node with memory stores writes no status.json
        yield Served(topic, node, state_dir, delivered, malformed, misplaced)


def followed_of(url: str) -> dict[str, Any]:
    (doc,) = http_calls.get(f"{url}/stats", timeout=30).json()["topics"]
    return doc  # type: ignore[no-any-return]


def wait_applied(served: Served, ends: dict[int, int]) -> dict[str, Any]:
    """The table's ``/stats`` entry once it applied ``ends`` and the follower saw them."""
    seen: list[dict[str, Any]] = []

    def applied() -> bool:
        seen.append(followed_of(served.url))
        parts = seen[-1]["partitions"]
        return [(p["applied"], p["end"]) for p in parts] == [(ends[p], ends[p]) for p in ends]

    wait_until(applied, DEADLINE, f"never applied {ends}: {seen[-1:]}")
    return seen[-1]


def test_stats_and_metrics_show_the_lag_going_to_zero_and_the_bad_records(
    served: Served, kafka_bootstrap: str
) -> None:
    acknowledged = [*served.delivered, *served.malformed, served.misplaced]
    doc = wait_applied(served, ends_of(acknowledged))
    assert doc["table"] == "totals" and doc["topic"] == served.topic
    assert (doc["records"], doc["malformed"], doc["misplaced"]) == (23, 2, 1)
    assert doc["lag"] == 0 and doc["seconds_behind"] == 0.0
    assert served.node.get("totals", "u-9") == {"user": "u-9", "total": 9}
    assert served.node.get("totals", "u-bad") is None

    # more records: the lag follows the new end offsets back to 0
    more = send(kafka_bootstrap, served.topic, totals(20, 31))
    served.delivered.extend(more)
    ends = ends_of([*served.delivered, *served.malformed, served.misplaced])
    doc = wait_applied(served, ends)
    assert doc["lag"] == 0 and doc["records"] == 34
    assert served.node.get("totals", "u-0") == {"user": "u-0", "total": 30}

    samples = metric_samples(served.url)
    labels = [("0", "totals", served.topic), ("1", "totals", served.topic)]
    assert samples["sparkiq_topic_lag_records"] == dict.fromkeys(labels, 0.0)
    assert samples["sparkiq_topic_lag_seconds"] == dict.fromkeys(labels, 0.0)
    assert samples["sparkiq_topic_read_records_total"] == {("totals", served.topic): 34.0}
    assert samples["sparkiq_topic_malformed_records_total"] == {("totals", served.topic): 2.0}
    assert samples["sparkiq_topic_misplaced_records_total"] == {("totals", served.topic): 1.0}


def test_sparkiq_status_shows_the_lag_and_the_bad_records(served: Served) -> None:
    wait_applied(served, ends_of([*served.delivered, *served.malformed, served.misplaced]))
    outputs: list[str] = []

    def shown() -> bool:  # status.json is rewritten about once a second
        result = subprocess.run(
            [sys.executable, "-m", "sparkiq.cli", "status", "--state-dir", str(served.state_dir)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
        return "lag 0 records" in result.stdout and f"{len(served.delivered) + 3} records read" in (
            result.stdout
        )

    wait_until(shown, DEADLINE, f"no followed topic in sparkiq status: {outputs[-1:]}")
    text = outputs[-1]
    assert f"totals <- topic {served.topic!r}: lag 0 records, 0.0 s behind;" in text
    assert "2 malformed, 1 misplaced" in text
    ends = ends_of([*served.delivered, *served.malformed, served.misplaced])
    for p, end in ends.items():
        assert f"{p:>9} {end:>12} {end:>12} {0:>10} {'0.0 s':>9}" in text, text


@needs_chromium
def test_the_console_table_view_shows_the_followed_topic(served: Served) -> None:
    ends = ends_of([*served.delivered, *served.malformed, served.misplaced])
    wait_applied(served, ends)
    with chromium() as browser:
        page = browser.new_page()
        open_first_table(page, served.url)
        rows = f'#table-kafka table[data-followed="{served.topic}"] tbody tr'
        page_wait_until(page, f"document.querySelectorAll('{rows}').length === {PARTITIONS}")
        cells = page.eval_on_selector_all(
            rows, "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
        )
        assert cells == [[str(p), str(e), str(e), "0", "0.0 s"] for p, e in ends.items()]
        summary = page.inner_text("#table-kafka")
        assert "Followed topic" in summary and "lag 0 records" in summary
        assert "2 malformed" in summary and "1 misplaced" in summary


def test_a_follower_behind_the_topic_counts_the_records_and_seconds(
    kafka_bootstrap: str,
) -> None:
    topic = f"behind-{uuid.uuid4().hex[:8]}"
    create_compacted(kafka_bootstrap, topic, PARTITIONS)
    delivered = send(kafka_bootstrap, topic, totals(0, 100))
    ends = ends_of(delivered)
    opened = time.time()
    with sparkiq.follow_topic(
        kafka_bootstrap,
        topic,
        key="user",
        columns=COLUMNS,
        store="memory",
        batch_records=2,
        start=False,
    ) as followed:

        def applied() -> dict[int, int]:
            return followed.position().partition_offsets(f"kafka:{topic}")

        # the consumer fetches once assigned; a poll reads a few batches of 2 records, not
        # the topic's 100 (the first ones may find nothing fetched yet)
        fetched = followed.source.high_watermarks
        wait_until(lambda: fetched() == ends, DEADLINE, f"never fetched {ends}: {fetched()}")
        wait_until(lambda: followed.poll_once() > 0, DEADLINE, "the follower read nothing")
        done = applied()
        assert 0 < sum(done.values()) < 100
        now = time.time() + 5
        behind = topic_lag(followed.source, done, now)
        assert [(p.applied, p.end) for p in behind.partitions] == [
            (done.get(p), ends[p]) for p in range(PARTITIONS)
        ]
        assert behind.lag == 100 - sum(done.values())
        for p in behind.partitions:  # never current since it opened: behind since then
            assert p.seconds_behind is not None
            if p.lag:
                assert 5 <= p.seconds_behind <= now - opened
            else:
                assert p.seconds_behind == 0.0
        while followed.poll_once():
            pass
        current = followed.lag()
        assert [(p.applied, p.end, p.lag) for p in current.partitions] == [
            (ends[p], ends[p], 0) for p in range(PARTITIONS)
        ]
        assert current.seconds_behind == 0.0 and current.records == 100


def test_the_status_document_names_no_secret(served: Served) -> None:
    doc = json.dumps(http_calls.get(f"{served.url}/stats", timeout=30).json())
    assert "kafka_config" not in doc


# -- a schema published later ---------------------------------------------------------------


def column(name: str, type_: str) -> dict[str, Any]:
    return {"name": name, "type": type_, "nullable": True}


def answers_until(
    handle: sparkiq.FollowedTopic, key: str, written: list[Delivered], last: Any, kind: type
) -> None:
    """Read ``key`` until it is ``last`` with a ``total`` of type ``kind``. Every answer on
    the way must be the row the acknowledged records ``written`` (of ``key``) give at the
    answer's position: none before the first, then each record's row (the same values; a
    read racing the table's reopening may fail, or answer from the restore's position,
    never by the old columns)."""
    seen: list[Any] = []
    partition = written[0].partition

    def done() -> bool:
        try:
            row, position = handle.get_with_position(handle.name, key)
        except sparkiq.SparkiqError as exc:  # the table being hosted again: no answer
            seen.append(type(exc).__name__)
            return False
        read = position.partition_offsets(f"kafka:{handle.topic}").get(partition, 0)
        before = [d for d in written if d.offset < read]
        expected = json.loads(before[-1].value or b"null") if before else None
        if row is not None and expected is not None:
            expected = {**dict.fromkeys(row), **expected}  # a column it has no member for
        assert row == expected, (row, expected, read, written)
        seen.append(row)
        return bool(row == last and isinstance(row["total"], kind))

    wait_until(done, DEADLINE, f"{key} never became {last}: {seen[-3:]}")


def test_a_column_published_later_is_picked_up_and_no_row_is_read_by_old_columns(
    kafka_bootstrap: str,
) -> None:
    topic = f"evolving-{uuid.uuid4().hex[:8]}"
    create_compacted(kafka_bootstrap, topic, PARTITIONS)
    v1 = [column("user", "string"), column("total", "bigint")]
    publish_schema(kafka_bootstrap, topic, "spend", ["user"], v1, PARTITIONS)

    def row(user: str, total: int, **more: Any) -> tuple[bytes, bytes]:
        return json_bytes(user), json_bytes({"user": user, "total": total, **more})

    u1 = send(kafka_bootstrap, topic, [row("u-1", 1), row("u-2", 2)])[:1]
    with (
        # checks sparkiq-schemas only when a record does not fit
        sparkiq.follow_topic(kafka_bootstrap, topic, name="spend", schema_interval=3600) as spend,
        # and one that also checks every half second
        sparkiq.follow_topic(kafka_bootstrap, topic, name="spend", schema_interval=0.5) as timed,
    ):
        assert spend.wait_caught_up(DEADLINE) and timed.wait_caught_up(DEADLINE)
        assert spend.get("spend", "u-1") == {"user": "u-1", "total": 1}
        first = spend.source

        # the publisher writes the new schema, then records with the new column
        v2 = [*v1, column("city", "string")]
        publish_schema(kafka_bootstrap, topic, "spend", ["user"], v2, PARTITIONS)
        sent = send(
            kafka_bootstrap, topic, [row("u-1", 10, city="Oslo"), row("u-3", 3, city="Rome")]
        )
        u1.append(sent[0])
        new = {"user": "u-1", "total": 10, "city": "Oslo"}
        for handle in (spend, timed):
            answers_until(handle, "u-1", u1, new, int)
            assert handle.wait_caught_up(DEADLINE)
            assert handle.get("spend", "u-2") == {"user": "u-2", "total": 2, "city": None}
            assert handle.get("spend", "u-3") == {"user": "u-3", "total": 3, "city": "Rome"}
            assert handle.source.malformed == 0 and handle.source.stale is None
        assert first.stale is not None and "city string" in first.stale and first.closed

        # a type changed, no record since: only the timed follower sees it
        v3 = [column("user", "string"), column("total", "decimal(10,2)"), column("city", "string")]
        publish_schema(kafka_bootstrap, topic, "spend", ["user"], v3, PARTITIONS)
        answers_until(timed, "u-1", u1, new, Decimal)
        # the new incarnation restores partition by partition: u-3's may come after u-1's
        assert timed.wait_caught_up(DEADLINE)
        rome = timed.get("spend", "u-3")
        assert rome == {"user": "u-3", "total": Decimal("3.00"), "city": "Rome"}
        assert type(spend.get("spend", "u-1")["total"]) is int  # type: ignore[index]


def test_a_schema_this_sparkiq_cannot_read_stops_the_table_where_it_is(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"unreadable-{uuid.uuid4().hex[:8]}"
    create_compacted(kafka_bootstrap, topic, PARTITIONS)
    v1 = [column("user", "string"), column("total", "bigint")]
    publish_schema(kafka_bootstrap, topic, "spend", ["user"], v1, PARTITIONS)
    send(kafka_bootstrap, topic, [(json_bytes("u-1"), json_bytes({"user": "u-1", "total": 1}))])
    caplog.set_level(logging.INFO, logger="sparkiq.topic")
    with sparkiq.follow_topic(kafka_bootstrap, topic, name="spend", schema_interval=3600) as spend:
        assert spend.wait_caught_up(DEADLINE)
        before = spend.position()
        # a publisher of a newer format: its schema and a record with a column more
        doc = {"format": "sparkiq-table", "version": 2, "table": "spend", "topic": topic}
        send(kafka_bootstrap, "sparkiq-schemas", [(topic.encode(), json_bytes(doc))])
        later = {"user": "u-1", "total": 2, "city": "Oslo"}
        send(kafka_bootstrap, topic, [(json_bytes("u-1"), json_bytes(later))])
        refused = "cannot follow it again"
        wait_until(lambda: refused in caplog.text, DEADLINE, "never tried to follow again")
        assert "has version 2; this sparkiq reads version 1" in caplog.text
        assert spend.get("spend", "u-1") == {"user": "u-1", "total": 1}  # not read by old columns
        assert spend.position() == before and spend.source.stale is not None


# -- client settings from the command line, and a node started again ----------------------

SECRET = "TOPSECRET-do-not-log-7f3a"


def test_serve_reads_client_settings_from_a_file_and_never_shows_the_secrets(
    kafka_bootstrap: str, served: Served, tmp_path: Path
) -> None:
    settings = tmp_path / "client.properties"
    # a property librdkafka does not know: the node does not start, and says which
    settings.write_text(f"# SASL\nsasl.password = {SECRET}\nno.such.property=1\n")
    spec = f"totals={served.topic}?key=user&columns={COLUMNS}"
    args = ["--follow-topic", spec, "--kafka-bootstrap", kafka_bootstrap]
    args += ["--kafka-config", str(settings), "--state-dir", str(tmp_path / "state")]
    refused = subprocess.run(
        [sys.executable, "-m", "sparkiq.cli", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr
    assert 'No such configuration property: "no.such.property"' in refused.stderr
    assert SECRET not in refused.stderr + refused.stdout

    # the file's settings win over the command line's: its bootstrap.servers is the broker
    # (--kafka-bootstrap names a port nobody listens on), for the followed topic's consumer
    # and for the end offsets alike
    settings.write_text(
        f"bootstrap.servers={kafka_bootstrap}\nclient.id=sparkiq-ops-test\n"
        f"sasl.username=ops\nsasl.password={SECRET}\n"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--follow-topic", spec, "--kafka-bootstrap", "127.0.0.1:1"]
    args += ["--kafka-config", str(settings), "--kafka-interval", "0.5"]
    args += ["--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state")]
    acknowledged = [*served.delivered, *served.malformed, served.misplaced]
    ends = ends_of(acknowledged)

    def applied(_: Any) -> bool:
        doc = http_calls.get(f"{url}/stats", timeout=30).json()
        (kafka,) = doc["kafka"]
        followed = [(p["applied"], p["end"]) for p in doc["topics"][0]["partitions"]]
        return kafka["broker"] == "ok" and followed == [(ends[p], ends[p]) for p in ends]

    with serving(args, tmp_path, applied, errors=(httpx.HTTPError, KeyError, ValueError)):
        got = http_calls.get(f"{url}/stores/totals/keys/u-9", timeout=30).json()
        assert got["row"] == {"user": "u-9", "total": 9}
        shown = http_calls.get(f"{url}/stats", timeout=30).text
        shown += http_calls.get(f"{url}/metrics", timeout=30).text
        assert SECRET not in shown
    log = (tmp_path / "node.log").read_text()
    assert SECRET not in log and "sasl.password" not in log


def test_a_spec_never_shows_its_client_settings() -> None:
    spec = topic_spec("t", key="k", columns="k STRING", kafka_config={"sasl.password": SECRET})
    assert SECRET not in repr(spec) and SECRET not in str(spec)
    message = f'Invalid value "{SECRET}" for configuration property "sasl.password"'
    assert redact(message, spec.kafka_config) == (
        'Invalid value "***" for configuration property "sasl.password"'
    )
    assert redact(message, {"client.id": SECRET}) == message  # not a secret setting


def test_a_node_stopped_and_started_again_reads_its_topics_again(
    kafka_bootstrap: str, served: Served, tmp_path: Path
) -> None:
    spec = topic_spec(served.topic, name="totals", key="user", columns=COLUMNS)
    audit = tmp_path / "audit.log"  # a stopped node closes it; started again, it writes on
    node = Node(
        str(tmp_path / "state"),
        node_id="again",
        listen="127.0.0.1:0",
        standbys=0,
        audit_log=str(audit),
        topics=[spec],
        kafka_bootstrap=kafka_bootstrap,
    )
    # u-0: a key only ever in its murmur2 partition (u-9 is in two: no order between them)
    (last,) = [d for d in served.delivered if d.key == json_bytes("u-0")][-1:]
    expected = {"user": "u-0", "total": json.loads(last.value or b"null")["total"]}
    with node:
        wait_until(lambda: node.get("totals", "u-0") == expected, DEADLINE, "never restored")
        first = node.followed_topics()[0].records
    assert node.tables == []  # stopped: nothing hosted, the consumer closed
    sent = send(kafka_bootstrap, served.topic, [(json_bytes("u-0"), json_bytes({"total": 999}))])
    served.delivered.extend(sent)
    with node:  # read again from the topic's beginning, and what was produced meanwhile
        again = {"user": "u-0", "total": 999}
        wait_until(lambda: node.get("totals", "u-0") == again, DEADLINE, "never read again")
        assert node.tables == ["totals"]
        (followed,) = node.followed_topics()
        assert followed.records == first + 1 and followed.malformed == 2
        assert (
            http_calls.get(f"{node.url}/stores/totals/keys/u-0", timeout=30).json()["row"] == again
        )
    (logged,) = [json.loads(line) for line in audit.read_text().splitlines()]
    assert logged["node"] == "again" and logged["status"] == 200
