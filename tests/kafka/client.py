"""The tests' Kafka client: confluent-kafka (librdkafka), the client most Python producers
run (see docs/design.md, "Kafka: a real broker and Spark's connector")."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic


@dataclass(frozen=True)
class Delivered:
    """A record the broker acknowledged: where it is and what it holds."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def create_topic(bootstrap_servers: str, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions and one replica, and wait until the
    broker's metadata shows a leader for each (the controller answers first)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions)])
    futures[topic].result(timeout=60)
    _wait_for_leaders(admin, topic, partitions)


def add_partitions(bootstrap_servers: str, topic: str, partitions: int) -> None:
    """Grow ``topic`` to ``partitions`` partitions (Kafka's CreatePartitions) and wait until
    the broker's metadata shows a leader for each."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_partitions([NewPartitions(topic, partitions)])
    futures[topic].result(timeout=60)
    _wait_for_leaders(admin, topic, partitions)


def delete_records(bootstrap_servers: str, topic: str, before: dict[int, int]) -> dict[int, int]:
    """Delete the records of each partition ``p`` of ``topic`` below offset ``before[p]``
    (Kafka's DeleteRecords: the partition's log start offset moves there, as retention moves
    it when it deletes old segments); returns the new log start offsets."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.delete_records([TopicPartition(topic, p, o) for p, o in before.items()])
    return {tp.partition: future.result(timeout=60).low_watermark for tp, future in futures.items()}


def _wait_for_leaders(admin: AdminClient, topic: str, partitions: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        found = admin.list_topics(topic, timeout=10).topics.get(topic)
        led = {p for p, m in (found.partitions if found else {}).items() if m.leader >= 0}
        if led == set(range(partitions)):
            return
        missing = sorted(set(range(partitions)) - led)
        assert time.monotonic() < deadline, f"{topic!r} partitions {missing}: no leader in 60 s"
        time.sleep(0.1)


def produce(
    bootstrap_servers: str, topic: str, records: Iterable[tuple[str, str]]
) -> list[Delivered]:
    """Send ``(key, value)`` records (UTF-8) with an idempotent producer and return them as
    the broker acknowledged them; raises AssertionError if any was not delivered."""
    errors: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "linger.ms": 5,
            "error_cb": errors.append,  # client-level errors, for the assertion's message
        }
    )
    delivered: list[Delivered] = []

    def report(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(error)
        else:
            delivered.append(
                Delivered(
                    message.topic(),
                    message.partition(),
                    message.offset(),
                    message.key(),
                    message.value(),
                )
            )

    for key, value in records:
        producer.produce(topic, key=key.encode(), value=value.encode(), on_delivery=report)
        producer.poll(0)
    left = producer.flush(120)
    if left or errors:
        topics = producer.list_topics(topic, timeout=10).topics
        raise AssertionError(
            f"{left} records not delivered in 120 s; errors: {errors[-10:]}; the broker's "
            f"metadata of {topic!r}: {topics[topic].partitions if topic in topics else None}"
        )
    return delivered


def end_offsets(bootstrap_servers: str, topic: str, partitions: int) -> dict[int, int]:
    """The broker's own end offset (high watermark) of each partition of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "sparkiq-probe"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()
