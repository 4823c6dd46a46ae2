"""The topics a publisher writes: creating and checking them, and reading back what they hold.

A published topic must be compacted (``cleanup.policy=compact``, nothing else): it is the
table, every key's last record. :func:`ensure_topic` creates it when absent (with the
table's partition count and the broker's default replication) and refuses an existing one
that is not compacted; any partition count is accepted (records are placed by the key's
murmur2, whatever the count).

Where a topic stopped is read from the topic itself (:func:`last_published_batch`), with a
``read_committed`` consumer: the last committed record of each partition carries the batch it
belongs to (header ``sparkiq.batch``), batches are produced in increasing order, each in one
transaction, so the highest of those is the last batch the topic holds whole. Nothing is
read from a local file that could disagree with the topic.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from sparkiq.publish.errors import PublishError

__all__ = [
    "BATCH_HEADER",
    "POSITION_HEADER",
    "TABLE_HEADER",
    "consumer_config",
    "ensure_topic",
    "last_published_batch",
    "read_schema_record",
]

TABLE_HEADER = "sparkiq.table"
BATCH_HEADER = "sparkiq.batch"
POSITION_HEADER = "sparkiq.position"

# Configuration a publisher sets on its own clients; given in the user's config they would
# change what the topic holds or how it is read back.
_CONSUMER_OWN = {
    "fetch.wait.max.ms",
    "group.id",
    "enable.auto.commit",
    "isolation.level",
    "enable.partition.eof",
    "auto.offset.reset",
}


def consumer_config(base: Mapping[str, Any]) -> dict[str, Any]:
    """A ``read_committed`` consumer's config from the user's client config (connection and
    security settings); it joins no group and commits nothing."""
    config = {k: v for k, v in base.items() if k not in _CONSUMER_OWN}
    config.update(
        {
            "group.id": f"sparkiq-publish-probe-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # it reads to the end and stops: no waiting for records that are not coming
            "fetch.wait.max.ms": 20,
        }
    )
    return config


def ensure_topic(
    kafka: Any, admin: Any, topic: str, partitions: int, *, timeout: float, store: str
) -> int:
    """Create ``topic`` compacted with ``partitions`` partitions when absent, or check the
    existing one is compacted; return its partition count. ``kafka`` is the confluent_kafka
    module. Raises :class:`PublishError` for a topic that is not compacted, naming its
    policy and what to do."""
    admin_module = kafka.admin
    found = _topic_partitions(admin, topic, timeout)
    if found is None:
        futures = admin.create_topics(
            [
                admin_module.NewTopic(
                    topic, num_partitions=partitions, config={"cleanup.policy": "compact"}
                )
            ],
            request_timeout=timeout,
        )
        try:
            futures[topic].result(timeout=timeout)
        except kafka.KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if getattr(error, "code", lambda: None)() != kafka.KafkaError.TOPIC_ALREADY_EXISTS:
                raise PublishError(
                    f"cannot create topic {topic!r} ({partitions} partitions, compacted): "
                    f"{_text(exc)}",
                    store=store,
                ) from exc
        return _wait_for_leaders(admin, topic, timeout, store)
    resource = admin_module.ConfigResource(admin_module.ResourceType.TOPIC, topic)
    described = admin.describe_configs([resource], request_timeout=timeout)
    configs = described[resource].result(timeout=timeout)
    entry = configs.get("cleanup.policy")
    policy = "delete" if entry is None or entry.value is None else str(entry.value)
    if {p.strip() for p in policy.split(",")} != {"compact"}:
        raise PublishError(
            f"topic {topic!r} exists with cleanup.policy={policy}; a published table needs a "
            f"compacted topic (cleanup.policy=compact): with deletion, keys that did not "
            f"change for a while would disappear from it. Publish to a new topic name (it is "
            f"created compacted), or alter this one: kafka-configs --alter --entity-type "
            f"topics --entity-name {topic} --add-config cleanup.policy=compact",
            store=store,
        )
    return found


def _topic_partitions(admin: Any, topic: str, timeout: float) -> int | None:
    # metadata of every topic: asking for one by name may make a broker create it
    metadata = admin.list_topics(timeout=timeout)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        return None
    return len(found.partitions)


def _wait_for_leaders(admin: Any, topic: str, timeout: float, store: str) -> int:
    """The partition count of a topic just created, once every partition has a leader."""
    deadline = time.monotonic() + timeout
    while True:
        found = admin.list_topics(topic, timeout=timeout).topics.get(topic)
        partitions = found.partitions if found is not None and found.error is None else {}
        if partitions and all(m.leader >= 0 for m in partitions.values()):
            return len(partitions)
        if time.monotonic() > deadline:
            raise PublishError(
                f"topic {topic!r} was created but its partitions have no leader after "
                f"{timeout:g} s: is the broker healthy?",
                store=store,
            )
        time.sleep(0.1)


def _text(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else exc
    text = getattr(error, "str", None)
    return text() if callable(text) else str(error)


def _header(message: Any, name: str) -> bytes | None:
    for key, value in message.headers() or ():
        if key == name:
            return bytes(value) if value is not None else None
    return None


def _read_to_end(
    kafka: Any, consumer: Any, topic: str, starts: Mapping[int, int], timeout: float
) -> dict[int, list[Any]]:
    """Every committed record of ``topic`` from ``starts[p]`` to the partition's end (its last
    stable offset, read_committed), by partition."""
    if not starts:
        return {}
    consumer.assign([kafka.TopicPartition(topic, p, o) for p, o in starts.items()])
    pending = set(starts)
    out: dict[int, list[Any]] = {p: [] for p in starts}
    deadline = time.monotonic() + timeout
    try:
        while pending:
            if time.monotonic() > deadline:
                raise PublishError(
                    f"reading back topic {topic!r}: partitions {sorted(pending)} did not reach "
                    f"their end within {timeout:g} s (an open transaction of another producer "
                    "holds it? it ends when that producer commits or its transaction times out)"
                )
            for message in consumer.consume(1000, timeout=0.1):
                error = message.error()
                if error is not None:
                    if error.code() == kafka.KafkaError._PARTITION_EOF:
                        pending.discard(message.partition())
                        continue
                    raise PublishError(f"reading back topic {topic!r}: {error.str()}")
                out[message.partition()].append(message)
    finally:
        consumer.unassign()
    return out


def watermarks(kafka: Any, consumer: Any, tp: Any, timeout: float) -> tuple[int, int]:
    """A partition's low and high watermarks; retried while the broker says it is not ready
    (a topic just created: its leader may not know yet that it leads)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
            return int(low), int(high)
        except kafka.KafkaException as exc:
            error = exc.args[0] if exc.args else None
            codes = {
                kafka.KafkaError.NOT_LEADER_FOR_PARTITION,
                kafka.KafkaError.LEADER_NOT_AVAILABLE,
                kafka.KafkaError.UNKNOWN_TOPIC_OR_PART,
            }
            ready = error is not None and (error.retriable() or error.code() in codes)
            if not ready or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def last_published_batch(
    kafka: Any, consumer: Any, topic: str, partitions: int, table: str, *, timeout: float
) -> int:
    """The highest batch id ``topic`` holds committed records of (-1: none).

    Reads back from each partition's end, a window that grows until it finds a record of
    sparkiq's (transaction markers and aborted records take offsets but are no records).
    Raises :class:`PublishError` when the topic holds records of another table or records
    sparkiq did not publish."""
    bounds = {}
    for p in range(partitions):
        low, high = watermarks(kafka, consumer, kafka.TopicPartition(topic, p), timeout)
        if high > low:
            bounds[p] = (low, high)
    newest = -1
    window = 64
    while bounds:
        starts = {p: max(low, high - window) for p, (low, high) in bounds.items()}
        read = _read_to_end(kafka, consumer, topic, starts, timeout)
        for p, messages in read.items():
            if messages:
                newest = max(newest, _batch_of(messages[-1], topic, table))
            if messages or starts[p] == bounds[p][0]:
                del bounds[p]
        window *= 8
    return newest


def _batch_of(message: Any, topic: str, table: str) -> int:
    found = _header(message, TABLE_HEADER)
    batch = _header(message, BATCH_HEADER)
    where = f"topic {topic!r} partition {message.partition()} offset {message.offset()}"
    if found is None or batch is None or not batch.isdigit():
        raise PublishError(
            f"{where} holds a record sparkiq did not publish (no {TABLE_HEADER}/"
            f"{BATCH_HEADER} headers): publish table {table!r} to a topic of its own",
            store=table,
        )
    if found.decode("utf-8", "replace") != table:
        raise PublishError(
            f"{where} holds records of table {found.decode('utf-8', 'replace')!r}, not of "
            f"{table!r}: publish each table to a topic of its own",
            store=table,
        )
    return int(batch)


def read_schema_record(
    kafka: Any, consumer: Any, schema_topic: str, topic: str, *, timeout: float
) -> dict[str, Any] | None:
    """The newest committed schema record of ``topic`` in ``schema_topic`` (None: none)."""
    low, high = watermarks(kafka, consumer, kafka.TopicPartition(schema_topic, 0), timeout)
    if high <= low:
        return None
    found: dict[str, Any] | None = None
    wanted = topic.encode()
    for message in _read_to_end(kafka, consumer, schema_topic, {0: low}, timeout)[0]:
        if message.key() == wanted:
            value = message.value()
            found = None
            if value is not None:
                with contextlib.suppress(ValueError):
                    found = json.loads(value)
    return found
