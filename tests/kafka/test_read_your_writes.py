"""Read-your-writes for producers, through a three-node cluster, against a real broker.

A Kafka pipeline (Spark's Kafka source, a per-user aggregation, ``App.materialize``) runs at
the demo's trigger (a micro-batch a second) and three nodes serve its table. Producer threads
each send a record for a user of their own and, as soon as the broker acknowledges it, read
that user back through the next of the nodes in turn, with ``PositionBound.after`` of the
acknowledgement: over the binary protocol (``Client``, its own retries off) or the REST API
(``"after"``). The read arrives before any batch has read the record, so the node must wait
for the batch; not one read may miss its own write. At the end the table equals a
computation over every record the broker acknowledged.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer

from sparkiq import App, Client, KeyQuery, Node, PositionBound, StateQueryRequest
from sparkiq.testing import table_rows
from tests.cluster.cluster_helpers import start_http_cluster
from tests.kafka.client import Delivered, create_topic
from tests.kafka.pipeline import expected_totals, parse, totals

pytestmark = pytest.mark.slow

TOPIC = "orders-ryw"
PARTITIONS = 4
THREADS = 6
RECORDS_PER_THREAD = 3
# Correctness, not speed, is asserted here: a loaded machine's micro-batches may take
# seconds, so the nodes wait far longer than bench/ryw_latency.py ever measures.
SOURCE_WAIT = 120.0


def send_one(producer: Producer, user: str, amount: int) -> Delivered:
    """Send one order and wait for the broker's acknowledgement."""
    done = threading.Event()
    outcome: list[Any] = []

    def report(error: KafkaError | None, message: Message) -> None:
        outcome.append(error if error is not None else message)
        done.set()

    value = json.dumps({"user": user, "amount": amount})
    producer.produce(TOPIC, key=user.encode(), value=value.encode(), on_delivery=report)
    while not done.is_set():
        producer.poll(0.1)
    message = outcome[0]
    assert isinstance(message, Message), f"{user}: not delivered: {message}"
    return Delivered(
        message.topic(), message.partition(), message.offset(), message.key(), message.value()
    )


def read_back_rest(url: str, user: str, ack: Delivered) -> dict[str, Any] | None:
    after = [{"topic": ack.topic, "partition": ack.partition, "offset": ack.offset}]
    body = json.dumps({"query": {"type": "key", "key": user}, "after": after}).encode()
    request = urllib.request.Request(
        f"{url}/stores/totals/query", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=SOURCE_WAIT + 60) as response:
        doc = json.loads(response.read())
    (answer,) = doc["partitions"].values()
    assert "error" not in answer, answer
    return answer.get("result")


def read_back_client(client: Client, user: str, ack: Delivered) -> dict[str, Any] | None:
    request = (
        StateQueryRequest.in_store("totals")
        .with_query(KeyQuery.with_key(user))
        .with_position_bound(PositionBound.after((ack.topic, ack.partition, ack.offset)))
    )
    answer = client.query(request).only_partition_result()
    assert answer.is_success, answer
    return answer.result


def test_every_producer_reads_its_own_write_through_another_node(
    kafka_spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    spark = kafka_spark
    create_topic(kafka_bootstrap, TOPIC, PARTITIONS)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
    )
    state = str(tmp_path / "state")
    app = App(spark, state_dir=state, name="kafka-ryw")
    app.materialize(
        "totals",
        totals(parse(reader.load())),
        key="user",
        partitions=4,
        trigger={"processingTime": "1 second"},  # the demo's
    )
    app.start()
    nodes = start_http_cluster(state, 3, store="memory")
    for node in nodes:
        node.source_wait = SOURCE_WAIT
    turn = itertools.count()  # which node answers next: never the one that answered last
    delivered: list[Delivered] = []
    misses: list[str] = []
    lock = threading.Lock()  # guards delivered, misses

    def producer_thread(index: int) -> None:
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
        clients = [Client(n.url, bound_wait=0.0, timeout=SOURCE_WAIT + 60) for n in nodes]
        try:
            read_own_writes(producer, clients, index)
        except Exception as exc:  # a thread's failure is the test's
            with lock:
                misses.append(f"thread {index}: {exc!r}")
        finally:
            for client in clients:
                client.close()
            producer.flush(30)

    def read_own_writes(producer: Producer, clients: list[Client], index: int) -> None:
        for i in range(RECORDS_PER_THREAD):
            user, amount = f"w{index}-{i}", 100 * index + i + 1
            ack = send_one(producer, user, amount)
            where = next(turn) % len(nodes)
            if i % 2:
                row = read_back_rest(nodes[where].url, user, ack)
            else:
                row = read_back_client(clients[where], user, ack)
            with lock:
                delivered.append(ack)
                if row != {"user": user, "orders": 1, "amount": amount}:
                    misses.append(f"{user} via {nodes[where].node_id}: {row}")

    try:
        threads = [threading.Thread(target=producer_thread, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert misses == []
        assert len(delivered) == THREADS * RECORDS_PER_THREAD
        app.process_all_available(timeout=180)
        assert table_rows(app, "totals") == expected_totals(delivered)
        beyond_the_topic_end_and_another_topic(nodes[1], delivered)
    finally:
        for node in nodes:
            node.stop()
        app.stop()


def beyond_the_topic_end_and_another_topic(node: Node, delivered: list[Delivered]) -> None:
    """A bound past the topic's end is waited for, then answered ``NOT_UP_TO_BOUND`` naming
    how far behind the table is; one naming a topic the table does not read is a 400."""
    end = max(d.offset for d in delivered if d.partition == 0) + 1
    node.source_wait = 1.0
    started = time.monotonic()
    status, doc = post_json(
        node.url,
        "/stores/totals/query",
        {
            "query": {"type": "range"},
            "after": [{"topic": TOPIC, "partition": 0, "offset": end + 99}],
        },
    )
    waited = time.monotonic() - started
    assert status == 200 and 1.0 <= waited < 60, (status, waited)
    for answer in doc["partitions"].values():
        assert answer["failure"]["reason"] == "NOT_UP_TO_BOUND", answer
        message = answer["failure"]["message"]
        assert f"partition 0 of topic {TOPIC!r} is read up to offset {end}" in message
        assert "(100 records behind)" in message
    status, doc = post_json(
        node.url,
        "/query",
        {
            "sql": "SELECT * FROM totals",
            "after": [{"topic": "payments", "partition": 0, "offset": 1}],
        },
    )
    assert status == 400, doc
    assert "'payments'" in doc["error"]["message"] and repr(TOPIC) in doc["error"]["message"]


def post_json(url: str, path: str, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(doc).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
