"""Writing topics the way the tests need them: keyed records placed by Kafka's murmur2
partitioner (the Java client's default), tombstones, and sparkiq's record format (a table's
schema in ``sparkiq-schemas`` and its headers), until the publisher writes them itself."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka.client import Delivered, _wait_for_leaders


def create_compacted(bootstrap_servers: str, topic: str, partitions: int) -> None:
    """Create ``topic`` compacted (``cleanup.policy=compact``), as a followed table's is."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    new = NewTopic(topic, num_partitions=partitions, config={"cleanup.policy": "compact"})
    futures = admin.create_topics([new])
    try:
        futures[topic].result(timeout=60)
    except Exception as exc:  # the schemas topic is shared by the tests of a worker
        if "already exists" not in str(exc).lower():
            raise
    _wait_for_leaders(admin, topic, partitions)


def send(
    bootstrap_servers: str,
    topic: str,
    records: Iterable[tuple[bytes, bytes | None]],
    *,
    headers: Sequence[tuple[str, bytes]] | None = None,
) -> list[Delivered]:
    """Produce ``(key, value)`` records (value None: a tombstone), partitioned by murmur2,
    in order, and return them as the broker acknowledged them (in send order)."""
    errors: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "error_cb": errors.append,
        }
    )
    delivered: dict[int, Delivered] = {}

    def report(index: int) -> Any:
        def done(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                errors.append(error)
                return
            delivered[index] = Delivered(
                message.topic(),
                message.partition(),
                message.offset(),
                message.key(),
                message.value(),
            )

        return done

    count = 0
    for key, value in records:
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=report(count))
        producer.poll(0)
        count += 1
    left = producer.flush(120)
    assert not left and not errors, f"{left} records not delivered; errors: {errors[-5:]}"
    return [delivered[i] for i in range(count)]


def json_bytes(doc: Any) -> bytes:
    """JSON as the record format writes it: compact, UTF-8."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def latest(delivered: Iterable[Delivered]) -> dict[bytes, bytes | None]:
    """The last value of every key among acknowledged records (None: deleted), computed
    from the broker's offsets: a key's records are in one partition, in offset order."""
    by_key: dict[bytes, tuple[int, int, bytes | None]] = {}
    for d in delivered:
        assert d.key is not None
        seen = by_key.get(d.key)
        if seen is not None:
            assert seen[0] == d.partition, "a key in two partitions: not murmur2-placed"
            if seen[1] > d.offset:
                continue
        by_key[d.key] = (d.partition, d.offset, d.value)
    return {k: v[2] for k, v in by_key.items()}


def publish_schema(
    bootstrap_servers: str,
    topic: str,
    table: str,
    key_columns: Sequence[str],
    columns: Sequence[Mapping[str, Any]],
    partitions: int,
) -> None:
    """Write ``topic``'s schema to ``sparkiq-schemas`` as a sparkiq publisher does."""
    create_compacted(bootstrap_servers, "sparkiq-schemas", 1)
    doc = {
        "format": "sparkiq-table",
        "version": 1,
        "table": table,
        "topic": topic,
        "key_columns": list(key_columns),
        "columns": [dict(c) for c in columns],
        "key_format": "json",
        "value_format": "json",
        "partitions": partitions,
    }
    send(bootstrap_servers, "sparkiq-schemas", [(topic.encode(), json_bytes(doc))])
