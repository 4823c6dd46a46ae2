"""The tests' Kafka client: confluent-kafka (librdkafka), the client most Python producers
run (see docs/design.md, "Kafka: a real broker and Spark's connector")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


@dataclass(frozen=True)
class Delivered:
    """A record the broker acknowledged: where it is and what it holds."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def create_topic(bootstrap_servers: str, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions and one replica, and wait for it."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions)])
    futures[topic].result(timeout=60)


def produce(
    bootstrap_servers: str, topic: str, records: Iterable[tuple[str, str]]
) -> list[Delivered]:
    """Send ``(key, value)`` records (UTF-8) with an idempotent producer and return them as
    the broker acknowledged them; raises AssertionError if any was not delivered."""
    producer = Producer(
        {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "linger.ms": 5}
    )
    delivered: list[Delivered] = []
    errors: list[KafkaError] = []

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
    left = producer.flush(60)
    assert left == 0 and not errors, f"{left} records not delivered; errors: {errors}"
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
