"""Reading a published topic back, independently of sparkiq's publisher: every record a
consumer sees (``read_committed`` or not), the compacted view (last value per key), and
Kafka's default partitioner (the Java client's murmur2) written out from its definition."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes
    value: bytes | None
    headers: dict[str, bytes]

    @property
    def batch(self) -> int:
        return int(self.headers["sparkiq.batch"])


def read_topic(servers: str, topic: str, *, committed: bool = True) -> list[Record]:
    """Every record of ``topic`` from its start to its end, as a consumer with
    ``isolation.level=read_committed`` (or ``read_uncommitted``) sees them."""
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"test-read-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 20,  # it reads to the end and stops
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        partitions = sorted(metadata.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        pending, out = set(partitions), []
        deadline = time.monotonic() + 60
        while pending:
            assert time.monotonic() < deadline, f"{topic}: {sorted(pending)} never reached the end"
            for message in consumer.consume(1000, timeout=0.1):
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error.str()
                    pending.discard(message.partition())
                    continue
                out.append(
                    Record(
                        message.partition(),
                        message.offset(),
                        message.key(),
                        message.value(),
                        {k: bytes(v) for k, v in message.headers() or ()},
                    )
                )
        return out
    finally:
        consumer.close()


def compacted(records: list[Record]) -> dict[bytes, Any]:
    """The topic as a table: each key's last value (JSON-decoded), tombstones removed."""
    last: dict[bytes, bytes | None] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        last[record.key] = record.value
    return {k: json.loads(v) for k, v in last.items() if v is not None}


def murmur2(data: bytes) -> int:
    """``org.apache.kafka.common.utils.Utils.murmur2``: 32-bit MurmurHash2, seed 0x9747b28c,
    as a signed Java int."""
    mask = 0xFFFFFFFF
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(length // 4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = length % 4
    base = length & ~3
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def default_partition(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner for a non-null key: ``toPositive(murmur2(key)) % n``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def schema_record(servers: str, topic: str) -> dict[str, Any] | None:
    """The newest committed schema record of ``topic`` in ``sparkiq-schemas``."""
    found = None
    for record in read_topic(servers, "sparkiq-schemas"):
        if record.key == topic.encode():
            found = None if record.value is None else json.loads(record.value)
    return found
