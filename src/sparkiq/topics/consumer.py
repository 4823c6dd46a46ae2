"""The Kafka client of a followed topic: its consumers, the topic's metadata, the schema a
sparkiq publisher wrote to ``sparkiq-schemas``, and client settings kept out of logs.

Every consumer here is confluent-kafka's (librdkafka), ``isolation.level=read_committed``,
with partitions *assigned* (no consumer group is joined, no offset is committed). Its
settings are the follower's defaults, then the caller's ``kafka_config`` (security, client
id...): a setting there wins.

Secrets
    ``kafka_config`` may hold passwords (``sasl.password``, ``ssl.key.password``...). They
    never reach a log line or an error message from here: :func:`redact` replaces the value
    of every secret setting (:func:`is_secret`) in a text before it is shown, since
    librdkafka quotes a refused value in its error.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any, Final

from sparkiq.errors import ConfigError
from sparkiq.topics.records import SCHEMAS_TOPIC

__all__ = [
    "OPEN_TIMEOUT",
    "confluent",
    "is_secret",
    "new_consumer",
    "partition_count",
    "read_client_config",
    "read_published",
    "redact",
    "schemas_end",
]

#: How long opening a follower waits for the broker's metadata and the schemas topic.
OPEN_TIMEOUT: Final = 30.0
# Words that make a client setting a secret: its value is never shown.
_SECRET_WORDS: Final = ("password", "secret", "jaas", "token", "pem", "credential")


def confluent() -> Any:
    """The ``confluent_kafka`` package, or a ConfigError saying how to install it."""
    try:
        import confluent_kafka
    except ImportError as exc:  # the optional extra
        raise ConfigError(
            f"following a Kafka topic needs the client confluent-kafka, which is not "
            f"installed ({exc}): pip install 'sparkiq[kafka]'"
        ) from None
    return confluent_kafka


def is_secret(setting: str) -> bool:
    """Whether the value of client setting ``setting`` is a secret (never logged):
    ``sasl.password``, ``ssl.key.password``, ``sasl.jaas.config``, ``ssl.key.pem``,
    ``sasl.oauthbearer.client.secret``..."""
    name = setting.lower()
    return any(word in name for word in _SECRET_WORDS)


def redact(text: str, kafka_config: Mapping[str, Any]) -> str:
    """``text`` with the value of every secret setting of ``kafka_config`` replaced by
    ``***``."""
    for setting, value in kafka_config.items():
        shown = str(value)
        if is_secret(str(setting)) and shown:
            text = text.replace(shown, "***")
    return text


def new_consumer(bootstrap_servers: str, kafka_config: Mapping[str, Any], topic: str) -> Any:
    """A read_committed consumer of ``bootstrap_servers`` with ``kafka_config`` on top of the
    follower's defaults; ConfigError (secrets redacted) when the client refuses a setting."""
    kafka = confluent()
    config = {
        "bootstrap.servers": bootstrap_servers,
        # required by the client; never used: partitions are assigned, offsets never committed
        "group.id": f"sparkiq-follow-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "allow.auto.create.topics": False,
        **{str(k): v for k, v in kafka_config.items()},
    }
    try:
        return kafka.Consumer(config)
    except kafka.KafkaException as exc:
        raise ConfigError(
            redact(f"cannot create a Kafka consumer for {topic!r}: {exc}", kafka_config)
        ) from None


def partition_count(consumer: Any, topic: str, bootstrap_servers: str) -> int:
    """How many partitions ``topic`` has; ConfigError when it does not exist."""
    kafka = confluent()
    try:
        metadata = consumer.list_topics(topic, timeout=OPEN_TIMEOUT)
    except kafka.KafkaException as exc:
        raise ConfigError(
            f"cannot read the metadata of topic {topic!r} from {bootstrap_servers!r}: {exc}"
        ) from None
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise ConfigError(
            f"topic {topic!r} does not exist on {bootstrap_servers!r}"
            + (f" ({found.error})" if found is not None and found.error else "")
            + ": check its name, or create it before following it"
        )
    return len(found.partitions)


def schemas_end(consumer: Any, timeout: float = OPEN_TIMEOUT) -> dict[int, int] | None:
    """The end offsets of ``sparkiq-schemas`` (``{partition: offset}``; None: no such
    topic). A schema written since an earlier call moves them."""
    kafka = confluent()
    metadata = consumer.list_topics(SCHEMAS_TOPIC, timeout=timeout).topics.get(SCHEMAS_TOPIC)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        return None
    return {
        p: consumer.get_watermark_offsets(kafka.TopicPartition(SCHEMAS_TOPIC, p), timeout=timeout)[
            1
        ]
        for p in metadata.partitions
    }


def read_published(consumer: Any, topic: str, bootstrap_servers: str) -> tuple[Any, dict[int, int]]:
    """The newest value ``sparkiq-schemas`` holds for ``topic`` (its JSON), read from the
    beginning up to the end offsets of now, and those end offsets; ConfigError when there is
    none. Assigns the consumer to ``sparkiq-schemas`` while it reads, then unassigns it."""
    kafka = confluent()
    hint = (
        f"topic {topic!r} has no schema in {SCHEMAS_TOPIC!r} (it was not published by "
        "sparkiq): pass columns= (a Spark DDL string) and key= (the key columns)"
    )
    ends = schemas_end(consumer)
    if ends is None:
        raise ConfigError(hint)
    consumer.assign([kafka.TopicPartition(SCHEMAS_TOPIC, p, kafka.OFFSET_BEGINNING) for p in ends])
    found: Any = None
    deadline = time.monotonic() + OPEN_TIMEOUT
    wanted = topic.encode()
    try:
        while any(
            consumer.position([kafka.TopicPartition(SCHEMAS_TOPIC, p)])[0].offset < end
            for p, end in ends.items()
            if end > 0
        ):
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"reading {SCHEMAS_TOPIC!r} from {bootstrap_servers!r} took over "
                    f"{OPEN_TIMEOUT:g} s: check the broker"
                )
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None and message.key() == wanted:
                    found = message.value()  # the newest wins; a tombstone forgets it
    finally:
        consumer.unassign()
    if found is None:
        raise ConfigError(hint)
    try:
        return json.loads(found), ends
    except ValueError:
        raise ConfigError(
            f"the schema of topic {topic!r} in {SCHEMAS_TOPIC!r} is not JSON"
        ) from None


def read_client_config(path: str | None) -> dict[str, str]:
    """The Kafka client settings in file ``path`` (None: none): ``KEY=VALUE`` lines, blank
    lines and ``#`` or ``!`` comments ignored, whitespace around keys and values stripped
    (the plain subset of a Java properties file). Setting names are librdkafka's
    (``security.protocol``, ``sasl.mechanism``, ``sasl.username``, ``sasl.password``,
    ``ssl.ca.location``...). ConfigError naming the file and line; a value is never quoted
    in it (it may be a secret)."""
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the Kafka client settings file {path!r}: {exc}") from None
    out: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith(("#", "!")):
            continue
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"{path}:{number}: expected KEY=VALUE (a Kafka client setting, e.g. "
                "security.protocol=SASL_SSL), found a line without '=' or without a key"
            )
        out[key.strip()] = value.strip()
    return out
